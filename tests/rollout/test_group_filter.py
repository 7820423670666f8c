"""Dynamic sampling in the rollouter: dropped groups never reach the queue, new prompts refill them, the per-version
cap lets groups through with one warning, and a checkpoint keeps every prompt exactly once."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.group_filter import GroupFilter, rewards_vary
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.rollout.sample import Sample
from tests.rollout.fakes import FakeReplica, char_tokenize, wait_for

N = 3  # samples per prompt


class Stream:
    """Prompts ``p0000``... with their index; checkpointable (its state is the next index)."""

    def __init__(self) -> None:
        self.next_index = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            i = self.next_index
            self.next_index += 1
            yield {"prompt": f"p{i:04d}", "index": i}

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.next_index = int(state["next_index"])


def solved(index: int) -> bool:
    """Two prompts of three are "solved": every sample of their group gets the same reward."""
    return index % 3 != 0


def reward(sample: Sample) -> float:
    """1.0 for a solved prompt's samples; the sample's position in its group otherwise (rewards that vary)."""
    return 1.0 if solved(sample.metadata["index"]) else float(sample.uid.rsplit("-", 1)[-1])


class Recording:
    """:func:`rewards_vary`, recording the prompt index of every group it is asked about and of those it drops."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.dropped: list[int] = []

    def __call__(self, samples: Sequence[Sample]) -> bool:
        keep = rewards_vary(samples)
        self.seen.append(samples[0].metadata["index"])
        if not keep:
            self.dropped.append(samples[0].metadata["index"])
        return keep


def make(replica: FakeReplica, keep: Any = rewards_vary, cap: int | None = None, stream: Any = None) -> Rollouter:
    queue = MessageQueue(maxsize=12)
    return Rollouter(
        stream if stream is not None else Stream(),
        char_tokenize,
        reward,
        queue,
        sampling=SamplingSpec(max_tokens=4),
        replicas=[replica],
        n_samples_per_prompt=N,
        max_required_samples=12,
        concurrent_samples_per_replica=6,
        group_filter=keep,
        max_filtered_samples=cap,
    )


def fast(seed: int = 0) -> FakeReplica:
    return FakeReplica("a", token_latency=(0.0, 0.001), seed=seed)


def test_all_equal_groups_never_reach_the_queue_and_new_prompts_take_their_place() -> None:
    keep = Recording()
    ro = make(fast(), keep)
    with ro:
        # the staleness budget (12) admits 4 groups; without the refill 3 of them would be dropped and it would stall
        got = ro.message_queue.get_batch(12, timeout=10)
        stats = ro.reset_staleness()
    indices = {s.metadata["index"] for s in got}
    assert indices == {0, 3, 6, 9}, indices  # the four unsolved prompts, nothing solved
    assert len(got) == 12 and all(not solved(s.metadata["index"]) for s in got)
    assert set(keep.dropped) >= {1, 2, 4, 5, 7, 8} and all(solved(i) for i in keep.dropped)
    counters = ro.counters()
    assert counters["total_filtered_groups"] == len(keep.dropped)
    assert counters["total_filtered_samples"] == N * len(keep.dropped)
    assert ro.outstanding_samples == (
        counters["total_admitted_samples"] - counters["total_delivered_samples"] - counters["total_filtered_samples"]
    )
    window = stats.filtering
    assert window.filtered_groups == len(keep.dropped) and window.finished_groups == len(keep.seen)
    assert window.filtered_fraction == len(keep.dropped) / len(keep.seen)
    assert 0.0 < window.accepted_token_share < 1.0


def test_the_cap_warns_once_per_version_and_lets_groups_through(caplog: Any) -> None:
    ro = make(fast(1), cap=2 * N)  # two groups dropped per parameter version, no more
    caplog.set_level(logging.WARNING, logger="lightning_hybrid_rollout.rollout.group_filter")
    with ro:
        got = ro.message_queue.get_batch(12, timeout=10)
        first = ro.reset_staleness().filtering
        wait_for(lambda: ro.total_filtered_groups >= 4)  # a new version: the cap starts again
        second = ro.reset_staleness().filtering
    assert first.filtered_groups == 2 and first.passed_over_cap >= 1
    assert any(solved(s.metadata["index"]) for s in got)  # past the cap, solved groups reach the queue
    assert second.filtered_groups >= 2
    warnings = [r for r in caplog.records if "refill cap" in r.getMessage()]
    assert 1 <= len(warnings) <= 2  # at most one per version
    assert "max_num_gen_batches" in warnings[0].getMessage()


def test_a_group_filter_counts_finished_groups_and_tokens() -> None:
    f = GroupFilter(rewards_vary, max_filtered_samples=None)
    same = [Sample(f"g-{i}", "g", "p", [1], [5, 6], [0.0, 0.0], reward=1.0) for i in range(2)]
    varied = [Sample(f"h-{i}", "h", "p", [1], [5], [0.0], reward=float(i)) for i in range(2)]
    assert f.drops(same) and not f.drops(varied)
    window = f.close_window()
    assert (window.finished_groups, window.filtered_groups, window.filtered_tokens) == (2, 1, 4)
    assert window.filtered_fraction == 0.5 and window.accepted_token_share == 2 / 6
    assert f.close_window().finished_groups == 0


def test_a_checkpoint_keeps_every_prompt_exactly_once_with_dropped_groups() -> None:
    """Resumed from a state taken mid-run, the delivered and the dropped groups of both runs cover the stream's
    first prompts exactly once: a dropped prompt is consumed (not replayed), its refill is the next prompt."""
    keep1, keep2 = Recording(), Recording()
    replica = FakeReplica("a", token_latency=(0.002, 0.004), seed=3)
    stream = Stream()
    ro = make(replica, keep1, stream=stream)
    ro.start()
    got = list(ro.message_queue.get_batch(6, timeout=10))
    wait_for(replica.has_partial_request)
    ro.stop()
    state = ro.state_dict()
    pending = {g["metadata"]["index"] for g in state["pending_groups"]}
    assert keep1.dropped and not pending & set(keep1.dropped)

    stream2 = Stream()
    ro2 = make(FakeReplica("b", token_latency=(0.0, 0.001)), keep2, stream=stream2)
    ro2.load_state_dict(state)
    assert ro2.counters()["total_filtered_samples"] == N * len(keep1.dropped)
    assert stream2.next_index == stream.next_index

    def covered() -> list[int]:
        return sorted([s.metadata["index"] for s in got][::N] + keep1.dropped + keep2.dropped)

    with ro2:
        while len(got) < 36 or covered() != list(range(len(covered()))):  # a skipped prompt never closes the gap
            got.extend(ro2.message_queue.get_batch(N, timeout=10))
            ro2.reset_staleness()
            assert len(got) < 600
    delivered = [s.metadata["index"] for s in got]
    assert all(delivered.count(i) == N for i in set(delivered))  # whole groups, each once
    assert not set(delivered) & set(keep1.dropped + keep2.dropped)  # nothing dropped was delivered
    dropped = keep1.dropped + keep2.dropped
    assert len(dropped) == len(set(dropped))  # nothing dropped twice
    assert covered() == list(range(len(covered())))  # no prompt skipped, none repeated
