"""One replica call per prompt group: the rollouter sends a group's samples together and settles each on its own."""

from __future__ import annotations

import asyncio
import contextlib

from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec, generate_group
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from tests.rollout.fakes import FakeReplica, char_tokenize, wait_for


class GroupFake(FakeReplica):
    """A fake replica that serves ``generate_group`` (one call per group) and records every call's request ids."""

    def __init__(self, *args, fail: set[str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group_calls: list[list[str]] = []
        self.seeds: dict[str, int | None] = {}
        self.fail = fail if fail is not None else set()

    async def generate_group(self, requests):
        self.group_calls.append([rid for rid, _, _ in requests])
        self.seeds.update({rid: spec.seed for rid, _, spec in requests})

        async def one(rid, ids, spec):
            if rid in self.fail:
                self.fail.discard(rid)
                raise RuntimeError(f"engine error on {rid}")
            return await self.generate(rid, ids, spec)

        return await asyncio.gather(*(one(*req) for req in requests), return_exceptions=True)


def make(replicas, *, n_prompts, n, per_replica, max_tokens=6):
    total = n_prompts * n
    queue = MessageQueue(maxsize=total)
    ro = Rollouter(
        [f"p{i:04d}" for i in range(n_prompts)],
        char_tokenize,
        lambda s: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=max_tokens, seed=7),
        replicas=replicas,
        n_samples_per_prompt=n,
        max_required_samples=total,
        concurrent_samples_per_replica=per_replica,
    )
    return ro, queue


def group_of(request_id: str) -> str:
    return request_id.split("-")[0]


def test_a_groups_samples_go_to_one_replica_in_one_call_each_with_its_own_seed():
    a, b = GroupFake("a", token_latency=(0.0, 0.001)), GroupFake("b", token_latency=(0.0, 0.001), seed=1)
    ro, queue = make([a, b], n_prompts=8, n=4, per_replica=8)
    with ro:
        got = queue.get_batch(32, timeout=10)
    calls = a.group_calls + b.group_calls
    assert len(calls) == 8  # one call per group, nothing aborted
    for call in calls:
        assert len(call) == 4 and len({group_of(rid) for rid in call}) == 1
    assert len(a.calls) + len(b.calls) == 32
    assert sorted(s.uid for s in got) == sorted(f"g{g}-{k}" for g in range(8) for k in range(4))
    seeds = {**a.seeds, **b.seeds}
    assert all(seeds[f"g{g}-{k}:0"] == 7 + 4 * g + k for g in range(8) for k in range(4))  # seed + g*n + k


def test_the_in_flight_cap_splits_a_group_and_is_never_exceeded():
    a = GroupFake("a", token_latency=(0.0, 0.001))
    ro, queue = make([a], n_prompts=6, n=4, per_replica=3)
    with ro:
        queue.get_batch(24, timeout=10)
    assert a.max_in_flight <= 3
    assert max(len(c) for c in a.group_calls) == 3 and min(len(c) for c in a.group_calls) >= 1


def test_aborted_samples_of_a_group_continue_together_from_their_prefixes():
    a = GroupFake("a", hold=True)
    b = GroupFake("b", token_latency=(0.0, 0.001))
    ro, queue = make([a], n_prompts=1, n=4, per_replica=4)
    ro.start()
    try:
        wait_for(lambda: a.in_flight == 4)
        ro.add_replicas([b])
        ro.remove_replicas(["a"])
        assert ro.abort_replicas(["a"]) == 4
        got = queue.get_batch(4, timeout=10)
    finally:
        ro.stop()
    assert a.group_calls == [[f"g0-{k}:0" for k in range(4)]]
    assert b.group_calls == [[f"g0-{k}:1" for k in range(4)]]  # the group's retries: one call
    assert all(s.replica_ids == ["b"] for s in got)


def test_one_failing_request_is_retried_alone_while_its_group_finishes():
    a = GroupFake("a", token_latency=(0.0, 0.001), fail={"g0-2:0"})
    ro, queue = make([a], n_prompts=1, n=4, per_replica=4)
    with ro:
        got = queue.get_batch(4, timeout=10)
        counters = ro.counters()
    assert a.group_calls == [[f"g0-{k}:0" for k in range(4)], ["g0-2:1"]]
    assert counters["failed_segments"] == 1
    assert sorted(s.uid for s in got) == [f"g0-{k}" for k in range(4)]
    assert all(s.response_length == 6 for s in got)


def test_generate_group_without_the_method_awaits_each_request_and_keeps_errors_per_request():
    log: list[str] = []

    class Plain:
        """Each good request waits (at most 2 s) until both good ones have started: at once only if concurrent."""

        def __init__(self) -> None:
            self.both_started = asyncio.Event()

        async def generate(self, rid, ids, spec):
            if rid == "bad":
                raise ValueError("bad request")
            log.append(f"start {rid}")
            if log.count("start x") + log.count("start y") == 2:
                self.both_started.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.both_started.wait(), 2.0)
            log.append(f"end {rid}")
            return GenerationResult(rid, [1] * spec.max_tokens, [0.0] * spec.max_tokens, "length", 3)

    async def main():
        return await generate_group(Plain(), [("x", [1], spec), ("bad", [1], spec), ("y", [1], spec)])

    spec = SamplingSpec(max_tokens=2)
    out = asyncio.run(main())
    assert log[:2] == ["start x", "start y"] and sorted(log[2:]) == ["end x", "end y"], log  # awaited together
    assert [o.request_id for o in (out[0], out[2])] == ["x", "y"] and isinstance(out[1], ValueError)


def test_a_group_waits_for_room_for_all_its_samples_instead_of_going_out_in_parts():
    """A retry leaves the in-flight count off a multiple of the group size; the next groups still go in one call
    each (parts would finish at their own times and split every later group too)."""
    a = GroupFake("a", token_latency=(0.0, 0.001), fail={"g0-2:0"})
    ro, queue = make([a], n_prompts=4, n=4, per_replica=4)
    with ro:
        got = queue.get_batch(16, timeout=10)
        calls = ro.counters()["replica_calls"]
    assert calls == len(a.group_calls) == 5  # 4 groups and the one retry
    first_segments = [call for call in a.group_calls if call[0].endswith(":0")]
    assert [len(call) for call in first_segments] == [4, 4, 4, 4]
    assert a.max_in_flight <= 4
    assert sorted(s.uid for s in got) == sorted(f"g{g}-{k}" for g in range(4) for k in range(4))
