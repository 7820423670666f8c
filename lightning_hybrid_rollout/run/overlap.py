"""``async_training.overlap_sync`` at a cycle end (rank 0): ask first, prepare under the standalone sync, undo.

The policy is asked ``should_activate_after_step`` *before* the standalone weight sync, with the cycle's
measurements so far. If it will activate, every rank offloads (the boundary's one ``"offload"``, through the rank
protocol), then the standalone sync runs concurrently with wake -> hybrid sync; the controller's activation that
follows finds the replicas awake and current and only adds and resumes them. If the controller then decides not to
activate (the policy changed its mind), the prepared replicas go back to sleep. With k of n lending only the replicas
the activation will lend are prepared (the controller's ``replicas_to_activate``), and any the activation did not
lend after all go back to sleep. The trainer stays offloaded until the next cycle start onloads every rank, as after
a deactivation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lightning_hybrid_rollout.run.recent import RecentList

__all__ = ["OverlapSync"]

log = logging.getLogger(__name__)


class OverlapSync:
    """The ``overlap_sync`` preparation of a cycle end, with a record of each one.

    Args:
        clock: The callback's clock.
        call_log: The callback's call log (appended to: ``overlap_should_activate``, ``overlap_prepare``,
            ``overlap_undo``).
        keep_events: How many of the newest preparations :attr:`events` keeps.
    """

    def __init__(self, clock: Callable[[], float], call_log: list[str], keep_events: int = 32) -> None:
        self._clock = clock
        self._call_log = call_log
        self._saved_s = 0.0
        #: The newest preparations, one entry each: timings, seconds saved, whether the controller activated, any undo.
        self.events: list[dict[str, Any]] = RecentList(keep_events)
        #: The hybrid replicas the last :meth:`will_activate` expects the activation to lend (None: all).
        self.subset: tuple[int, ...] | None = None

    def will_activate(self, controller: Any, runtime: Any, global_steps: int, context: Callable[[], Any]) -> bool:
        """Ask ``should_activate_after_step`` before the standalone sync.

        Not asked when nothing could be prepared: hybrid replicas active already, none at all, or a failed cleanup
        still pending. ``context()`` builds the decision context with the cycle's measurements so far (the role
        window is peeked at; ``after_sync`` takes it, as always).
        """
        c = controller
        self.subset = None
        if c is None or c.is_hybrid_active or not c.has_hybrid or not runtime.hybrid or c.pending_cleanup:
            return False
        ctx = context()
        self._call_log.append("overlap_should_activate")
        if not c.policy.should_activate_after_step(global_steps, c.is_hybrid_active, ctx):
            return False
        # prepare only what the activation will lend: the controller asks the policy the same question after the sync
        self.subset = c.replicas_to_activate(global_steps, ctx) if hasattr(c, "replicas_to_activate") else None
        return True

    def prepare(self, runtime: Any, protocol: Any, weights: Any, version: int, cycle: int) -> float:
        """Offload every rank, then both weight syncs at once; returns the standalone sync's seconds."""
        t0 = self._clock()
        protocol.need_devices()  # every rank offloads before the hybrid engines wake
        t_offload = self._clock()
        runtime.trace_phase("switching", t0, t_offload, op="offload")
        subset = {} if self.subset is None else {"replicas": self.subset}
        rep = runtime.push_standalone_overlapped(weights, version, **subset)
        self._call_log.append("overlap_prepare")
        runtime.trace_phase("weight_sync", rep.start_s, rep.standalone_end_s, target="standalone", overlap="hybrid")
        if rep.end_s > rep.standalone_end_s:
            runtime.trace_phase("switching", rep.standalone_end_s, rep.end_s, op="hybrid wake/sync (overlapped)")
        self._saved_s = rep.saved_s
        self.events.append(
            {
                "cycle": cycle,
                "offload_s": t_offload - t0,
                "standalone_s": rep.standalone_s,
                "wake_s": rep.wake_s,
                "hybrid_sync_s": rep.hybrid_sync_s,
                "wall_s": rep.wall_s,
                "saved_s": rep.saved_s,
                "hybrid_error": rep.hybrid_error,
                "replicas": None if self.subset is None else list(self.subset),
            }
        )
        log.debug(
            "cycle %d: hybrid wake + sync under the standalone sync (%.3fs + %.3fs under %.3fs, saved %.3fs)",
            cycle,
            rep.wake_s,
            rep.hybrid_sync_s,
            rep.standalone_s,
            rep.saved_s,
        )
        return rep.standalone_s

    def finish(self, controller: Any, runtime: Any, end: Any, cycle: int) -> None:
        """After the controller decided: put the prepared replicas back to sleep if it did not activate them (with
        k of n lending: those it did not lend)."""
        event = self.events[-1]
        event["activated"] = bool(end.activated)
        pool = runtime.pool
        if not getattr(pool, "awake", False):
            return
        extra: list[int] | None = None  # None: all of them
        if controller.is_hybrid_active:
            lent = getattr(controller, "active_replicas", None)
            awake = getattr(pool, "awake_indices", None)
            if lent is None or awake is None:  # all lent (an all-or-nothing controller or pool)
                return
            extra = [i for i in awake if i not in lent]
            if not extra:
                return
        t0 = self._clock()
        if extra is None:
            pool.sleep_replicas()
        else:
            pool.sleep_replicas(replicas=extra)
        duration_s = self._clock() - t0
        event["undo_s"] = duration_s
        self._call_log.append("overlap_undo")
        runtime.trace_phase("switching", t0, t0 + duration_s, op="sleep (overlap undone)")
        log.debug(
            "cycle %d: the policy changed its mind after the sync; hybrid back to sleep (%.3fs)", cycle, duration_s
        )

    def take_saved_s(self) -> float:
        """Seconds the last preparation saved, once (0.0 after, until the next one)."""
        seconds, self._saved_s = self._saved_s, 0.0
        return seconds
