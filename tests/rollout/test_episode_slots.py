"""An episode in its tool turn holds no engine request: it leaves the in-flight cap for that turn (other episodes are
admitted and decode meanwhile), takes a slot again before its next model turn, and the staleness budget still bounds
the admitted samples exactly."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from tests.rollout.fakes import FakeReplica, char_tokenize, wait_for

TURN = 2  # tokens per model turn


class HeldTools:
    """An ``EpisodeRunner`` of two-turn episodes whose tool (after the first turn) answers once :attr:`open` is set."""

    def __init__(self) -> None:
        self.open = False
        self.waiting = 0
        self._turn_start: dict[str, int] = {}

    async def begin(self, st: Any, group: Any) -> None:
        self._turn_start.setdefault(st.uid, len(st.tokens))

    def turn_limit(self, st: Any) -> int:
        return max(0, self._turn_start[st.uid] + TURN - len(st.tokens))

    async def after_turn(self, st: Any, reason: str) -> str | None:
        if len(st.tokens) >= 2 * TURN:
            return "stop"
        self.waiting += 1
        while not self.open:  # the tool's wait (polled: the test opens it from its own thread)
            await asyncio.sleep(0.002)
        self.waiting -= 1
        self._turn_start[st.uid] = len(st.tokens)
        return None


def test_episodes_waiting_on_tools_free_their_slots_and_the_staleness_budget_still_bounds_admission() -> None:
    cap, max_required = 2, 8
    replica = FakeReplica("r0", token_latency=(0.0005, 0.001))
    tools = HeldTools()
    queue = MessageQueue(maxsize=max_required)
    ro = Rollouter(
        [f"p{i:04d}" for i in range(100)],
        char_tokenize,
        lambda sample: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=2 * TURN),
        replicas=[replica],
        max_required_samples=max_required,
        concurrent_samples_per_replica=cap,
        episodes=tools,
    )
    with ro:
        # every admitted episode waits on its tool, holding no slot: 4x the cap are admitted, up to the budget
        wait_for(lambda: tools.waiting == max_required)
        time.sleep(0.05)
        assert (ro.episodes_in_tools, ro.in_flight) == (max_required, 0)
        assert ro.counters()["total_admitted_samples"] == max_required  # the staleness budget, never more
        tools.open = True
        batch = queue.get_batch(max_required, timeout=10)
        assert len(batch) == max_required and all(len(s.response_token_ids) == 2 * TURN for s in batch)
        assert (ro.episodes_in_tools, ro.in_flight, ro.counters()["total_admitted_samples"]) == (0, 0, max_required)
        ro.reset_staleness()  # a new parameter version: the next budget's episodes are admitted
        wait_for(lambda: ro.counters()["total_admitted_samples"] == 2 * max_required)
        assert len(queue.get_batch(max_required, timeout=10)) == max_required
        time.sleep(0.05)
        assert ro.counters()["total_admitted_samples"] == 2 * max_required
    assert replica.max_in_flight <= cap  # the episodes back from their tools decoded within the cap
