"""The controller's ``ReplicaPool`` over the real hybrid replicas, and what it asks of the trainer side.

:class:`HybridReplicaPool` carries out the controller's calls (wake, sync, add, resume, remove, abort, sleep,
rebalance) on the runtime's hybrid replicas, on the runtime's event loop, on all of them or on the subset the
controller lends (k of n: the others stay asleep, out of the load balancer, and catch up on the weights when next
lent); before a wake it asks the trainer for the devices through a :class:`TrainerLink` (the callback's rank
protocol offloads every rank). :class:`OverlapReport` holds the timings of an ``overlap_sync`` preparation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
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

    Every method tolerates being asked to undo what was never done (the controller's rollback relies on it), and
    takes the controller's optional ``replicas`` (indices of the hybrid replicas, for k of n lending; None: all).
    Index ``i`` names a slot, the ``i``-th hybrid replica id as the runtime started them (``hybrid-i``), so a
    replacement under the same id keeps the slot's index and its lent state. The pool tracks per slot whether the
    engine is awake, registered and routed to, and which weight version it holds: a replica not lent stays asleep
    and untouched, and the next activation that lends it pushes it from the version it holds to the current one
    (the weight push sends a delta from that version or a full sync: :class:`~lightning_hybrid_rollout.rollout.
    weights.delta.DeltaSync`). After :meth:`RolloutRuntime.push_standalone_overlapped` prepared some replicas,
    :meth:`wake_up_replicas` and :meth:`sync_weights` only touch the others, so the activation adds and resumes them.

    Args:
        runtime: The owning runtime.
    """

    def __init__(self, runtime: Any) -> None:  # the RolloutRuntime (not imported: it imports this module)
        self._rt = runtime
        #: Slot ids by index (captured from the runtime's hybrid replicas at the first use).
        self._slot_ids: list[str] = []
        self._awake: set[str] = set()
        self._registered: set[str] = set()
        self._routing: set[str] = set()
        # version each awake engine was verified to hold since it woke (a sleep may drop the weights: cleared)
        self._synced: dict[str, int] = {}
        #: ``replica_id -> `` the last weight version verified on that replica, kept while it sleeps (a replica not
        #: lent falls behind; the next lending brings it current).
        self.held_versions: dict[str, int] = {}
        #: ``replica_id -> `` the report of the last hybrid push that reached it (each push names only its replicas).
        self.sync_reports: dict[str, Any] = {}
        #: The newest pool calls by name, oldest first (bounded for long fits; tests read the order).
        self.calls: list[str] = RecentList(256)
        #: Seconds of hybrid weight pushes not yet reported in a cycle's ``weight_sync_time_s``.
        self.cycle_sync_s = 0.0
        #: What the last deactivation's abort step did (``rollout.deactivation_drain_s``), and the run's sum.
        self.last_drain = DrainReport()
        self.drain_total = DrainReport()

    # ------------------------------------------------------------------------------------------------ read-only

    @property
    def replicas(self) -> list[Any]:
        """The hybrid replica handles now (a failed one is gone until its replacement joins)."""
        return self._rt.hybrid

    @property
    def ids(self) -> list[str]:
        """Their ids."""
        return [r.replica_id for r in self._rt.hybrid]

    @property
    def slot_ids(self) -> list[str]:
        """The hybrid replica id of each index the controller names (in the order the runtime started them)."""
        known = set(self._slot_ids)
        self._slot_ids.extend(r.replica_id for r in self._rt.hybrid if r.replica_id not in known)
        return list(self._slot_ids)

    @property
    def awake(self) -> bool:
        """Some hybrid engine is awake (woken, or prepared by ``overlap_sync``)."""
        return bool(self._awake)

    @property
    def registered(self) -> bool:
        """Some hybrid replica was ever added to the load balancer."""
        return bool(self._registered)

    @property
    def routing(self) -> bool:
        """Some hybrid replica takes requests now (resumed, not removed since)."""
        return bool(self._routing)

    @property
    def weights_version(self) -> int | None:
        """The version every awake engine holds (None: none awake, or one not synced since it woke)."""
        versions = {self._synced.get(rid) for rid in self._awake}
        return versions.pop() if len(versions) == 1 else None

    def _indices(self, ids: set[str]) -> tuple[int, ...]:
        return tuple(i for i, rid in enumerate(self.slot_ids) if rid in ids)

    @property
    def awake_indices(self) -> tuple[int, ...]:
        """Indices of the slots whose engines are awake."""
        return self._indices(self._awake)

    @property
    def routing_indices(self) -> tuple[int, ...]:
        """Indices of the slots that take requests now."""
        return self._indices(self._routing)

    def is_awake(self, replica_id: str) -> bool:
        """Whether the slot ``replica_id`` is awake (a replacement joining it must wake and take the weights)."""
        return replica_id in self._awake

    def is_routing(self, replica_id: str) -> bool:
        """Whether the slot ``replica_id`` takes requests (a replacement joining it is added to the load balancer)."""
        return replica_id in self._routing

    # ----------------------------------------------------------------------------------- the runtime's notices

    def park_started(self) -> None:
        """The runtime just started the hybrid replicas: fix each slot's index (the order they started in, which a
        replacement does not change) and park every engine, outside the load balancer."""
        self._slot_ids = [r.replica_id for r in self._rt.hybrid]
        self._all(lambda r: r.sleep())

    def replica_failed(self, replica_id: str) -> None:
        """The slot's replica died: its replacement holds no weights this pool verified."""
        self._synced.pop(replica_id, None)
        self.held_versions.pop(replica_id, None)

    def replica_joined(self, replica_id: str, version: int | None) -> None:
        """A replacement joined the slot, verified to hold ``version`` (None: only its weights from disk)."""
        if version is None:
            return
        self.held_versions[replica_id] = version
        if replica_id in self._awake:
            self._synced[replica_id] = version

    # ----------------------------------------------------------------------------------------------- internals

    def _chosen(self, replicas: Sequence[int] | None) -> tuple[list[str], list[Any]]:
        """``(slot ids, live handles)`` of ``replicas`` (None: every hybrid replica)."""
        slots = self.slot_ids
        if replicas is None:
            ids = slots
        else:
            bad = [i for i in replicas if not 0 <= int(i) < len(slots)]
            if bad:
                raise IndexError(f"hybrid replica indices {bad} out of range({len(slots)})")
            ids = [slots[int(i)] for i in replicas]
        wanted = set(ids)
        return ids, [r for r in self._rt.hybrid if r.replica_id in wanted]

    def _label(self, name: str, replicas: Sequence[int] | None, note: str = "") -> str:
        subset = "" if replicas is None else f" {sorted(int(i) for i in replicas)}"
        return f"{name}{subset}{f' ({note})' if note else ''}"

    def _all(self, make: Callable[[Any], Coroutine[Any, Any, Any]], replicas: Sequence[Any] | None = None) -> list[Any]:
        """``make(replica)`` on each of ``replicas`` (default: every hybrid replica) at once. A replica whose actor
        died is skipped (the runtime's ``supervise`` replaces it); any other error is raised."""
        return self._rt.loop.run(self._all_async(make, replicas))

    async def _all_async(
        self, make: Callable[[Any], Coroutine[Any, Any, Any]], replicas: Sequence[Any] | None = None
    ) -> list[Any]:
        replicas = list(self.replicas if replicas is None else replicas)
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

    def _record_sync(self, report: Any, pushed: Sequence[Any], version: int) -> None:
        """Each pushed replica whose checksum the report verified holds ``version`` now (all of them when the push
        had nothing to send: no weights, the engines keep what they loaded)."""
        checksums = getattr(report, "replica_checksums", None)
        expected = getattr(report, "checksum", None)
        for r in pushed:
            rid = r.replica_id
            if isinstance(checksums, dict) and expected and checksums.get(rid) != expected:
                self._synced.pop(rid, None)  # died under the push: the next supervise() replaces it
                continue
            self._synced[rid] = version
            self.held_versions[rid] = version
            if report is not None:
                self.sync_reports[rid] = report

    # ------------------------------------------------------------------------------------------- ReplicaPool

    def wake_up_replicas(self, replicas: Sequence[int] | None = None) -> None:
        ids, handles = self._chosen(replicas)
        asleep = [r for r in handles if r.replica_id not in self._awake]
        if not asleep and all(rid in self._awake for rid in ids):  # prepared under the standalone sync
            self.calls.append(self._label("wake_up_replicas", replicas, "no-op: awake"))
            return
        self.calls.append(self._label("wake_up_replicas", replicas))
        self._rt.trainer.need_devices()
        woken = [r.replica_id for r in asleep]
        self._rt.set_state(woken, "switching")
        self._all(lambda r: r.wake_up(), asleep)
        self._awake.update(ids)  # a slot being replaced counts too: its replacement joins awake

    def sync_weights(self, replicas: Sequence[int] | None = None) -> None:
        version = self._rt.trainer.weight_version()
        _, handles = self._chosen(replicas)
        stale = [r for r in handles if self._synced.get(r.replica_id) != version]
        if not stale:  # prepared under the standalone sync (overlap_sync), or nothing to push to
            self.calls.append(self._label("sync_weights", replicas, "no-op: current"))
            return
        self.calls.append(self._label("sync_weights", replicas))
        ids = [r.replica_id for r in stale]
        self._rt.set_state(ids, "syncing")
        t0 = time.monotonic()
        report, _ = self._rt.loop.run(self._rt.push_async(self._rt.trainer.cycle_weights(), stale, version))
        if report is not None:
            self._rt.last_sync_report = report
            self._rt.last_hybrid_sync_report = report
        self.cycle_sync_s += time.monotonic() - t0
        self._record_sync(report, stale, version)
        self._rt.set_state(ids, "switching")

    async def wake_and_sync_async(
        self, weights: list[tuple[str, Any]], version: int, replicas: Sequence[int] | None = None
    ) -> tuple[float, float]:
        """Wake the hybrid engines (``replicas``: those only), then push ``weights`` to them, on the runtime's loop
        (``overlap_sync``).

        Unlike :meth:`wake_up_replicas` it does not call ``trainer.need_devices()``: the caller offloaded the
        training state first (on the trainer's thread, with every rank). Returns the clock readings
        ``(woken_s, synced_s)``.
        """
        ids, handles = self._chosen(replicas)
        self.calls.append(self._label("wake_up_replicas", replicas, "overlapped"))
        self._rt.set_state(ids, "switching")
        await self._all_async(lambda r: r.wake_up(), handles)
        self._awake.update(ids)
        woken_s = time.monotonic()
        self.calls.append(self._label("sync_weights", replicas, "overlapped"))
        self._rt.set_state(ids, "syncing")
        report, _ = await self._rt.push_async(weights, handles, version)
        if report is not None:
            self._rt.last_hybrid_sync_report = report
        self._record_sync(report, handles, version)
        self._rt.set_state(ids, "switching")
        synced_s = time.monotonic()
        self.cycle_sync_s += synced_s - woken_s
        return woken_s, synced_s

    def take_cycle_sync_s(self) -> float:
        """Seconds spent pushing weights to the hybrid replicas since the last call (one cycle's hybrid sync)."""
        seconds, self.cycle_sync_s = self.cycle_sync_s, 0.0
        return seconds

    def add_replicas(self, replicas: Sequence[int] | None = None) -> None:
        self.calls.append(self._label("add_replicas", replicas))
        _, handles = self._chosen(replicas)
        self._rt.rollouter.add_replicas(handles, paused=True)
        self._registered.update(r.replica_id for r in handles)

    def resume_generation_replicas(self, replicas: Sequence[int] | None = None) -> None:
        self.calls.append(self._label("resume_generation_replicas", replicas))
        ids, handles = self._chosen(replicas)
        live = [r.replica_id for r in handles if r.replica_id in self._registered]
        self._rt.rollouter.resume_generation_replicas(live)
        self._routing.update(ids)
        self._rt.set_state(live, "active")

    def remove_replicas(self, replicas: Sequence[int] | None = None) -> None:
        self.calls.append(self._label("remove_replicas", replicas))
        ids, handles = self._chosen(replicas)
        self._routing.difference_update(ids)
        registered = [r.replica_id for r in handles if r.replica_id in self._registered]
        if registered:
            self._rt.rollouter.remove_replicas(registered)
        self._rt.set_state([r.replica_id for r in handles], "switching")

    def abort_replicas(self, replicas: Sequence[int] | None = None) -> None:
        """Abort the hybrid replicas' in-flight requests; with ``rollout.deactivation_drain_s > 0`` those that will
        finish within that budget complete first (a drain). Returns once none is left on them either way."""
        self.calls.append(self._label("abort_replicas", replicas))
        self.last_drain = DrainReport()
        _, handles = self._chosen(replicas)
        registered = [r.replica_id for r in handles if r.replica_id in self._registered]
        if not registered:  # never added (not lent, or the activation failed before): nothing can be in flight
            return
        budget = float(getattr(self._rt.rollout, "deactivation_drain_s", 0.0))
        self.last_drain = self._rt.rollouter.drain_replicas(registered, budget)
        self.drain_total = self.drain_total + self.last_drain
        if self.last_drain.requests:
            log.debug("hybrid deactivation (drain budget %.3fs): %s", budget, self.last_drain)

    def sleep_replicas(self, replicas: Sequence[int] | None = None) -> None:
        self.calls.append(self._label("sleep_replicas", replicas))
        ids, handles = self._chosen(replicas)
        # every chosen engine, awake or not by the books: a failed wake may have woken some of them
        self._all(lambda r: r.sleep(), handles)
        self._awake.difference_update(ids)
        for rid in ids:
            self._synced.pop(rid, None)
        self._rt.set_state([r.replica_id for r in handles], "parked")

    def rebalance_requests(self) -> None:
        self.calls.append("rebalance_requests")
        self._rt.rollouter.rebalance_requests()
