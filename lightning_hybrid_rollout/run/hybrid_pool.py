"""The controller's ``ReplicaPool`` over the real hybrid replicas, and what it asks of the trainer side.

:class:`HybridReplicaPool` carries out the controller's calls (wake, sync, add, resume, remove, abort, sleep,
rebalance) on the runtime's hybrid replicas, on the runtime's event loop; before a wake it asks the trainer for the
devices through a :class:`TrainerLink` (the callback's rank protocol offloads every rank). :class:`OverlapReport`
holds the timings of an ``overlap_sync`` preparation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_hybrid_rollout.errors import ReplicaDeadError, is_replica_dead_error
from lightning_hybrid_rollout.rollout.drain import DrainReport
from lightning_hybrid_rollout.run.recent import RecentList

__all__ = ["HybridReplicaPool", "NoTrainer", "OverlapReport", "TrainerLink"]

log = logging.getLogger(__name__)


@dataclass
class OverlapReport:
    """Timings of :meth:`RolloutRuntime.push_standalone_overlapped` (``time.monotonic()`` readings).

    Args:
        start_s: Both halves started.
        standalone_end_s: The standalone weight sync finished.
        wake_end_s: The hybrid replicas were awake (``start_s`` if the hybrid half failed).
        hybrid_end_s: The hybrid weight sync finished (``start_s`` if the hybrid half failed).
        end_s: Both halves finished.
        hybrid_error: Why the hybrid half failed (the replicas were put back to sleep), or None.
    """

    start_s: float
    standalone_end_s: float
    wake_end_s: float
    hybrid_end_s: float
    end_s: float
    hybrid_error: str | None = None

    @property
    def standalone_s(self) -> float:
        """Seconds of the standalone weight sync."""
        return self.standalone_end_s - self.start_s

    @property
    def wake_s(self) -> float:
        """Seconds of the hybrid wake-up."""
        return self.wake_end_s - self.start_s

    @property
    def hybrid_sync_s(self) -> float:
        """Seconds of the hybrid weight sync (after the wake-up)."""
        return self.hybrid_end_s - self.wake_end_s

    @property
    def wall_s(self) -> float:
        """Seconds the caller was blocked: ``max(standalone, wake + hybrid sync)`` plus scheduling noise."""
        return self.end_s - self.start_s

    @property
    def saved_s(self) -> float:
        """Seconds saved against verl's order (standalone sync, then wake, then hybrid sync, one after another)."""
        return max(0.0, self.standalone_s + self.wake_s + self.hybrid_sync_s - self.wall_s)


class TrainerLink(Protocol):
    """What the hybrid pool asks of the trainer side (``trainer_side.TrainerSide``; a test passes a fake)."""

    def need_devices(self) -> None:
        """Right before hybrid engines wake on the trainer's devices: every rank offloads (the rank protocol)."""
        ...

    def cycle_weights(self) -> list[tuple[str, Any]]:
        """The trainer's current full weights, ``[(name, tensor), ...]`` (rank 0, gathered at the cycle end)."""
        ...

    def weight_version(self) -> int:
        """The current parameter version."""
        ...


class NoTrainer:
    """A :class:`TrainerLink` with nothing to offload, no weights and version 0 (benchmarks, bare runtimes)."""

    def need_devices(self) -> None:
        pass

    def cycle_weights(self) -> list[tuple[str, Any]]:
        return []

    def weight_version(self) -> int:
        return 0


