"""DynamicResourceController: the hybrid replicas' state machine, driven by a policy, acting on a ReplicaPool.

``before_step`` and ``after_sync`` hold the per-step policy call order (design/scheduling.md §1) in one place for the
runtime callback and the simulator; a failed pool call is rolled back or left pending for retry, never half-active.
The state machine, the deactivation order and the failure rule are described in docs/controller.md; lending k of
the n hybrid replicas (the policy's ``activate_replica_count``) in docs/policies.md, "Lending k of n".
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from lightning_hybrid_rollout.errors import ReplicaPoolError as ReplicaPoolError  # re-exported
from lightning_hybrid_rollout.schedule.base import DynamicScheduleContext, DynamicSchedulePolicyBase

logger = logging.getLogger(__name__)

ACTIVATE_SEQUENCE: tuple[str, ...] = ("wake_up_replicas", "sync_weights", "add_replicas", "resume_generation_replicas")
DEACTIVATE_SEQUENCE: tuple[str, ...] = ("remove_replicas", "abort_replicas", "sleep_replicas")
_STATE_DICT_VERSION = 1


class ControllerState(enum.Enum):
    """Where the hybrid replicas are: only standalone replicas serve, or hybrid ones serve too."""

    STANDALONE_ONLY = "standalone_only"
    HYBRID_ACTIVE = "hybrid_active"


@runtime_checkable
class ReplicaPool(Protocol):
    """What the controller drives: the hybrid replicas, as a group (see docs/architecture.md).

    Every method is synchronous and its return value ignored; implementations must tolerate undoing a half-done
    step, which rollbacks and retries rely on. A pool that lends k of n replicas (a controller built with
    ``num_hybrid_replicas``) also takes ``replicas: Sequence[int]``, the indices concerned, as a keyword argument
    of every method but ``rebalance_requests``; called without it a method concerns all hybrid replicas.
    """

    def wake_up_replicas(self) -> object:
        """Bring the hybrid engines back (GPU: weights first, then KV cache; CPU: un-park)."""
        ...

    def sync_weights(self) -> object:
        """Push the trainer's current weights to the hybrid replicas (verified by checksum)."""
        ...

    def add_replicas(self) -> object:
        """Register the hybrid replicas in the load balancer."""
        ...

    def resume_generation_replicas(self) -> object:
        """Let the hybrid replicas accept requests."""
        ...

    def remove_replicas(self) -> object:
        """Cut routing to the hybrid replicas."""
        ...

    def abort_replicas(self) -> object:
        """Abort their in-flight requests (partial-rollout retries land on standalone replicas)."""
        ...

    def sleep_replicas(self) -> object:
        """Release KV cache + offload weights (GPU) / park the engine (CPU)."""
        ...

    def rebalance_requests(self) -> object:
        """Clear the sticky cache, abort in-flight requests on active replicas, resume (least-loaded re-routing)."""
        ...


@dataclass(frozen=True)
class SwitchRecord:
    """One completed activation or deactivation.

    Args:
        kind: ``"activate"`` or ``"deactivate"``.
        global_steps: The step during which it happened.
        start_s: Clock reading when it started (first attempt, for a retried deactivation).
        duration_s: Clock time it took (summed over attempts, for a retried deactivation).
    """

    kind: str
    global_steps: int
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class StepStartResult:
    """What :meth:`DynamicResourceController.before_step` did.

    Args:
        global_steps: The step.
        was_hybrid_active: State seen by ``should_deactivate`` (after any pending cleanup).
        should_deactivate: The policy's answer.
        wait_samples: The threshold passed to ``wait_for_samples`` (None if the policy said False).
        deactivated: Whether a deactivation really happened (False for a no-op on an inactive pool).
        deactivate_duration_s: Its duration (0.0 if none).
        cleanup_duration_s: Duration of pending steps finished first (0.0 if none).
    """

    global_steps: int
    was_hybrid_active: bool
    should_deactivate: bool
    wait_samples: int | None
    deactivated: bool
    deactivate_duration_s: float
    cleanup_duration_s: float = 0.0


