"""The controller's replica pool on the simulator's virtual clock (the runtime's: ``HybridReplicaPool``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_hybrid_rollout.sim.scenario import Scenario
from lightning_hybrid_rollout.sim.world import RolloutWorld, SimReplica

__all__ = ["SimReplicaPool"]


class SimReplicaPool:
    """The controller's :class:`~lightning_hybrid_rollout.schedule.ReplicaPool`, on the virtual clock.

    Each method changes the hybrid replicas' state in the world and advances the clock by its cost (the trainer is
    blocked meanwhile; standalone replicas keep generating), charging the trainer-timeline bucket it belongs to.

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
        self._charge = charge
        #: Param version the hybrid replicas hold (-1: none; they start asleep without weights).
        self.synced_version = -1

    @property
    def replicas(self) -> list[SimReplica]:
        """The hybrid replicas."""
        return self.world.hybrid

    def _spend(self, bucket: str, seconds: float, op: str) -> None:
        w = self.world
        t0 = w.now
        w.advance_to(t0 + seconds)
        if bucket == "weight_sync_hybrid":
            self._charge(bucket, w.now - t0, "weight_sync", {"op": op, "target": "hybrid"})
        else:
            self._charge(bucket, w.now - t0, "switching", {"op": op})

    def wake_up_replicas(self) -> None:
        """Weights, then KV cache back on the trainer's devices (a no-op if already awake)."""
        if all(r.awake for r in self.replicas):
            return
        self.world.set_state(self.replicas, "switching", serving=False, routable=False)
        self._spend("hybrid_switching", self.costs.wake_s, "wake_up_replicas")
        for r in self.replicas:
            r.awake = True

    def sync_weights(self) -> None:
        """Push the trainer's weights to the hybrid replicas (a no-op if they already hold this version)."""
        if self.synced_version == self.world.version:
            return
        self.synced_version = self.world.version
        self.world.set_state(self.replicas, "syncing", serving=False)
        self._spend("weight_sync_hybrid", self.costs.hybrid_sync_s, "sync_weights")

    def add_replicas(self) -> None:
        """Register the hybrid replicas in the load balancer (routable once resumed)."""
        self._spend("hybrid_switching", self.costs.add_s, "add_replicas")

    def resume_generation_replicas(self) -> None:
        """The hybrid replicas accept requests."""
        self.world.set_state(self.replicas, "active", serving=True, routable=True)
        self._spend("hybrid_switching", self.costs.resume_s, "resume_generation_replicas")

    def remove_replicas(self) -> None:
        """Cut routing to the hybrid replicas (their in-flight samples keep decoding until aborted)."""
        self.world.set_state(
            self.replicas,
            self.replicas[0].state if self.replicas else "active",
            serving=any(r.serving for r in self.replicas),
            routable=False,
        )
        self._spend("hybrid_switching", self.costs.remove_s, "remove_replicas")

    def abort_replicas(self) -> None:
        """Abort their in-flight samples; partial-rollout retries go to the routable (standalone) replicas."""
        self.world.abort(self.replicas)
        self._spend("hybrid_switching", self.costs.abort_s, "abort_replicas")

    def sleep_replicas(self) -> None:
        """Release KV cache and offload weights: the devices return to the trainer."""
        self.world.abort([r for r in self.replicas if r.members])  # nothing may keep decoding on a sleeping engine
        self.world.set_state(self.replicas, "switching", serving=False, routable=False)
        self._spend("hybrid_switching", self.costs.sleep_s, "sleep_replicas")
        for r in self.replicas:
            r.awake = False
        self.synced_version = -1  # sleeping engines drop their weights
        self.world.set_state(self.replicas, "parked", serving=False, routable=False)

    def rebalance_requests(self) -> None:
        """Clear sticky routing, abort in-flight samples on all routable replicas, re-route least-loaded."""
        self.world.abort([r for r in self.world.replicas if r.routable])
        self._spend("hybrid_switching", self.costs.rebalance_s, "rebalance_requests")
