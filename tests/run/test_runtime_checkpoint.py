"""RolloutRuntime.rollouter_state: a checkpoint taken while requests run keeps every token generated so far.

The running requests are aborted (their segments kept: partial rollout) before the snapshot, and generation goes on
afterwards; the end-to-end proof that a resume then regenerates nothing is ``test_crash_resume.py``.
"""

from __future__ import annotations

from pathlib import Path

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.run.runtime import RolloutRuntime
from tests.rollout.fakes import FakeReplica, wait_for
from tests.rollout.test_rollouter import make


def test_a_checkpoint_mid_generation_keeps_every_generated_token_and_generation_goes_on(tmp_path: Path) -> None:
    rt = RolloutRuntime(RolloutConfig(), AsyncTrainingConfig(), workload=None, run_dir=tmp_path, trace=False)
    replicas = [FakeReplica(f"standalone-{i}", token_latency=(0.002, 0.006), seed=i) for i in range(2)]
    ro, _ = make(replicas, n_prompts=64, n=2, max_required=64, per_replica=8, max_tokens=40, queue_size=1000)
    rt.rollouter = ro
    generated_at_snapshot: list[int] = []
    take = ro.state_dict

    def state_dict() -> dict:  # called while paused: nothing generates until the resume
        generated_at_snapshot.append(sum(r.tokens_generated for r in replicas))
        return take()

    ro.state_dict = state_dict  # type: ignore[method-assign]
    try:
        ro.start(loop_thread=rt.loop)
        wait_for(lambda: all(r.has_partial_request() for r in replicas))
        state = rt.rollouter_state()
        pending = [s for g in state["pending_groups"] for s in g["samples"]]
        buffered = state["message_queue"]["samples"]
        kept = sum(len(s["tokens"]) for s in pending) + sum(len(s["response_token_ids"]) for s in buffered)
        assert any(s["tokens"] and s["result"] is None for s in pending)  # in-flight samples with a prefix
        assert kept == generated_at_snapshot[0] > 0  # the running segments' tokens too, not only finished ones
        assert not ro.is_paused
        wait_for(lambda: sum(r.tokens_generated for r in replicas) > generated_at_snapshot[0])
    finally:
        ro.stop()
        rt.loop.close()
