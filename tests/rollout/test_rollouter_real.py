"""Rollouter + LoadBalancer on REAL vLLM-on-CPU replicas in Ray (slow): exactly once, prefix continuation, order.

Uses the session fixtures of ``tests/conftest.py`` (``r0`` standalone, ``r1`` hybrid) plus one extra replica that
this module kills mid-run. Every replica is wrapped in a :class:`Recorder` (driver side) that logs what each
request carried, so the partial-rollout chain can be checked segment by segment; the concatenated responses are
also checked against a float32 transformers model (log-probabilities of the whole response given the prompt).
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.rollout.sample import Sample

pytestmark = pytest.mark.slow

WEIGHT_VERSION = 9100


class Recorder:
    """Driver-side wrapper of a replica handle that records every generate call (a ``ReplicaLike``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.replica_id = inner.replica_id
        self.calls: dict[str, dict[str, Any]] = {}
        self.forbidden = False
        self.violations: list[str] = []
        self.in_flight = 0
        self._lock = threading.Lock()

    @property
    def is_alive(self) -> bool:
        return self.inner.is_alive

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        if self.forbidden:
            self.violations.append(request_id)
        call = {"prompt": list(prompt_token_ids), "max_tokens": sampling.max_tokens, "result": None}
        self.calls[request_id] = call
        self.in_flight += 1
        try:
            call["result"] = await self.inner.generate(request_id, prompt_token_ids, sampling)
            return call["result"]
        finally:
            self.in_flight -= 1

    async def abort(self, request_ids: list[str]) -> None:
        await self.inner.abort(request_ids)


def _ray_call(handle: Any, method: str, *args: Any) -> Any:
    import ray

    return ray.get(getattr(handle.actor, method).remote(*args), timeout=120)


@pytest.fixture(scope="module")
def victim(ray_runtime, tiny_model_dir, vllm_run_dir):
    """A third replica (shares core 0, no Ray CPU) that the exactly-once test kills.

    Only launched here (not awaited), so it starts while the session's ``vllm_replicas`` start: request this
    fixture before ``vllm_replicas`` and ``wait_ready`` it in the test.
    """
    from lightning_hybrid_rollout.rollout.replica import ReplicaHandle, ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    cfg = VLLMEngineConfig(
        model=str(tiny_model_dir), kv_cache_memory_bytes=64 * 2**20, max_model_len=512, run_dir=str(vllm_run_dir)
    )
    handle = ReplicaHandle.launch(ReplicaSpec("r2victim", "hybrid", cfg, cpus=0, cpu_ids=[0]))
    yield handle
    handle.kill()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """The tiny model in float32 transformers, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def _push_reference_weights(model: Any, replicas: list[Any]) -> None:
    from lightning_hybrid_rollout.rollout.weights.push import push_weights

    push_weights(dict(model.state_dict()), replicas, version=WEIGHT_VERSION)


def _prompts(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"prompt": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=", "i": i} for i in range(n)]


def _check_chain(sample: Sample, recorders: list[Recorder], response_length: int) -> int:
    """Replay the sample's segments from the recorders; returns how many carried a non-empty prefix."""
    calls = {}
    for rec in recorders:
        for rid, call in rec.calls.items():
            if rid.rsplit(":", 1)[0] == sample.uid:
                calls[int(rid.rsplit(":", 1)[1])] = (rec.replica_id, call)
    prefix: list[int] = []
    continued = 0
    kept_replicas = []
    for attempt in sorted(calls):
        replica_id, call = calls[attempt]
        assert call["prompt"] == sample.prompt_token_ids + prefix, f"{sample.uid}:{attempt} lost its prefix"
        assert call["max_tokens"] == response_length - len(prefix)
        continued += bool(prefix)
        result = call["result"]
        if result is None:  # the replica died under it: nothing kept
            continue
        if result.token_ids or result.finish_reason != "abort":
            kept_replicas.append(replica_id)
        prefix = prefix + list(result.token_ids)
    assert prefix == sample.response_token_ids
    assert kept_replicas == sample.replica_ids
    return continued


def _check_logprobs(hf_reference: Any, model: Any, sample: Sample) -> None:
    ref = hf_reference.token_logprobs(model, sample.prompt_token_ids, sample.response_token_ids)
    assert ref == pytest.approx(sample.response_logprobs, abs=2e-3), sample.uid


def test_real_exactly_once_under_aborts_remove_readd_and_a_killed_actor(
    victim, vllm_replicas, reference, hf_reference, run_async
):
    import ray

    run_async(victim.wait_ready(600))
    model, tok = reference
    r0, r1 = vllm_replicas
    _push_reference_weights(model, [r0, r1, victim])
    recorders = [Recorder(h) for h in (r0, r1, victim)]
    rec1 = recorders[1]
    response_length, n_prompts, n = 8, 128, 4
    total = n_prompts * n
    queue = MessageQueue(maxsize=64)
    ro = Rollouter(
        _prompts(n_prompts, seed=0),
        lambda text: tok(text)["input_ids"],
        lambda s: float(len(s.response_token_ids)),
        queue,
        sampling=SamplingSpec(max_tokens=response_length, temperature=1.0),
        replicas=recorders,
        n_samples_per_prompt=n,
        max_required_samples=64,
        concurrent_samples_per_replica=16,
        no_replica_timeout_s=120,
    )
    rng = random.Random(7)
    got: list[Sample] = []
    with ro:
        batch_no = 0
        while len(got) < total:
            got.extend(queue.get_batch(32, timeout=120))
            batch_no += 1
            if batch_no == 3:  # deactivate r1: cut routing, abort, verify the engine holds nothing
                ro.remove_replicas(["r1"])
                rec1.forbidden = True
                ro.abort_replicas(["r1"])
                assert _ray_call(r1, "health")["inflight"] == 0
            elif batch_no == 6:
                rec1.forbidden = False
                ro.add_replicas([rec1])
            elif batch_no == 8:
                ray.kill(victim.actor, no_restart=True)  # the handle does not know: the next call finds out
            elif batch_no > 8 and rng.random() < 0.7:
                ro.abort_replicas([rng.choice(["r0", "r1"])])
            elif rng.random() < 0.7:
                ro.abort_replicas([rng.choice(["r0", "r2victim"])])
            ro.reset_staleness()
        counters = ro.counters()
    uids = [s.uid for s in got]
    assert len(uids) == len(set(uids)) == total
    continued = 0
    for sample in got:
        assert 1 <= sample.response_length <= response_length
        assert len(sample.response_logprobs) == sample.response_length
        continued += _check_chain(sample, recorders, response_length)
    multi = [s for s in got if s.num_segments > 1]
    assert continued > 0 and multi, counters
    for sample in multi[:64] + [s for s in got if s.num_segments == 1][:16]:
        _check_logprobs(hf_reference, model, sample)
    assert not rec1.violations
    assert ro.load_balancer.replica_state("r2victim") == "dead"
    assert counters["aborted_segments"] > 0 and counters["total_delivered_samples"] == total
    assert counters["dropped"] == 0


def test_real_deactivate_order_moves_work_to_the_standalone_replica(vllm_replicas, reference, hf_reference):
    model, tok = reference
    r0, r1 = vllm_replicas
    _push_reference_weights(model, [r0, r1])
    rec0, rec1 = Recorder(r0), Recorder(r1)
    response_length, n_prompts, n = 48, 16, 2
    queue = MessageQueue(maxsize=n_prompts * n)
    ro = Rollouter(
        _prompts(n_prompts, seed=1),
        lambda text: tok(text)["input_ids"],
        lambda s: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=response_length, temperature=1.0),
        replicas=[rec0, rec1],
        n_samples_per_prompt=n,
        concurrent_samples_per_replica=8,
    )
    try:
        with ro:
            deadline = 60.0
            t0 = time.monotonic()
            while _ray_call(r1, "health")["tokens_in_flight"] == 0:
                assert time.monotonic() - t0 < deadline, "r1 never had a partially generated request"
                time.sleep(0.005)
            # seed deactivation order: remove -> abort -> sleep
            ro.remove_replicas(["r1"])
            rec1.forbidden = True
            routed_before = len(rec1.calls)
            aborted = ro.abort_replicas(["r1"])
            assert _ray_call(r1, "health")["inflight"] == 0
            _ray_call(r1, "sleep")
            got = queue.get_batch(n_prompts * n, timeout=120)
            assert len(rec1.calls) == routed_before and not rec1.violations
    finally:
        _ray_call(r1, "wake_up")  # leave the shared replica active
    assert aborted > 0
    moved = [s for s in got if "r1" in s.replica_ids and s.replica_ids[-1] == "r0"]
    assert moved, "no aborted request continued on the standalone replica"
    per_uid = defaultdict(int)
    for s in got:
        per_uid[s.uid] += 1
        assert s.response_length <= response_length
        _check_chain(s, [rec0, rec1], response_length)
    assert len(per_uid) == n_prompts * n and set(per_uid.values()) == {1}
    for s in moved[:16]:
        _check_logprobs(hf_reference, model, s)
