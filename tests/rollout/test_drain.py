"""Drain-aware deactivation with fake engines: the decision, the load balancer's drain and the rollouter's.

:class:`DrainingReplica` generates one token per ``token_s`` seconds and drains through the package's own
:func:`~lightning_hybrid_rollout.rollout.drain.drain_requests` (what ``VLLMEngine.drain`` runs), so the load
balancer and the rollouter are tested against the real drain logic; ``tests/rollout/test_drain_real.py`` does the
same with real vLLM engines.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import pytest

from lightning_hybrid_rollout.rollout.drain import (
    DrainReport,
    RequestProgress,
    drain_deadline_s,
    drain_requests,
    split_by_finish,
)
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.load_balancer import LoadBalancer
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from tests.rollout.fakes import FakeReplica, char_tokenize, expected_token, wait_for

P = 5  # prompt length: prompts are "p0000"..


class DrainingReplica:
    """A fake engine: one token every ``token_s`` seconds (per request), abortable, with a real ``drain``.

    Args:
        replica_id: Id.
        token_s: Seconds per token of every request.
        stall_after: Produce no token after this many (per request): a request that slows down (the deadline case).
        arrive_s: Seconds a request takes to reach the engine (a request in transit when a drain starts).
    """

    def __init__(self, replica_id: str, token_s: float, stall_after: int | None = None, arrive_s: float = 0.0) -> None:
        self.replica_id = replica_id
        self.is_alive = True
        self.token_s = token_s
        self.stall_after = stall_after
        self.arrive_s = arrive_s
        self.progress: dict[str, RequestProgress] = {}
        self.aborted: set[str] = set()
        self.results: list[GenerationResult] = []
        self.drains: list[DrainReport] = []
        #: Each abort, in order: ``("drain", ids)`` from this engine's own drain, ``("caller", ids)`` from outside.
        self.aborts: list[tuple[str, list[str]]] = []

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        if self.arrive_s:
            await asyncio.sleep(self.arrive_s)
        prog = self.progress[request_id] = RequestProgress(sampling.max_tokens, len(prompt_token_ids))
        start, tokens, reason = len(prompt_token_ids), [], "length"
        try:
            while len(tokens) < sampling.max_tokens:
                await asyncio.sleep(self.token_s)
                if request_id in self.aborted:
                    reason = "abort"
                    break
                if self.stall_after is not None and len(tokens) >= self.stall_after:
                    continue
                tokens.append(expected_token(start + len(tokens)))
                prog.observe(len(tokens), time.monotonic())
            prog.observe(len(tokens), time.monotonic(), reason)
        finally:
            del self.progress[request_id]
        result = GenerationResult(request_id, tokens, [0.0] * len(tokens), reason, 0, self.replica_id)  # type: ignore[arg-type]
        self.results.append(result)
        return result

    async def abort(self, request_ids: list[str], by: str = "caller") -> None:
        self.aborts.append((by, list(request_ids)))
        self.aborted.update(r for r in request_ids if r in self.progress)

    async def drain(self, budget_s: float) -> DrainReport:
        async def own_abort(request_ids: list[str]) -> None:
            await self.abort(request_ids, by="drain")

        report = await drain_requests(dict(self.progress), self.progress.__contains__, own_abort, budget_s, 5.0)
        self.drains.append(report)
        return report


# ------------------------------------------------------------------------------------------------ the decision


def test_split_keeps_only_requests_whose_measured_rate_finishes_them_within_the_budget() -> None:
    near = RequestProgress(max_tokens=100, prompt_tokens=5)
    near.observe(1, 10.0)
    near.observe(91, 11.0)  # 90 tokens/s, 9 left: 0.1 s
    far = RequestProgress(max_tokens=100, prompt_tokens=5)
    far.observe(1, 10.0)
    far.observe(11, 11.0)  # 10 tokens/s, 89 left: 8.9 s
    fresh = RequestProgress(max_tokens=2, prompt_tokens=5)  # no token yet: no rate
    one = RequestProgress(max_tokens=2, prompt_tokens=5)
    one.observe(1, 10.5)  # one output: still no rate
    progress = {"near": near, "far": far, "fresh": fresh, "one": one}
    assert near.seconds_to_finish(11.0) == pytest.approx(0.1)
    assert math.isinf(fresh.seconds_to_finish(11.0)) and math.isinf(one.seconds_to_finish(11.0))
    assert split_by_finish(progress, 11.0, 0.15) == (["near"], ["far", "fresh", "one"])
    assert split_by_finish(progress, 11.0, 0.05) == ([], ["near", "far", "fresh", "one"])
    assert split_by_finish(progress, 11.0, 0.0) == ([], ["near", "far", "fresh", "one"])  # budget 0: abort all
    assert drain_deadline_s(0.0) == 0.0 and 0.15 < drain_deadline_s(0.15) < 0.25


def test_a_request_read_once_is_rated_from_its_submission_an_under_estimate_that_keeps_fewer() -> None:
    # an engine that delivers outputs only at the end: the drain reads each request's tokens once, at its start
    read_once = RequestProgress(max_tokens=100, prompt_tokens=5, submitted_s=10.0)
    read_once.observe(90, 11.0)  # 90 tokens since submission: >= 90 tokens/s, 10 left: <= 0.11 s
    unsubmitted = RequestProgress(max_tokens=100, prompt_tokens=5)
    unsubmitted.observe(90, 11.0)  # one reading, no submission time: no rate
    assert read_once.rate(11.0) == pytest.approx(90.0)
    assert read_once.seconds_to_finish(11.0) == pytest.approx(10 / 90)
    assert unsubmitted.rate(11.0) is None
    streamed = RequestProgress(max_tokens=100, prompt_tokens=5, submitted_s=0.0)
    streamed.observe(1, 10.0)
    streamed.observe(91, 11.0)  # two readings: the rate counts from the first one, not from the submission
    assert streamed.rate(11.0) == pytest.approx(90.0)
    progress = {"read_once": read_once, "unsubmitted": unsubmitted}
    assert split_by_finish(progress, 11.0, 0.15) == (["read_once"], ["unsubmitted"])


def test_report_counts_drained_aborted_and_reprefill_tokens() -> None:
    done, cut = RequestProgress(10, prompt_tokens=4), RequestProgress(50, prompt_tokens=6)
    done.observe(10, 1.0, "length")
    cut.observe(7, 1.0, "abort")
    report = DrainReport.of({"a": done, "b": cut}, seconds=0.1)
    assert (report.requests, report.drained, report.aborted) == (2, 1, 1)
    assert (report.aborted_tokens, report.reprefill_tokens) == (7, 13)
    total = report + report
    assert (total.requests, total.reprefill_tokens, total.seconds) == (4, 26, pytest.approx(0.2))


# ------------------------------------------------------------------------------------------------ load balancer


def _tokens(replica: DrainingReplica, request_id: str) -> int:
    prog = replica.progress.get(request_id)
    return 0 if prog is None else prog.tokens


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.002)


async def _start(lb: LoadBalancer, rid: str, max_tokens: int) -> asyncio.Task[GenerationResult]:
    replica = await lb.acquire(rid)

    async def run() -> GenerationResult:
        try:
            return await replica.generate(rid, [1, 2, 3], SamplingSpec(max_tokens=max_tokens))
        finally:
            lb.release(replica.replica_id, rid)

    return asyncio.create_task(run())


def test_drain_completes_the_request_that_will_finish_and_aborts_the_slow_one() -> None:
    async def go() -> None:
        hybrid = DrainingReplica("h", token_s=0.01)  # ~100 tokens/s per request (less on a loaded machine)
        lb = LoadBalancer([hybrid])
        short = await _start(lb, "short", max_tokens=20)
        long = await _start(lb, "long", max_tokens=2000)
        await _until(lambda: _tokens(hybrid, "short") >= 12)  # ~8 left (~0.1 s); long ~1990 left (~20 s)
        lb.remove_replicas(["h"])
        report = await lb.drain_replicas(["h"], 1.0)
        assert lb.in_flight("h") == 0 and not hybrid.progress  # nothing left on the replica
        assert short.done() and long.done()
        assert short.result().finish_reason == "length" and len(short.result().token_ids) == 20
        assert long.result().finish_reason == "abort" and 0 < len(long.result().token_ids) < 2000
        assert (report.requests, report.drained, report.aborted) == (2, 1, 1)
        assert report.aborted_tokens == len(long.result().token_ids)
        assert report.reprefill_tokens == 3 + len(long.result().token_ids)
        # the long one was aborted at once (it ended before the short one finished), the short one was kept
        assert [r.request_id for r in hybrid.results] == ["long", "short"]
        assert hybrid.aborts == [("drain", ["long"])]  # the drain's own abort, the short one never aborted

    asyncio.run(go())


def test_deadline_aborts_a_request_that_slows_down_after_it_was_kept() -> None:
    async def go() -> None:
        hybrid = DrainingReplica("h", token_s=0.01, stall_after=20)
        lb = LoadBalancer([hybrid])
        stalls = await _start(lb, "stalls", max_tokens=25)
        await _until(lambda: _tokens(hybrid, "stalls") >= 18)  # 7 left, predicted ~0.07 s; it stalls at 20
        lb.remove_replicas(["h"])
        t0 = time.monotonic()
        report = await lb.drain_replicas(["h"], 0.3)
        took = time.monotonic() - t0
        assert lb.in_flight("h") == 0 and not hybrid.progress
        assert stalls.result().finish_reason == "abort" and len(stalls.result().token_ids) == 20
        assert (report.drained, report.aborted) == (0, 1)
        assert took >= drain_deadline_s(0.3)  # kept until the deadline (a lower bound: no machine is too fast)
        # then aborted by the engine's drain itself at its deadline (the stalled request never ends on its own),
        # not by the load balancer's abort re-sends after the drain gave up
        assert hybrid.aborts[0] == ("drain", ["stalls"]), hybrid.aborts

    asyncio.run(go())


def test_a_request_that_reaches_the_engine_after_its_drain_is_aborted_before_the_drain_returns() -> None:
    async def go() -> None:
        hybrid = DrainingReplica("h", token_s=0.01, arrive_s=0.3)  # in transit when the drain starts
        lb = LoadBalancer([hybrid])
        late = await _start(lb, "late", max_tokens=1000)
        await asyncio.sleep(0.05)
        lb.remove_replicas(["h"])
        report = await lb.drain_replicas(["h"], 0.2, resend_interval_s=0.05)
        assert late.done() and lb.in_flight("h") == 0 and not hybrid.progress  # re-aborted once it arrived
        assert late.result().finish_reason == "abort"
        assert (report.requests, report.drained, report.aborted) == (1, 0, 1)

    asyncio.run(go())


def test_budget_zero_aborts_everything_at_once_and_a_replica_without_drain_is_aborted() -> None:
    async def go() -> None:
        hybrid = DrainingReplica("h", token_s=0.005)
        plain = FakeReplica("p", token_latency=(0.005, 0.005))  # no drain method: aborted
        lb = LoadBalancer([hybrid, plain])
        tasks = [await _start(lb, f"r{i}", max_tokens=30) for i in range(4)]
        await asyncio.sleep(0.1)
        lb.remove_replicas(["h", "p"])
        report = await lb.drain_replicas(["h", "p"], 0.0)
        assert lb.total_in_flight == 0 and not hybrid.progress and plain.in_flight == 0
        assert all(t.result().finish_reason == "abort" for t in tasks)
        assert (report.requests, report.drained, report.aborted) == (4, 0, 4)
        assert plain.abort_requests  # the fallback

    asyncio.run(go())


# ------------------------------------------------------------------------------------------------ rollouter


def test_rollouter_drain_never_leaves_a_request_on_the_drained_replica_and_aborted_samples_continue() -> None:
    hybrid = DrainingReplica("hybrid", token_s=0.004)
    standalone = FakeReplica("standalone", token_latency=(0.002, 0.002))
    queue = MessageQueue(maxsize=16)
    rollouter = Rollouter(
        [f"p{i:04d}" for i in range(16)],
        char_tokenize,
        lambda sample: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=40),
        replicas=[standalone, hybrid],
        max_required_samples=16,
        concurrent_samples_per_replica=4,
    )
    rollouter.start()
    try:
        wait_for(lambda: len(hybrid.progress) >= 2, timeout=10)
        time.sleep(0.05)
        rollouter.remove_replicas(["hybrid"])
        report = rollouter.drain_replicas(["hybrid"], 0.1)
        assert not hybrid.progress and rollouter.load_balancer.in_flight("hybrid") == 0
        assert report.requests == report.drained + report.aborted >= 2
        aborted = [r for r in hybrid.results if r.finish_reason == "abort"]
        assert len(aborted) == report.aborted
        assert report.reprefill_tokens == sum(P + len(r.token_ids) for r in aborted)
        samples = queue.get_batch(16, timeout=20)
        assert len(samples) == 16 and all(s.response_length == 40 for s in samples)
        assert all(s.response_token_ids == [expected_token(P + i) for i in range(40)] for s in samples)
        continued = [s for s in samples if s.replica_ids[0] == "hybrid" and s.num_segments > 1]
        assert len(continued) == report.aborted  # each aborted sample continued elsewhere from its prefix
        assert all(set(s.replica_ids[1:]) == {"standalone"} for s in continued)
        assert hybrid.results and all(r.replica_id == "hybrid" for r in hybrid.results)
        assert not hybrid.progress  # nothing was routed to it after the removal
    finally:
        rollouter.stop()
