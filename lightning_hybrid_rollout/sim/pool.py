"""The controller's replica pool on the simulator's virtual clock (the runtime's: ``HybridReplicaPool``).

Every method takes the controller's optional ``replicas`` subset (k of n lending); without it, all hybrid replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lightning_hybrid_rollout.sim.scenario import Scenario
from lightning_hybrid_rollout.sim.world import RolloutWorld, SimReplica

__all__ = ["SimReplicaPool"]


class SimReplicaPool:
    """The controller's :class:`~lightning_hybrid_rollout.schedule.ReplicaPool`, on the virtual clock.

    Each method changes the hybrid replicas' state in the world and advances the clock by its cost (the trainer is
    blocked meanwhile; standalone replicas keep generating), charging the trainer-timeline bucket it belongs to.
    The hybrid weight sync's cost follows the replicas synced and their lag (``Scenario.lending``).

    Args:
        world: The rollout world.
        scenario: For the switch costs.
        charge: ``charge(bucket, seconds, trace_name, args)`` records trainer time.
    """

    def __init__(
        self, world: RolloutWorld, scenario: Scenario, charge: Callable[[str, float, str, dict[str, Any]], None]
    ) -> None:
        self.world = world
        self.costs = scenario.costs
        self.lending = scenario.lending
        self._charge = charge
        #: Param version each hybrid replica holds, by index (absent: none; they start asleep without weights).
        self.held: dict[int, int] = {}

    @property
    def replicas(self) -> list[SimReplica]:
        """The hybrid replicas."""
        return self.world.hybrid

    @property
    def synced_version(self) -> int:
        """The oldest param version an awake hybrid replica holds (-1: one holds none, or none is awake)."""
        awake = [r.index for r in self.replicas if r.awake]
        if not awake or any(i not in self.held for i in awake):
            return -1
        return min(self.held[i] for i in awake)

    def _chosen(self, replicas: Sequence[int] | None) -> list[SimReplica]:
        return list(self.replicas) if replicas is None else [self.replicas[i] for i in replicas]

    def _spend(self, bucket: str, seconds: float, op: str) -> None:
        w = self.world
        t0 = w.now
        w.advance_to(t0 + seconds)
        if bucket == "weight_sync_hybrid":
            self._charge(bucket, w.now - t0, "weight_sync", {"op": op, "target": "hybrid"})
        else:
            self._charge(bucket, w.now - t0, "switching", {"op": op})

    def sync_s(self, chosen: list[SimReplica], version: int | None = None) -> float:
        """Seconds to bring ``chosen`` to ``version`` (default: the current one; 0 when they all hold it)."""
        version = self.world.version if version is None else version
        stale = [r for r in chosen if self.held.get(r.index) != version]
        if not stale:
            return 0.0
        held = [self.held.get(r.index) for r in stale]
        behind = None if any(v is None for v in held) else max(version - v for v in held if v is not None)
        return self.lending.hybrid_sync_s(
            self.costs.hybrid_sync_s, replicas=len(stale), of=len(self.replicas), versions_behind=behind
        )

    def mark_synced(self, chosen: list[SimReplica], version: int | None = None) -> None:
        """``chosen`` hold ``version`` (default: the current one; the runner's ``overlap_sync`` prepares the next)."""
        for r in chosen:
            self.held[r.index] = self.world.version if version is None else version

    def wake_up_replicas(self, replicas: Sequence[int] | None = None) -> None:
        """Weights, then KV cache back on the trainer's devices (a no-op if already awake)."""
        chosen = self._chosen(replicas)
        if all(r.awake for r in chosen):
            return
        self.world.set_state(chosen, "switching", serving=False, routable=False)
        self._spend("hybrid_switching", self.costs.wake_s, "wake_up_replicas")
        for r in chosen:
            r.awake = True

    def sync_weights(self, replicas: Sequence[int] | None = None) -> None:
        """Push the trainer's weights to the hybrid replicas (a no-op if they already hold this version)."""
        chosen = self._chosen(replicas)
        seconds = self.sync_s(chosen)
        if all(self.held.get(r.index) == self.world.version for r in chosen):
            return
        self.mark_synced(chosen)
        self.world.set_state(chosen, "syncing", serving=False)
        self._spend("weight_sync_hybrid", seconds, "sync_weights")

    def add_replicas(self, replicas: Sequence[int] | None = None) -> None:
        """Register the hybrid replicas in the load balancer (routable once resumed)."""
        self._spend("hybrid_switching", self.costs.add_s, "add_replicas")

    def resume_generation_replicas(self, replicas: Sequence[int] | None = None) -> None:
        """The hybrid replicas accept requests."""
        self.world.set_state(self._chosen(replicas), "active", serving=True, routable=True)
        self._spend("hybrid_switching", self.costs.resume_s, "resume_generation_replicas")

    def remove_replicas(self, replicas: Sequence[int] | None = None) -> None:
        """Cut routing to the hybrid replicas (their in-flight samples keep decoding until aborted)."""
        chosen = self._chosen(replicas)
        self.world.set_state(
            chosen,
            chosen[0].state if chosen else "active",
            serving=any(r.serving for r in chosen),
            routable=False,
        )
        self._spend("hybrid_switching", self.costs.remove_s, "remove_replicas")

    def abort_replicas(self, replicas: Sequence[int] | None = None) -> None:
        """Abort their in-flight samples; partial-rollout retries go to the routable (standalone) replicas."""
        self.world.abort(self._chosen(replicas))
        self._spend("hybrid_switching", self.costs.abort_s, "abort_replicas")

    def sleep_replicas(self, replicas: Sequence[int] | None = None) -> None:
        """Release KV cache and offload weights: the devices return to the trainer."""
        chosen = self._chosen(replicas)
        self.world.abort([r for r in chosen if r.members])  # nothing may keep decoding on a sleeping engine
        self.world.set_state(chosen, "switching", serving=False, routable=False)
        self._spend("hybrid_switching", self.costs.sleep_s, "sleep_replicas")
        for r in chosen:
            r.awake = False
            if not self.lending.delta:  # a sleeping engine drops its weights; a delta sync needs them kept on host
                self.held.pop(r.index, None)
        self.world.set_state(chosen, "parked", serving=False, routable=False)

    def rebalance_requests(self) -> None:
        """Clear sticky routing, abort in-flight samples on all routable replicas, re-route least-loaded."""
        self.world.abort([r for r in self.world.replicas if r.routable])
        self._spend("hybrid_switching", self.costs.rebalance_s, "rebalance_requests")
