"""The hybrid pool's abort step drains with ``rollout.deactivation_drain_s`` and records what it did."""

from __future__ import annotations

import time
from types import SimpleNamespace

from lightning_hybrid_rollout.config import RolloutConfig
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.run.hybrid_pool import HybridReplicaPool
from tests.rollout.fakes import FakeReplica, char_tokenize, wait_for
from tests.rollout.test_drain import DrainingReplica


def _runtime(budget_s: float) -> SimpleNamespace:
    hybrid = DrainingReplica("h0", token_s=0.004)
    standalone = FakeReplica("s0", token_latency=(0.002, 0.002))
    rollouter = Rollouter(
        [f"p{i:04d}" for i in range(64)],
        char_tokenize,
        lambda sample: 0.0,
        MessageQueue(maxsize=64),
        sampling=SamplingSpec(max_tokens=40),
        replicas=[standalone],
        max_required_samples=64,
        concurrent_samples_per_replica=4,
    )
    return SimpleNamespace(
        rollout=RolloutConfig(deactivation_drain_s=budget_s),
        hybrid=[hybrid],
        rollouter=rollouter,
        set_state=lambda ids, state: None,
    )


def _deactivate(budget_s: float) -> tuple[HybridReplicaPool, DrainingReplica]:
    rt = _runtime(budget_s)
    pool = HybridReplicaPool(rt)
    rt.rollouter.start()
    try:
        pool.add_replicas()
        pool.resume_generation_replicas()
        wait_for(lambda: len(rt.hybrid[0].progress) >= 3, timeout=10)
        time.sleep(0.08)
        pool.remove_replicas()
        pool.abort_replicas()
        assert not rt.hybrid[0].progress and rt.rollouter.load_balancer.in_flight("h0") == 0  # nothing left to sleep on
    finally:
        rt.rollouter.stop()
    return pool, rt.hybrid[0]


def test_pool_drains_with_the_configured_budget_and_sums_the_reports():
    pool, hybrid = _deactivate(0.5)
    report = pool.last_drain
    assert report.requests >= 3 and report.requests == report.drained + report.aborted
    assert [d.requests for d in hybrid.drains] == [report.requests]  # one engine drain, with the budget
    assert report.drained >= 1  # 40-token requests at ~250 tokens/s: those with a rate finish within 0.5 s
    assert pool.drain_total == report


def test_pool_budget_zero_aborts_everything_as_the_seed_does():
    pool, hybrid = _deactivate(0.0)
    report = pool.last_drain
    assert report.requests >= 3 and (report.drained, report.aborted) == (0, report.requests)
    assert report.reprefill_tokens > 0 and all(r.finish_reason == "abort" for r in hybrid.results[-report.requests :])
