"""LoadBalancer: sticky + least-loaded routing, LRU bound, removed/dead replicas, abort, waiting for a replica."""

from __future__ import annotations

import asyncio

import pytest

from lightning_hybrid_rollout.errors import ReplicaDeadError
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.load_balancer import (
    LoadBalancer,
    NoReplicaAvailableError,
    ReplicaLike,
    is_replica_dead_error,
)
from tests.rollout.fakes import FakeReplica


def run(coro):
    return asyncio.run(coro)


def test_fake_satisfies_protocol():
    assert isinstance(FakeReplica("a"), ReplicaLike)


def test_least_loaded_with_stable_tie_break():
    async def main():
        lb = LoadBalancer([FakeReplica("a"), FakeReplica("b"), FakeReplica("c")])
        picked = [(await lb.acquire(f"r{i}")).replica_id for i in range(6)]
        assert picked == ["a", "b", "c", "a", "b", "c"]
        lb.release("b", "r1")
        lb.release("b", "r4")
        assert (await lb.acquire("r6")).replica_id == "b"
        assert lb.in_flight_counts() == {"a": 2, "b": 1, "c": 2}
        assert lb.total_in_flight == 5

    run(main())


def test_sticky_routing_by_key_even_when_loaded():
    async def main():
        lb = LoadBalancer([FakeReplica("a"), FakeReplica("b")])
        first = await lb.acquire("uid-1:0", sticky_key="uid-1")
        lb.release(first.replica_id, "uid-1:0")
        for i in range(3):  # load the sticky replica more than the other
            await lb.acquire(f"x{i}", sticky_key=None)
        again = await lb.acquire("uid-1:1", sticky_key="uid-1")
        assert again.replica_id == first.replica_id
        lb.clear_sticky_cache()
        assert lb.sticky_cache_size == 0

    run(main())


def test_sticky_cache_is_bounded_lru():
    async def main():
        lb = LoadBalancer([FakeReplica("a"), FakeReplica("b")], sticky_capacity=3)
        for i in range(3):
            r = await lb.acquire(f"k{i}")
            lb.release(r.replica_id, f"k{i}")
        # touch k0 so k1 is the least recently used
        r = await lb.acquire("k0-again", sticky_key="k0")
        lb.release(r.replica_id, "k0-again")
        r = await lb.acquire("k3")
        lb.release(r.replica_id, "k3")
        assert lb.sticky_cache_size == 3
        assert list(lb._sticky) == ["k2", "k0", "k3"]

    run(main())


def test_removed_and_dead_replicas_never_routed_and_sticky_falls_back():
    async def main():
        a, b, c = FakeReplica("a"), FakeReplica("b"), FakeReplica("c")
        lb = LoadBalancer([a, b, c])
        r = await lb.acquire("s:0", sticky_key="s")
        assert r.replica_id == "a"
        lb.remove_replicas(["a"])
        lb.mark_dead("b")
        assert lb.active_server_count() == 1
        for i in range(20):
            assert (await lb.acquire(f"q{i}", sticky_key="s")).replica_id == "c"
        assert lb.in_flight("a") == 1  # the old request still counted until released
        lb.release("a", "s:0")
        assert lb.in_flight("a") == 0
        # a handle reporting is_alive=False is skipped (and marked dead); with "a" only removed, acquire waits
        c.is_alive = False
        waiter = asyncio.create_task(lb.acquire("back", timeout=0.05))
        await asyncio.sleep(0.1)
        assert not waiter.done() and lb.replica_state("c") == "dead"
        lb.add_replicas([a])  # re-adding a removed replica makes it routable again
        assert (await waiter).replica_id == "a"
        # all dead: the wait times out with the replicas named
        lb.mark_dead("a")
        with pytest.raises(NoReplicaAvailableError, match=r"a=dead, b=dead, c=dead/not-alive"):
            await lb.acquire("none", timeout=0.05)

    run(main())


def test_acquire_waits_until_a_replica_is_added_or_resumed():
    async def main():
        lb = LoadBalancer([], acquire_timeout_s=5.0)
        with pytest.raises(NoReplicaAvailableError, match="none registered"):
            await lb.acquire("r0", timeout=0.01)
        waiter = asyncio.create_task(lb.acquire("r"))
        await asyncio.sleep(0.02)
        assert not waiter.done()
        lb.add_replicas([FakeReplica("a")], paused=True)
        await asyncio.sleep(0.02)
        assert not waiter.done()  # paused replicas are not routable
        lb.resume_replicas(["a"])
        assert (await asyncio.wait_for(waiter, 1.0)).replica_id == "a"

    run(main())


def test_abort_replicas_aborts_only_those_and_waits_for_release():
    async def main():
        a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
        lb = LoadBalancer([a, b])
        spec = SamplingSpec(max_tokens=4)

        async def one(i: int):
            rid = f"r{i}"
            replica = await lb.acquire(rid)
            try:
                return await replica.generate(rid, [1, 2], spec)
            finally:
                lb.release(replica.replica_id, rid)

        tasks = [asyncio.create_task(one(i)) for i in range(6)]
        await asyncio.sleep(0.02)
        assert lb.in_flight_counts() == {"a": 3, "b": 3}
        lb.remove_replicas(["a"])
        n = await lb.abort_replicas(["a"], timeout=2.0)
        assert n == 3
        assert lb.in_flight("a") == 0 and lb.in_flight("b") == 3
        assert sorted(a.abort_requests) == ["r0", "r2", "r4"]
        assert not b.abort_requests
        b.release_all()
        results = await asyncio.gather(*tasks)
        assert [r.finish_reason for r in results] == ["abort", "length"] * 3

    run(main())


def test_abort_marks_a_dead_replica_and_times_out_with_names():
    async def main():
        a = FakeReplica("a", hold=True)
        lb = LoadBalancer([a])
        await lb.acquire("stuck")  # never released by a caller
        with pytest.raises(TimeoutError, match="stuck"):
            await lb.abort_replicas(["a"], timeout=0.1)
        a.kill()
        await lb.abort_replicas(["a"], wait=False)
        assert lb.replica_state("a") == "dead"

    run(main())


def test_duplicate_in_flight_request_id_is_rejected_and_unknown_replica_named():
    async def main():
        lb = LoadBalancer([FakeReplica("a")])
        await lb.acquire("dup")
        with pytest.raises(ValueError, match="fresh id"):
            await lb.acquire("dup")
        with pytest.raises(KeyError, match="unknown replica id 'zz'"):
            lb.remove_replicas(["zz"])

    run(main())


def test_a_dead_replica_is_recognised_by_its_type_not_its_name():
    assert is_replica_dead_error(ReplicaDeadError("x"))
    assert not is_replica_dead_error(RuntimeError("x"))
    impostor = type("ReplicaDeadError", (RuntimeError,), {})  # same name, another class: not a dead replica
    assert not is_replica_dead_error(impostor("x"))


def test_pool_listener_fires_on_changes():
    calls = []
    lb = LoadBalancer([FakeReplica("a")])
    lb.add_listener(lambda: calls.append(lb.active_server_count()))
    lb.add_replicas([FakeReplica("b")])
    lb.remove_replicas(["a"])
    lb.mark_dead("b")
    assert calls == [2, 1, 0]