@dataclass(frozen=True)
class StepEndResult:
    """What :meth:`DynamicResourceController.after_sync` did.

    Args:
        global_steps: The step.
        was_hybrid_active: State seen by ``should_activate_after_step``.
        should_activate: The policy's answer.
        activated: Whether an activation really happened (False for a no-op on an active pool).
        activate_duration_s: Its duration (0.0 if none).
        rebalanced: Whether ``request_rebalance`` + ``rebalance_requests`` ran.
        rebalance_duration_s: Duration of ``rebalance_requests`` (0.0 if not run).
        cycle_activate_duration_s: Value written to ``ctx.last_activate_duration_s``.
        cycle_deactivate_duration_s: Value written to ``ctx.last_deactivate_duration_s``.
        active_replicas: Hybrid replicas lent after the call (None: a controller without ``num_hybrid_replicas``).
    """

    global_steps: int
    was_hybrid_active: bool
    should_activate: bool
    activated: bool
    activate_duration_s: float
    rebalanced: bool
    rebalance_duration_s: float
    cycle_activate_duration_s: float
    cycle_deactivate_duration_s: float
    active_replicas: int | None = None


class DynamicResourceController:
    """Owns the hybrid replicas' lifecycle; a policy decides when, this class carries it out on a pool.

    Pure Python: the only time source is the injected ``clock`` (``time.monotonic`` at runtime, a virtual clock in
    the simulator).

    Args:
        pool: The hybrid replicas (a :class:`ReplicaPool`).
        policy: The scheduling policy.
        clock: Returns the current time in seconds; used only to measure durations.
        enable_rebalance: After a real activation, call ``policy.request_rebalance`` then
            ``pool.rebalance_requests`` (``dynamic_schedule_enable_rebalance``).
        has_hybrid: False when there are no hybrid replicas: activate()/deactivate() are no-ops (the policy is
            still consulted, in the same order).
        initial_state: The state the pool is in now.
        history_size: How many :class:`SwitchRecord` to keep in ``switch_history``.
        num_hybrid_replicas: The hybrid replicas ``n``, for a pool that lends a subset: after
            ``should_activate_after_step`` said True the policy's ``activate_replica_count`` sizes the lending and
            the pool's methods get ``replicas=`` the first k indices when k < n. None (the default): the pool is
            driven as one group, all or nothing, the policy's count is not asked.

    Example::

        from lightning_hybrid_rollout.schedule import DynamicScheduleContext, create_policy

        class Pool:  # a stand-in that does nothing
            def __getattr__(self, name):
                return lambda: None

        now = [0.0]
        controller = DynamicResourceController(Pool(), create_policy("default"), clock=lambda: now[0])
        ctx = DynamicScheduleContext(required_samples=8, trigger_parameter_sync_step=2)
        controller.before_step(1, ctx, wait_for_samples=lambda n: None)  # inactive: nothing to do
        end = controller.after_sync(2, ctx)  # gap 4.8 samples x 1000 s > 10 s: activate
        assert end.activated and controller.state is ControllerState.HYBRID_ACTIVE
    """

    def __init__(
        self,
        pool: ReplicaPool,
        policy: DynamicSchedulePolicyBase,
        clock: Callable[[], float],
        *,
        enable_rebalance: bool = True,
        has_hybrid: bool = True,
        initial_state: ControllerState = ControllerState.STANDALONE_ONLY,
        history_size: int = 1024,
        num_hybrid_replicas: int | None = None,
    ) -> None:
        initial_state = ControllerState(initial_state)
        if not has_hybrid and initial_state is ControllerState.HYBRID_ACTIVE:
            raise ValueError("initial_state=HYBRID_ACTIVE needs hybrid replicas, got has_hybrid=False")
        if history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {history_size}")
        if num_hybrid_replicas is not None and num_hybrid_replicas < 1:
            raise ValueError(f"num_hybrid_replicas must be >= 1 or None, got {num_hybrid_replicas}")
        self._pool = pool
        self._policy = policy
        self._clock = clock
        self._enable_rebalance = bool(enable_rebalance)
        self._has_hybrid = bool(has_hybrid)
        self._state = initial_state
        self._activate_count = 0
        self._deactivate_count = 0
        self._last_activate_duration_s = 0.0
        self._last_deactivate_duration_s = 0.0
        self._history: deque[SwitchRecord] = deque(maxlen=history_size)
        # switch durations since the previous after_sync (written into ctx there)
        self._cycle_activate_s = 0.0
        self._cycle_deactivate_s = 0.0
        # pool methods still owed (a suffix of DEACTIVATE_SEQUENCE) and the bookkeeping of that deactivation
        self._pending: list[str] = []
        self._pending_is_deactivation = False  # False: leftovers of a failed activation's rollback
        self._pending_start_s = 0.0
        self._pending_elapsed_s = 0.0
        self._last_global_steps = 0
        self._num_hybrid = num_hybrid_replicas
        # the subset the current lending (or its pending cleanup) concerns; None: all hybrid replicas
        self._subset: tuple[int, ...] | None = None
        # what the policy sizes k from: this cycle's sync_weights seconds and the replicas of its activation
        self._cycle_sync_s = 0.0
        self._cycle_replicas = 0

    # ------------------------------------------------------------------------------------------------ read-only

    @property
    def state(self) -> ControllerState:
        """The current state."""
        return self._state

    @property
    def is_hybrid_active(self) -> bool:
        """``state is HYBRID_ACTIVE``."""
        return self._state is ControllerState.HYBRID_ACTIVE

    @property
    def policy(self) -> DynamicSchedulePolicyBase:
        """The scheduling policy."""
        return self._policy

    @property
    def pool(self) -> ReplicaPool:
        """The replica pool."""
        return self._pool

    @property
    def enable_rebalance(self) -> bool:
        """Whether a real activation is followed by a rebalance."""
        return self._enable_rebalance

    @property
    def num_hybrid_replicas(self) -> int | None:
        """The hybrid replicas ``n`` a subset is chosen from (None: all-or-nothing lending)."""
        return self._num_hybrid

    @property
    def active_replicas(self) -> tuple[int, ...] | None:
        """Indices of the hybrid replicas lent now (``()``: none; None: active, without ``num_hybrid_replicas``)."""
        if not self.is_hybrid_active:
            return ()
        if self._subset is not None:
            return self._subset
        return None if self._num_hybrid is None else tuple(range(self._num_hybrid))

    @property
    def active_replica_count(self) -> int | None:
        """How many hybrid replicas are lent now (None when unknown: active without ``num_hybrid_replicas``)."""
        active = self.active_replicas
        return None if active is None else len(active)

    def replicas_to_activate(self, global_steps: int, ctx: DynamicScheduleContext) -> tuple[int, ...] | None:
        """The subset an activation now would lend: the policy's ``activate_replica_count``, clamped to [1, n].

        None means all (also whenever ``num_hybrid_replicas`` is None). Pure: the pool is not touched; the simulator's
        ``overlap_sync`` asks it to prepare only the replicas the activation will lend.

        Args:
            global_steps: The step that just synced.
            ctx: The decision context.
        """
        n = self._num_hybrid
        if n is None:
            return None
        k = int(self._policy.activate_replica_count(global_steps, ctx, n))
        k = min(n, max(1, k))
        return None if k >= n else tuple(range(k))

    def _call(self, method: str) -> None:
        """One pool method, on the current subset when there is one (the all-replica, no-argument call otherwise)."""
        if self._subset is None or method == "rebalance_requests":
            getattr(self._pool, method)()
        else:
            getattr(self._pool, method)(replicas=self._subset)

    @property
    def has_hybrid(self) -> bool:
        """Whether there are hybrid replicas at all."""
        return self._has_hybrid

    @property
    def activate_count(self) -> int:
        """Completed activations."""
        return self._activate_count

    @property
    def deactivate_count(self) -> int:
        """Completed deactivations."""
        return self._deactivate_count

    @property
    def last_activate_duration_s(self) -> float:
        """Duration of the last completed activation (0.0 before the first)."""
        return self._last_activate_duration_s

    @property
    def last_deactivate_duration_s(self) -> float:
        """Duration of the last completed deactivation (0.0 before the first)."""
        return self._last_deactivate_duration_s

    @property
    def switch_history(self) -> tuple[SwitchRecord, ...]:
        """The most recent completed switches, oldest first (bounded by ``history_size``)."""
        return tuple(self._history)

    @property
    def pending_cleanup(self) -> tuple[str, ...]:
        """Pool methods owed by a half-failed deactivation or rollback, retried first by the next call."""
        return tuple(self._pending)

    # ----------------------------------------------------------------------------------------------- switching

    def activate(self, global_steps: int | None = None, replicas: Sequence[int] | None = None) -> float:
        """Activate the hybrid replicas: wake_up_replicas -> sync_weights -> add_replicas -> resume_generation_replicas.

        Finishes pending cleanup first. A no-op (returns 0.0, logs at debug) when already active or without
        hybrid replicas. The lent subset stays fixed until the next deactivation, which concerns the same replicas.

        Args:
            global_steps: The step to record in ``switch_history`` (default: the last one seen).
            replicas: Indices of the hybrid replicas to lend (None: all); needs ``num_hybrid_replicas``.

        Returns:
            The activation's duration in clock seconds (pending cleanup excluded).

        Raises:
            ReplicaPoolError: A pool method raised (the failure rule is in docs/controller.md).

        Example::

            duration_s = controller.activate(global_steps=4)
        """
        step = self._step(global_steps)
        if not self._has_hybrid:
            logger.debug("activate() at step %d: no hybrid replicas, nothing to do", step)
            return 0.0
        if self.is_hybrid_active:
            logger.debug("activate() at step %d: hybrid replicas already active, nothing to do", step)
            return 0.0
        if self._pending:
            self._finish_pending(step)
        self._subset = self._checked_subset(replicas)
        start_s = self._clock()
        for method in ACTIVATE_SEQUENCE:
            method_start_s = self._clock()
            try:
                self._call(method)
            except Exception as err:
                self._rollback_activation(method)
                raise ReplicaPoolError("activate", method, err) from err
            if method == "sync_weights":
                self._cycle_sync_s += self._clock() - method_start_s
        duration_s = self._clock() - start_s
        self._cycle_replicas = len(self._subset) if self._subset is not None else (self._num_hybrid or 0)
        self._state = ControllerState.HYBRID_ACTIVE
        self._activate_count += 1
        self._last_activate_duration_s = duration_s
        self._cycle_activate_s += duration_s
        self._history.append(SwitchRecord("activate", step, start_s, duration_s))
        logger.debug("hybrid replicas activated at step %d in %.3fs", step, duration_s)
        return duration_s

    def _checked_subset(self, replicas: Sequence[int] | None) -> tuple[int, ...] | None:
        if replicas is None:
            return None
        n = self._num_hybrid
        if n is None:
            raise ValueError("activate(replicas=...) needs a controller built with num_hybrid_replicas")
        subset = tuple(sorted({int(i) for i in replicas}))
        if not subset or subset[0] < 0 or subset[-1] >= n:
            raise ValueError(f"replicas must be a non-empty subset of range({n}), got {list(replicas)}")
        return None if len(subset) == n else subset

    def deactivate(self, global_steps: int | None = None) -> float:
        """Deactivate the hybrid replicas: remove_replicas -> abort_replicas -> sleep_replicas (in this order).

        On an inactive pool, finishes pending cleanup if any, else is a no-op (returns 0.0, logs at debug); a no-op
        too without hybrid replicas.

        Args:
            global_steps: The step to record in ``switch_history`` (default: the last one seen).

        Returns:
            The deactivation's duration in clock seconds (summed over attempts when it finishes a retried one).

        Raises:
            ReplicaPoolError: A pool method raised (the failure rule is in docs/controller.md).

        Example::

            duration_s = controller.deactivate(global_steps=5)
        """
        step = self._step(global_steps)
        if not self._has_hybrid:
            logger.debug("deactivate() at step %d: no hybrid replicas, nothing to do", step)
            return 0.0
        if not self.is_hybrid_active:
            if self._pending:
                return self._finish_pending(step)
            logger.debug("deactivate() at step %d: hybrid replicas already inactive, nothing to do", step)
            return 0.0
        start_s = self._clock()
        try:
            self._call("remove_replicas")
        except Exception as err:  # routing not cut: still active, nothing owed
            raise ReplicaPoolError("deactivate", "remove_replicas", err) from err
        self._state = ControllerState.STANDALONE_ONLY
        self._pending = list(DEACTIVATE_SEQUENCE[1:])
        self._pending_is_deactivation = True
        self._pending_start_s = start_s
        self._pending_elapsed_s = 0.0
        return self._finish_pending(step, start_s=start_s)

    def _finish_pending(self, step: int, start_s: float | None = None) -> float:
        """Run the owed pool methods in order; record the deactivation when they all succeeded."""
        if start_s is None:
            start_s = self._clock()
            logger.info("step %d: retrying pending hybrid cleanup %s", step, self._pending)
        while self._pending:
            method = self._pending[0]
            try:
                self._call(method)
            except Exception as err:
                self._pending_elapsed_s += self._clock() - start_s
                raise ReplicaPoolError("deactivate", method, err) from err
            self._pending.pop(0)
        duration_s = self._pending_elapsed_s + (self._clock() - start_s)
        self._pending_elapsed_s = 0.0
        self._subset = None  # the lent replicas are all back with the trainer
        if not self._pending_is_deactivation:
            logger.info("step %d: rollback of the failed activation completed", step)
            return duration_s
        self._pending_is_deactivation = False
        self._deactivate_count += 1
        self._last_deactivate_duration_s = duration_s
        self._cycle_deactivate_s += duration_s
        self._history.append(SwitchRecord("deactivate", step, self._pending_start_s, duration_s))
        logger.debug("hybrid replicas deactivated at step %d in %.3fs", step, duration_s)
        return duration_s

    def _rollback_activation(self, failed_method: str) -> None:
        """Undo a failed activation best-effort; failing rollback calls become pending."""
        if failed_method in ("wake_up_replicas", "sync_weights"):
            steps = ["sleep_replicas"]
        else:
            steps = list(DEACTIVATE_SEQUENCE)
        for i, method in enumerate(steps):
            try:
                self._call(method)
            except Exception as err:
                logger.warning(
                    "rollback after activation failed at %s: %s raised %r; %s will be retried first by the next "
                    "before_step()/activate()/deactivate()",
                    failed_method,
                    method,
                    err,
                    steps[i:],
                )
                self._pending = steps[i:]
                self._pending_is_deactivation = False
                self._pending_elapsed_s = 0.0
                return
        self._subset = None

    # ------------------------------------------------------------------------------------------ per-step driver

    def before_step(
        self, global_steps: int, ctx: DynamicScheduleContext, wait_for_samples: Callable[[int], None]
    ) -> StepStartResult:
        """Before a training step: pending cleanup, should_deactivate -> deactivate_wait_samples -> wait -> deactivate.

        Args:
            global_steps: The step about to train.
            ctx: The decision context.
            wait_for_samples: Blocks until the queue holds at least that many samples (called only when the policy
                asks to deactivate, with ``max(0, deactivate_wait_samples(ctx))``).

        Returns:
            What happened.

        Example::

            start = controller.before_step(5, ctx, wait_for_samples=queue.wait_until_size)
        """
        self._last_global_steps = global_steps
        cleanup_s = self._finish_pending(global_steps) if self._pending else 0.0
        was_active = self.is_hybrid_active
        should = bool(self._policy.should_deactivate(global_steps, was_active, ctx))
        wait_samples: int | None = None
        deactivated = False
        duration_s = 0.0
        if should:
            wait_samples = max(0, int(self._policy.deactivate_wait_samples(ctx)))
            wait_for_samples(wait_samples)
            count_before = self._deactivate_count
            duration_s = self.deactivate(global_steps)
            deactivated = self._deactivate_count > count_before
        return StepStartResult(global_steps, was_active, should, wait_samples, deactivated, duration_s, cleanup_s)

    def after_sync(self, global_steps: int, ctx: DynamicScheduleContext) -> StepEndResult:
        """After the standalone weight sync: should_activate_after_step -> activate -> rebalance -> update_after_step.

        Writes this cycle's switch durations (since the previous ``after_sync``; 0.0 when none) into
        ``ctx.last_activate_duration_s`` / ``ctx.last_deactivate_duration_s`` just before ``update_after_step``.

        Args:
            global_steps: The step that just synced.
            ctx: The decision context.

        Returns:
            What happened.

        Example::

            end = controller.after_sync(8, ctx)
        """
        self._last_global_steps = global_steps
        was_active = self.is_hybrid_active
        should = bool(self._policy.should_activate_after_step(global_steps, was_active, ctx))
        activated = rebalanced = False
        activate_s = rebalance_s = 0.0
        if should:
            count_before = self._activate_count
            subset = None if self.is_hybrid_active else self.replicas_to_activate(global_steps, ctx)
            activate_s = self.activate(global_steps, replicas=subset)
            activated = self._activate_count > count_before
            if activated and self._enable_rebalance:
                self._policy.request_rebalance(global_steps, ctx)
                start_s = self._clock()
                try:
                    self._pool.rebalance_requests()
                except Exception as err:
                    raise ReplicaPoolError("rebalance", "rebalance_requests", err) from err
                rebalance_s = self._clock() - start_s
                rebalanced = True
        cycle_activate_s, cycle_deactivate_s = self._cycle_activate_s, self._cycle_deactivate_s
        ctx.last_activate_duration_s = cycle_activate_s
        ctx.last_deactivate_duration_s = cycle_deactivate_s
        self._cycle_activate_s = self._cycle_deactivate_s = 0.0
        # the k-sizing measurements, for a context that carries them (RateScheduleContext)
        if hasattr(ctx, "last_hybrid_sync_s"):
            ctx.last_hybrid_sync_s = self._cycle_sync_s
        if hasattr(ctx, "last_activated_replicas"):
            ctx.last_activated_replicas = self._cycle_replicas
        self._cycle_sync_s, self._cycle_replicas = 0.0, 0
        self._policy.update_after_step(global_steps, ctx)
        return StepEndResult(
            global_steps,
            was_active,
            should,
            activated,
            activate_s,
            rebalanced,
            rebalance_s,
            cycle_activate_s,
            cycle_deactivate_s,
            self.active_replica_count,
        )

    # ----------------------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """State, counters, history, pending-retry info and the policy's state, as plain Python values.

        Example::

            checkpoint["dynamic_resource_controller"] = controller.state_dict()
        """
        return {
            "version": _STATE_DICT_VERSION,
            "state": self._state.value,
            "activate_count": self._activate_count,
            "deactivate_count": self._deactivate_count,
            "last_activate_duration_s": self._last_activate_duration_s,
            "last_deactivate_duration_s": self._last_deactivate_duration_s,
            "switch_history": [asdict(record) for record in self._history],
            "cycle_activate_s": self._cycle_activate_s,
            "cycle_deactivate_s": self._cycle_deactivate_s,
            "pending_cleanup": list(self._pending),
            "pending_is_deactivation": self._pending_is_deactivation,
            "pending_start_s": self._pending_start_s,
            "pending_elapsed_s": self._pending_elapsed_s,
            "last_global_steps": self._last_global_steps,
            "active_replicas": None if self._subset is None else list(self._subset),
            "cycle_sync_s": self._cycle_sync_s,
            "cycle_replicas": self._cycle_replicas,
            "policy": self._policy.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the policy's state included).

        The pool is assumed to be in the restored state; a runtime that restarts its hybrid replicas asleep and
        out of the load balancer still works when the restored state is HYBRID_ACTIVE, since the next
        ``before_step`` deactivates them and pool methods must tolerate undoing what was not done.

        Args:
            state_dict: A mapping from :meth:`state_dict`.
        """
        version = state_dict.get("version")
        if version != _STATE_DICT_VERSION:
            raise ValueError(f"unsupported controller state_dict version {version!r}, expected {_STATE_DICT_VERSION}")
        state = ControllerState(state_dict["state"])
        if not self._has_hybrid and state is ControllerState.HYBRID_ACTIVE:
            raise ValueError("cannot restore state HYBRID_ACTIVE into a controller with has_hybrid=False")
        pending = list(state_dict.get("pending_cleanup", []))
        if pending and pending != list(DEACTIVATE_SEQUENCE[-len(pending) :]):
            raise ValueError(f"pending_cleanup must be a suffix of {list(DEACTIVATE_SEQUENCE)}, got {pending}")
        subset = state_dict.get("active_replicas")  # absent in a checkpoint from before k-of-n lending: all
        if subset is not None and self._num_hybrid is None:
            raise ValueError(f"cannot restore a lent subset {subset} into a controller without num_hybrid_replicas")
        self._policy.load_state_dict(state_dict["policy"])
        self._subset = None if subset is None else self._checked_subset(subset)
        self._cycle_sync_s = float(state_dict.get("cycle_sync_s", 0.0))
        self._cycle_replicas = int(state_dict.get("cycle_replicas", 0))
        self._state = state
        self._activate_count = int(state_dict["activate_count"])
        self._deactivate_count = int(state_dict["deactivate_count"])
        self._last_activate_duration_s = float(state_dict["last_activate_duration_s"])
        self._last_deactivate_duration_s = float(state_dict["last_deactivate_duration_s"])
        self._history = deque(
            (SwitchRecord(**record) for record in state_dict["switch_history"]), maxlen=self._history.maxlen
        )
        self._cycle_activate_s = float(state_dict["cycle_activate_s"])
        self._cycle_deactivate_s = float(state_dict["cycle_deactivate_s"])
        self._pending = pending
        self._pending_is_deactivation = bool(state_dict["pending_is_deactivation"])
        self._pending_start_s = float(state_dict["pending_start_s"])
        self._pending_elapsed_s = float(state_dict["pending_elapsed_s"])
        self._last_global_steps = int(state_dict["last_global_steps"])

    # ------------------------------------------------------------------------------------------------- helpers

    def _step(self, global_steps: int | None) -> int:
        if global_steps is None:
            return self._last_global_steps
        self._last_global_steps = global_steps
        return global_steps

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(state={self._state.name}, policy={self._policy!r}, "
            f"activations={self._activate_count}, deactivations={self._deactivate_count}, "
            f"pending={self._pending})"
        )