class HybridReplicaPool:
    """The controller's :class:`~lightning_hybrid_rollout.schedule.ReplicaPool` over the real hybrid replicas.

    Every method tolerates being asked to undo what was never done (the controller's rollback relies on it).
    The pool tracks whether the engines are awake and which weight version they hold: after
    :meth:`RolloutRuntime.push_standalone_overlapped` prepared them, :meth:`wake_up_replicas` and
    :meth:`sync_weights` are no-ops, so the activation only adds and resumes them.

    Args:
        runtime: The owning runtime.
    """

    def __init__(self, runtime: Any) -> None:  # the RolloutRuntime (not imported: it imports this module)
        self._rt = runtime
        self.registered = False
        #: The hybrid replicas take requests now (resumed, not removed since).
        self.routing = False
        self.awake = False
        #: Param version the hybrid engines hold while awake (None: asleep, or not synced since they woke).
        self.weights_version: int | None = None
        #: The newest pool calls by name, oldest first (bounded for long fits; tests read the order).
        self.calls: list[str] = RecentList(256)
        #: Seconds of hybrid weight pushes not yet reported in a cycle's ``weight_sync_time_s``.
        self.cycle_sync_s = 0.0
        #: What the last deactivation's abort step did (``rollout.deactivation_drain_s``), and the run's sum.
        self.last_drain = DrainReport()
        self.drain_total = DrainReport()

    @property
    def replicas(self) -> list[Any]:
        return self._rt.hybrid

    @property
    def ids(self) -> list[str]:
        return [r.replica_id for r in self._rt.hybrid]

    def _all(self, make: Callable[[Any], Coroutine[Any, Any, Any]]) -> list[Any]:
        """``make(replica)`` on every hybrid replica at once. A replica whose actor died is skipped (the runtime's
        ``supervise`` replaces it); any other error is raised."""
        return self._rt.loop.run(self._all_async(make))

    async def _all_async(self, make: Callable[[Any], Coroutine[Any, Any, Any]]) -> list[Any]:
        replicas = list(self.replicas)
        timeout = self._rt.rollout.replica_health_timeout_s

        async def one(replica: Any) -> Any:
            try:
                return await asyncio.wait_for(make(replica), timeout)
            except TimeoutError:  # it stopped answering: killed, so it counts as dead (and is replaced)
                log.warning("hybrid replica %s did not answer within %gs; killing it", replica.replica_id, timeout)
                replica.kill()
                return ReplicaDeadError(replica.replica_id, f"no answer within {timeout:g}s")

        got = await asyncio.gather(*(one(r) for r in replicas), return_exceptions=True)
        errors = [g for g in got if isinstance(g, BaseException)]
        for replica, g in zip(replicas, got, strict=True):
            if isinstance(g, BaseException) and is_replica_dead_error(g):
                log.warning("hybrid replica %s is dead; the others go on (it is replaced)", replica.replica_id)
        fatal = [e for e in errors if not is_replica_dead_error(e)]
        if fatal:
            raise fatal[0]
        return [g for g in got if not isinstance(g, BaseException)]

    def wake_up_replicas(self) -> None:
        if self.awake:  # prepared under the standalone sync (overlap_sync)
            self.calls.append("wake_up_replicas (no-op: awake)")
            return
        self.calls.append("wake_up_replicas")
        self._rt.trainer.need_devices()
        self._rt.set_state(self.ids, "switching")
        self._all(lambda r: r.wake_up())
        self.awake = True

    def sync_weights(self) -> None:
        version = self._rt.trainer.weight_version()
        if self.awake and self.weights_version == version:  # prepared under the standalone sync (overlap_sync)
            self.calls.append("sync_weights (no-op: current)")
            return
        self.calls.append("sync_weights")
        self._rt.set_state(self.ids, "syncing")
        t0 = time.monotonic()
        self._rt.push(self._rt.trainer.cycle_weights(), self.replicas, version)
        self._rt.last_hybrid_sync_report = self._rt.last_sync_report
        self.cycle_sync_s += time.monotonic() - t0
        self.weights_version = version
        self._rt.set_state(self.ids, "switching")

    async def wake_and_sync_async(self, weights: list[tuple[str, Any]], version: int) -> tuple[float, float]:
        """Wake the hybrid engines, then push ``weights`` to them, on the runtime's loop (``overlap_sync``).

        Unlike :meth:`wake_up_replicas` it does not call ``trainer.need_devices()``: the caller offloaded the
        training state first (on the trainer's thread, with every rank). Returns the clock readings
        ``(woken_s, synced_s)``.
        """
        self.calls.append("wake_up_replicas (overlapped)")
        self._rt.set_state(self.ids, "switching")
        await self._all_async(lambda r: r.wake_up())
        self.awake = True
        woken_s = time.monotonic()
        self.calls.append("sync_weights (overlapped)")
        self._rt.set_state(self.ids, "syncing")
        report, _ = await self._rt.push_async(weights, self.replicas, version)
        if report is not None:
            self._rt.last_hybrid_sync_report = report
        self.weights_version = version
        self._rt.set_state(self.ids, "switching")
        synced_s = time.monotonic()
        self.cycle_sync_s += synced_s - woken_s
        return woken_s, synced_s

    def take_cycle_sync_s(self) -> float:
        """Seconds spent pushing weights to the hybrid replicas since the last call (one cycle's hybrid sync)."""
        seconds, self.cycle_sync_s = self.cycle_sync_s, 0.0
        return seconds

    def add_replicas(self) -> None:
        self.calls.append("add_replicas")
        self._rt.rollouter.add_replicas(self.replicas, paused=True)
        self.registered = True

    def resume_generation_replicas(self) -> None:
        self.calls.append("resume_generation_replicas")
        self._rt.rollouter.resume_generation_replicas(self.ids)
        self.routing = True
        self._rt.set_state(self.ids, "active")

    def remove_replicas(self) -> None:
        self.calls.append("remove_replicas")
        self.routing = False
        if self.registered:
            self._rt.rollouter.remove_replicas(self.ids)
        self._rt.set_state(self.ids, "switching")

    def abort_replicas(self) -> None:
        """Abort the hybrid replicas' in-flight requests; with ``rollout.deactivation_drain_s > 0`` those that will
        finish within that budget complete first (a drain). Returns once none is left on them either way."""
        self.calls.append("abort_replicas")
        self.last_drain = DrainReport()
        if not self.registered:
            return
        budget = float(getattr(self._rt.rollout, "deactivation_drain_s", 0.0))
        self.last_drain = self._rt.rollouter.drain_replicas(self.ids, budget)
        self.drain_total = self.drain_total + self.last_drain
        if self.last_drain.requests:
            log.debug("hybrid deactivation (drain budget %.3fs): %s", budget, self.last_drain)

    def sleep_replicas(self) -> None:
        self.calls.append("sleep_replicas")
        self._all(lambda r: r.sleep())
        self.awake = False
        self.weights_version = None
        self._rt.set_state(self.ids, "parked")

    def rebalance_requests(self) -> None:
        self.calls.append("rebalance_requests")
        self._rt.rollouter.rebalance_requests()
