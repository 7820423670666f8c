"""Every exception of the package, each a subclass of :class:`HybridRolloutError` (and of the builtin it refines).

Pure Python, importable from any layer (``schedule/`` included). Catch :class:`HybridRolloutError` for "anything
this package raised on purpose"; a dead replica is a type (:class:`ReplicaDeadError`), never a string to match.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class HybridRolloutError(Exception):
    """Base class of every error this package raises on purpose."""


def _problems_message(problems: list[str], what: str) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} invalid {what} values:\n" + "\n".join(f"  - {p}" for p in problems)


class ConfigError(HybridRolloutError, ValueError):
    """A configuration value is invalid. ``problems`` holds one message per bad value (key, value seen, fix)."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(_problems_message(self.problems, "config"))


class ScenarioError(HybridRolloutError, ValueError):
    """A scenario value is invalid; ``problems`` holds one line per bad value (field, value seen, what to do)."""

    def __init__(self, problems: str | Iterable[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(_problems_message(self.problems, "scenario"))


class CalibrationError(HybridRolloutError, ValueError):
    """A run directory or trace a simulator fit cannot use (``lhr simulate --from-run``): one line, what is missing
    and where."""


class PlanError(HybridRolloutError, ValueError):
    """A plan request (``lhr plan``) that no candidate run can answer: too few devices, no split fitting the
    replica size, bad scaling options; one line, the value seen and what to give instead."""


class SimulationError(HybridRolloutError, RuntimeError):
    """The simulation cannot proceed (e.g. the trainer waits for samples no replica can ever produce)."""


class ReplicaPoolError(HybridRolloutError, RuntimeError):
    """A pool method raised during a controller phase; the message reads ``"<phase> failed at <method>: <error>"``.

    Args:
        phase: ``"activate"``, ``"deactivate"`` or ``"rebalance"``.
        method: The pool method that raised.
        original: The exception it raised (also the ``__cause__``).

    Example::

        err = ReplicaPoolError("deactivate", "abort_replicas", TimeoutError("engine 3"))
        assert str(err) == "deactivate failed at abort_replicas: engine 3"
    """

    def __init__(self, phase: str, method: str, original: BaseException) -> None:
        super().__init__(f"{phase} failed at {method}: {original}")
        self.phase = phase
        self.method = method
        self.original = original


class ReplicaDeadError(HybridRolloutError, RuntimeError):
    """The replica's actor (and so its engine) is gone; route elsewhere and retry.

    The replica handle turns Ray's actor-death errors into this type, so the load balancer and the rollouter
    recognise a dead replica by ``isinstance``.

    Args:
        replica_id: The dead replica.
        cause: What Ray reported.
    """

    def __init__(self, replica_id: str, cause: BaseException | str | None = None) -> None:
        self.replica_id = replica_id
        detail = f": {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}" if cause else ""
        super().__init__(f"replica {replica_id} is dead (its Ray actor exited){detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReplicaDeadError, (self.replica_id, None))


class ReplicaFailureError(HybridRolloutError, RuntimeError):
    """No rollout replica is left and none could be started (``rollout.max_replica_restarts`` replacements failed
    in a row); the callback saves a checkpoint before the fit stops with it."""


class NoReplicaAvailableError(HybridRolloutError, TimeoutError):
    """No routable replica appeared within the load balancer's acquire timeout."""


class RolloutError(HybridRolloutError, RuntimeError):
    """The rollouter stopped because of an unrecoverable error (the cause is chained)."""


class MessageQueueClosed(HybridRolloutError, RuntimeError):
    """The queue was closed (the rollouter stopped or failed); the message names the cause."""


class WeightLoadError(HybridRolloutError, RuntimeError):
    """An engine could not load or verify a weight update (the message names the replica and the cause)."""


class WeightSyncError(HybridRolloutError, RuntimeError):
    """A replica's weights do not match what the trainer sent.

    Args:
        failures: ``replica_id -> description`` (expected vs got checksum, or the error the replica raised).
        report: The ``SyncReport`` of the push (timings of the replicas that did answer).
    """

    def __init__(self, failures: Mapping[str, str], report: Any = None) -> None:
        self.failures = dict(failures)
        self.report = report
        lines = "; ".join(f"replica {rid}: {why}" for rid, why in sorted(self.failures.items()))
        super().__init__(
            f"weight sync failed on {len(self.failures)} replica(s): {lines}. The replica keeps serving whatever it "
            f"holds now; push the weights again (or restart the replica) before trusting its samples."
        )


class RankProtocolError(HybridRolloutError, RuntimeError):
    """The trainer ranks' boundary protocol was used out of order (a caller bug that would otherwise hang the run)."""


class DatasetError(HybridRolloutError, ValueError):
    """A prompt data set cannot be used (missing file, unknown format, missing column, malformed row, empty);
    the message names the file (and row) and how to fix it."""


class RewardFunctionError(HybridRolloutError, RuntimeError):
    """A reward function could not be loaded, or failed on a group (raised, timed out, returned NaN or the wrong
    number of values); the message names the function and the sample's prompt index."""


class EngineArgsError(HybridRolloutError, ValueError):
    """vLLM refused the engine arguments (unknown or invalid); the message is vLLM's own, on one line."""


class ToolError(HybridRolloutError, ValueError):
    """An agentic tool or tool-call parser cannot be used (not found, no type hints or docstring, unknown parser);
    the message names it and the fix."""


class AgentEnvironmentError(HybridRolloutError, ValueError):
    """An agentic environment cannot be used (path not found, no ``reset``, a ``step`` of the wrong shape); the
    message names it and the fix."""


class ChatTemplateError(HybridRolloutError, ValueError):
    """A chat template renders a new message in a way whose tokens cannot be told apart from the conversation's;
    the message names the role and the fix."""


def is_replica_dead_error(exc: BaseException) -> bool:
    """True if ``exc`` means the replica's process is gone.

    Args:
        exc: The exception raised by a replica call.
    """
    return isinstance(exc, ReplicaDeadError)
