"""ReplicaSupervisor on fake replicas: which replicas count as failed, and how replacements start, join or are given up.

The end-to-end proof with real engines killed by ``kill -9`` is ``tests/lightning/test_replica_failures.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ReplicaDeadError
from lightning_hybrid_rollout.rollout.replica_supervisor import ReplicaSupervisor


@dataclasses.dataclass
class Spec:
    replica_id: str
    role: str = "standalone"
    cpu_ids: tuple[int, ...] = (1,)
    generation: int = 0


class FakeReplica:
    def __init__(self, spec: Spec, health: str = "ok") -> None:
        self.spec = spec
        self.replica_id = spec.replica_id
        self.role = spec.role
        self.health_mode = health
        self.killed = False
        self.info: dict[str, Any] = {"frontend_pid": 1}

    @property
    def is_alive(self) -> bool:
        return not self.killed and self.health_mode != "dead-known"

    async def health(self) -> dict[str, Any]:
        if self.health_mode == "hang":
            await asyncio.sleep(60)
        if self.health_mode == "dead":
            raise ReplicaDeadError(self.replica_id, "actor died")
        if self.health_mode == "broken":
            raise RuntimeError("EngineDeadError: engine core exited")
        return {}

    def kill(self) -> None:
        self.killed = True


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_find_failed_names_dead_hung_and_broken_replicas_and_kills_the_hung_and_broken_ones() -> None:
    sup = ReplicaSupervisor(lambda spec: asyncio.sleep(0), health_timeout_s=0.05)
    ok, known, dead, hung, broken = (
        FakeReplica(Spec("s-0")),
        FakeReplica(Spec("s-1"), "dead-known"),
        FakeReplica(Spec("s-2"), "dead"),
        FakeReplica(Spec("s-3"), "hang"),
        FakeReplica(Spec("s-4"), "broken"),
    )

    async def go() -> tuple[list[Any], list[Any]]:
        quick = await sup.find_failed([ok, known, dead, hung, broken], probe=False)
        probed = await sup.find_failed([ok, known, dead, hung, broken], probe=True)
        return quick, probed

    quick, probed = run(go())
    assert [r.replica_id for r, _ in quick] == ["s-1"]  # without a probe only what is already known
    why = {r.replica_id: w for r, w in probed}
    assert set(why) == {"s-1", "s-2", "s-3", "s-4"}
    assert "no health answer within 0.05s" in why["s-3"] and hung.killed
    assert "EngineDeadError" in why["s-4"] and broken.killed
    assert not ok.killed


def test_a_replacement_keeps_the_spec_counts_its_generation_and_joins_once_up() -> None:
    started: list[Spec] = []

    async def start(spec: Spec) -> FakeReplica:
        started.append(spec)
        return FakeReplica(spec)

    async def go() -> list[Any]:
        sup = ReplicaSupervisor(start, max_restarts=2)
        dead = FakeReplica(Spec("hybrid-0", role="hybrid", cpu_ids=(0,)))
        sup.replace(dead, "its actor died")
        assert dead.killed and sup.starting == ["hybrid-0"]
        sup.replace(dead, "its actor died")  # already starting: nothing more
        await sup.wait_any(1.0)
        ready = sup.take_ready()
        for r in ready:
            sup.joined(r)
        assert sup.restarts == 1 and sup.starting == []
        return ready

    ready = run(go())
    assert len(started) == 1
    assert started[0] == Spec("hybrid-0", role="hybrid", cpu_ids=(0,), generation=1)
    assert [r.spec.generation for r in ready] == [1]


def test_replicas_dying_while_another_replacement_starts_are_each_replaced_and_counted() -> None:
    gates: dict[str, asyncio.Event] = {}

    async def start(spec: Spec) -> FakeReplica:
        gates[spec.replica_id] = asyncio.Event()
        await gates[spec.replica_id].wait()  # "starting" until the test lets it up
        return FakeReplica(spec)

    async def go() -> ReplicaSupervisor:
        sup = ReplicaSupervisor(start)
        sup.replace(FakeReplica(Spec("standalone-0")), "its actor died")
        await asyncio.sleep(0)
        assert sup.launching == ["standalone-0"]
        sup.replace(FakeReplica(Spec("hybrid-0", role="hybrid")), "its actor died")  # the first is still starting
        await asyncio.sleep(0)
        assert sup.launching == ["hybrid-0", "standalone-0"]
        gates["hybrid-0"].set()  # the later one comes up first
        await sup.wait_any(1.0)
        assert sup.launching == ["standalone-0"] and sup.starting == ["hybrid-0", "standalone-0"]
        joined = sup.take_ready()
        gates["standalone-0"].set()
        await sup.wait_any(1.0)
        joined += sup.take_ready()
        for replica in joined:
            sup.joined(replica)
        assert sorted(r.replica_id for r in joined) == ["hybrid-0", "standalone-0"]
        return sup

    sup = run(go())
    assert sup.restarts == 2 and sup.starting == [] and sup.launching == []
    assert [e.kind for e in sup.events].count("restarted") == 2


def test_failed_starts_are_retried_then_the_slot_is_abandoned() -> None:
    attempts: list[int] = []

    async def start(spec: Spec) -> FakeReplica:
        attempts.append(spec.generation)
        raise RuntimeError("no CPU left")

    async def go() -> ReplicaSupervisor:
        sup = ReplicaSupervisor(start, max_restarts=2)
        sup.replace(FakeReplica(Spec("standalone-0")), "its actor died")
        for _ in range(5):
            await sup.wait_any(1.0)
            assert sup.take_ready() == []
        return sup

    sup = run(go())
    assert attempts == [1, 2]  # each try a new actor generation, max_restarts tries in a row
    assert sup.abandoned == {"standalone-0"} and sup.starting == [] and sup.restarts == 0
    kinds = [e.kind for e in sup.events]
    assert kinds == ["dead", "restarting", "start_failed", "restarting", "start_failed", "abandoned"]


def test_a_replacement_whose_weight_sync_fails_is_killed_and_tried_again() -> None:
    async def start(spec: Spec) -> FakeReplica:
        return FakeReplica(spec)

    async def go() -> ReplicaSupervisor:
        sup = ReplicaSupervisor(start, max_restarts=3)
        sup.replace(FakeReplica(Spec("standalone-0")), "its actor died")
        await sup.wait_any(1.0)
        (first,) = sup.take_ready()
        sup.failed_to_join(first, RuntimeError("checksum mismatch"))
        assert first.killed
        await sup.wait_any(1.0)
        (second,) = sup.take_ready()
        assert second.spec.generation == 2
        sup.joined(second)
        return sup

    sup = run(go())
    assert sup.restarts == 1


@pytest.mark.parametrize("max_restarts", [0])
def test_max_restarts_zero_never_replaces(max_restarts: int) -> None:
    async def go() -> ReplicaSupervisor:
        sup = ReplicaSupervisor(lambda spec: asyncio.sleep(0), max_restarts=max_restarts)
        sup.replace(FakeReplica(Spec("standalone-0")), "its actor died")
        return sup

    sup = run(go())
    assert sup.abandoned == {"standalone-0"} and sup.starting == []


def test_a_replacement_that_dies_while_waiting_to_join_is_started_again_and_counted_once_it_joins() -> None:
    """RolloutRuntime.supervise: a replacement up but deferred (no weights of this version yet) that dies there
    leaves the joining list, counts as a failed start and is launched again; the next one joins and counts."""
    from lightning_hybrid_rollout.rollout.event_loop import EventLoopThread
    from lightning_hybrid_rollout.run.runtime import RolloutRuntime
    from lightning_hybrid_rollout.run.tracer import RunTracer

    started: list[FakeReplica] = []

    async def start(spec: Spec) -> FakeReplica:
        started.append(FakeReplica(spec))
        return started[-1]

    rt = RolloutRuntime.__new__(RolloutRuntime)
    rt.loop, rt.supervisor = EventLoopThread(), ReplicaSupervisor(start, max_restarts=3)
    rt.standalone, rt.hybrid, rt._joining, rt.rollouter, rt.tracer = [], [], [], None, RunTracer(None)
    try:
        deferred = FakeReplica(Spec("s-0", generation=1))
        rt._joining.append(deferred)  # up, waiting for weights of version 3 (none at hand)
        rt.hybrid.append(FakeReplica(Spec("h-0", role="hybrid")))
        deferred.health_mode = "dead-known"  # kill -9 while it waits
        rt.supervise(None, 3, probe=False)
        assert deferred not in rt._joining and deferred.killed
        assert [e.kind for e in rt.supervisor.events] == ["start_failed", "restarting"]
        assert started and started[-1].spec.generation == 2  # launched again (already up: deferred in turn)
        rt.loop.run(rt.supervisor.wait_any(5.0))
        rt.supervise(None, 0, probe=False)  # version 0: the weights on disk are current, it joins
        assert [r.replica_id for r in rt.standalone] == ["s-0"] and rt.standalone[0] is started[-1]
        assert rt.supervisor.restarts == 1 and started[-1].spec.generation == 2
    finally:
        rt.loop.close()
