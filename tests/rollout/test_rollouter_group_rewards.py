"""The rollouter with a group scorer (one awaited call per finished group) and a checkpointable prompt stream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue, MessageQueueClosed
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.rollout.sample import Sample
from tests.rollout.fakes import FakeReplica, char_tokenize, wait_for


class CountingStream:
    """Prompts ``p0000``... with their index; checkpointable: its state is the next index."""

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


class Scorer:
    """Scores a group by its prompt index (every sample the same), recording the thread and the group size."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.threads: set[str] = set()
        self.delay, self.fail = delay, fail

    async def score_group(self, samples: Sequence[Sample]) -> list[float]:
        def work() -> list[float]:
            self.threads.add(threading.current_thread().name)
            if self.fail:
                raise ValueError("reward function 'acc' failed on prompt 0")
            return [float(s.metadata["index"]) for s in samples]

        self.calls.append((samples[0].group_id, len(samples)))
        if self.delay:
            await asyncio.sleep(self.delay)
        return await asyncio.get_running_loop().run_in_executor(None, work)


def make(stream: Any, scorer: Any, replica: FakeReplica, n: int = 3) -> tuple[Rollouter, MessageQueue]:
    queue = MessageQueue(maxsize=12)
    ro = Rollouter(
        stream,
        char_tokenize,
        scorer,
        queue,
        sampling=SamplingSpec(max_tokens=6),
        replicas=[replica],
        n_samples_per_prompt=n,
        max_required_samples=12,
        concurrent_samples_per_replica=6,
    )
    return ro, queue


def test_a_group_scorer_is_awaited_once_per_group_off_the_loop_and_sets_every_reward():
    scorer = Scorer()
    ro, queue = make(CountingStream(), scorer, FakeReplica("a", token_latency=(0.0, 0.001), seed=1))
    with ro:
        got = queue.get_batch(12, timeout=10)
    groups = {s.group_id for s in got}
    assert len(groups) == 4
    delivered = [c for c in scorer.calls if c[0] in groups]
    assert sorted(delivered) == sorted((g, 3) for g in groups)  # once per group, the whole group at once
    assert all(s.reward == float(s.metadata["index"]) for s in got)
    assert "lhr-rollouter" not in " ".join(scorer.threads) and scorer.threads  # the executor's threads


def test_a_failing_group_scorer_stops_the_rollouter_with_its_error():
    ro, queue = make(CountingStream(), Scorer(fail=True), FakeReplica("a"))
    with ro, pytest.raises(MessageQueueClosed) as info:
        queue.get_batch(3, timeout=10)
    assert "failed on prompt 0" in str(info.value.__cause__)


def test_the_prompt_streams_position_is_checkpointed_with_the_groups_it_produced():
    """Resumed from a state taken mid-run, the prompts delivered before it, the pending groups and the stream's
    continuation cover the stream's first prompts exactly once: none repeated, none skipped."""
    fake = FakeReplica("a", token_latency=(0.002, 0.004), seed=3)
    stream = CountingStream()
    ro, queue = make(stream, Scorer(delay=0.01), fake)
    ro.start()
    first = queue.get_batch(6, timeout=10)
    wait_for(fake.has_partial_request)
    ro.stop()
    state = ro.state_dict()
    assert state["prompts"] == {"next_index": stream.next_index}
    assert state["pending_groups"]

    stream2 = CountingStream()
    ro2, queue2 = make(stream2, Scorer(), FakeReplica("b", token_latency=(0.0, 0.001)))
    ro2.load_state_dict(state)
    assert stream2.next_index == stream.next_index
    got = list(first)

    def contiguous() -> bool:  # groups finish out of order: the last ones may be delivered before a pending one
        seen = {s.metadata["index"] for s in got}
        return seen == set(range(len(seen)))

    with ro2:
        while len(got) < 60 or (not contiguous() and len(got) < 300):  # a skipped prompt never closes the gap
            got.extend(queue2.get_batch(3, timeout=10))
            ro2.reset_staleness()
    indices = sorted({s.metadata["index"] for s in got})
    assert [len([s for s in got if s.metadata["index"] == i]) for i in indices] == [3] * len(indices)
    assert indices == list(range(len(indices)))  # no prompt skipped, none repeated
