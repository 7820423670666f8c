"""Adapter-only weight sync (``rollout.lora_sync: adapter``) into a real vLLM-on-CPU engine started with LoRA on:
the engine's greedy output equals PEFT's ``merge_and_unload`` under transformers, the adapter's checksum is the
trainer's, a corrupted adapter bucket fails the sync naming the replica, and a keep-mode sync carries the frozen
request on under the new adapter."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.weights.format import WeightBucket, checksum_state
from lightning_hybrid_rollout.rollout.weights.push import push_weights_async, seam
from lightning_hybrid_rollout.training.lora import adapter_groups, engine_lora_config, inject_lora, lora_config_from

pytestmark = pytest.mark.slow

PEFT = {
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
PROMPTS = [[1, 7, 14, 8, 18], [1, 40, 41, 42, 19, 18]]
GREEDY = SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True)


def _adapter(model_dir: Path, seed: int) -> tuple[list[tuple[str, torch.Tensor]], Any]:
    """A trained-looking adapter (seeded noise in every ``lora_A`` / ``lora_B``) as the trainer sends it, and
    PEFT's ``merge_and_unload`` of it into the base model (a plain transformers model)."""
    from peft import get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    config = lora_config_from(PEFT)
    policy = inject_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    items = [
        (group.name, t.detach().clone())
        for group in adapter_groups(policy, policy.state_dict().items())
        for _, t in group.parts
    ]
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, dataclasses.replace(config))
    loaded = set_peft_model_state_dict(peft_model, dict(items))
    assert not loaded.unexpected_keys, loaded.unexpected_keys
    return items, peft_model.merge_and_unload().eval()


@pytest.fixture(scope="module")
def lora_replica(ray_runtime: Any, tiny_model_dir: Path, vllm_run_dir: Path, run_async: Any) -> Any:
    """One real engine of the tiny model with vLLM's LoRA on (no Ray CPU reservation, pinned to core 0)."""
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    cfg = VLLMEngineConfig(
        model=str(tiny_model_dir),
        kv_cache_memory_bytes=32 * 2**20,
        max_model_len=512,
        run_dir=str(vllm_run_dir),
        lora=engine_lora_config(lora_config_from(PEFT)),
    )
    (rep,) = ray_runtime.start_replicas([ReplicaSpec("lora0", "standalone", cfg, cpus=0, cpu_ids=[0])], timeout=600)
    yield rep
    run_async(rep.shutdown())


async def _greedy(replica: Any, tag: str) -> list[list[int]]:
    res = await asyncio.gather(*(replica.generate(f"{tag}-{i}", p, GREEDY) for i, p in enumerate(PROMPTS)))
    return [r.token_ids for r in res]


def test_an_adapter_sync_serves_peft_s_merged_model_and_reports_the_adapter_s_checksum(
    lora_replica, tiny_model_dir, tiny_hf_model, hf_reference, run_async
) -> None:
    items_a, merged_a = _adapter(tiny_model_dir, seed=1)
    items_b, merged_b = _adapter(tiny_model_dir, seed=2)
    base = [hf_reference.greedy(tiny_hf_model, p, 12) for p in PROMPTS]
    ref_a = [hf_reference.greedy(merged_a, p, 12) for p in PROMPTS]
    ref_b = [hf_reference.greedy(merged_b, p, 12) for p in PROMPTS]
    assert base != ref_a and ref_a != ref_b  # the adapters change what greedy decoding says

    async def go() -> tuple[Any, ...]:
        before = await _greedy(lora_replica, "base")
        rep_a = await push_weights_async(items_a, [lora_replica], version=11, bucket_bytes=50_000)
        out_a = await _greedy(lora_replica, "a")
        health = await lora_replica.health()
        rep_b = await push_weights_async(items_b, [lora_replica], version=12, transport="ray")
        out_b = await _greedy(lora_replica, "b")
        return before, rep_a, out_a, health, rep_b, out_b, await lora_replica.weights_checksum()

    before, rep_a, out_a, health, rep_b, out_b, current = run_async(go())
    assert before == base  # no adapter yet: the base model
    assert out_a == ref_a and out_b == ref_b  # the second adapter replaced the first
    for rep, items in ((rep_a, items_a), (rep_b, items_b)):
        assert rep.checksum == checksum_state(items) and rep.replica_checksums == {"lora0": rep.checksum}
    assert rep_a.num_buckets > 1 and rep_a.bytes < 250_000  # the adapter alone (the full tiny model is ~2 MB)
    assert health["last_update"]["mode"] == "adapter" and health["weight_version"] == 11
    assert health["last_update"]["readback_verified"] == len(items_a)  # every tensor read back from its slot
    assert current == rep_b.checksum


def _flip_lora_b(target: str):
    """Hook flipping one bit in the first ``lora_B`` tensor of a bucket, for replica ``target`` only."""

    def hook(rid: str, bucket: WeightBucket) -> WeightBucket:
        hits = [i for i, n in enumerate(bucket.names) if ".lora_B." in n]
        if rid != target or not hits:
            return bucket
        payload = list(bucket.payload)
        payload[hits[0]] = bad = payload[hits[0]].copy()
        bad[len(bad) // 2] ^= 0x10
        return WeightBucket(bucket.header, payload, list(bucket.names), bucket.index)

    return hook


def test_a_corrupted_adapter_bucket_fails_the_sync_naming_the_replica(lora_replica, tiny_model_dir, run_async) -> None:
    items, _ = _adapter(tiny_model_dir, seed=3)
    expected = checksum_state(items)

    async def go() -> tuple[WeightSyncError, str, Any]:
        with pytest.raises(WeightSyncError) as err, seam.installed(bucket_hook=_flip_lora_b("lora0")):
            await push_weights_async(items, [lora_replica], version=21)
        held = await lora_replica.weights_checksum()  # what the engine holds: the corrupted adapter's checksum
        healed = await push_weights_async(items, [lora_replica], version=22)
        return err.value, held, healed

    err, held, healed = run_async(go())
    assert set(err.failures) == {"lora0"} and held != expected
    assert f"replica lora0: checksum mismatch: expected {expected}, got " in str(err)
    assert healed.replica_checksums == {"lora0": expected}


def test_a_keep_mode_adapter_sync_carries_the_frozen_request_on_under_the_new_adapter(
    lora_replica, tiny_model_dir, hf_reference, run_async
) -> None:
    items_a, _ = _adapter(tiny_model_dir, seed=4)
    items_b, merged_b = _adapter(tiny_model_dir, seed=5)
    prompt = [1, 5, 6]

    async def go() -> tuple[Any, Any]:
        await push_weights_async(items_a, [lora_replica], version=31)
        long = asyncio.ensure_future(
            lora_replica.generate("keep", prompt, SamplingSpec(max_tokens=160, temperature=0.0, ignore_eos=True))
        )
        while (await lora_replica.health())["tokens_in_flight"] < 8:
            await asyncio.sleep(0.01)
        report = await push_weights_async(items_b, [lora_replica], version=32, keep=True)
        return await long, report

    result, report = run_async(go())
    assert report.replica_checksums == {"lora0": checksum_state(items_b)}
    assert result.finish_reason == "length" and len(result.token_ids) == 160  # frozen, not aborted
    ((split, version),) = result.info["version_splits"]
    assert version == 32 and 8 <= split < 160
    # every token after the split is adapter B's greedy choice given what came before it (the KV was recomputed)
    tail = hf_reference.greedy(merged_b, prompt + result.token_ids[:split], 160 - split)
    assert result.token_ids[split:] == tail


def test_the_collective_transport_carries_the_adapter_too(
    lora_replica, tiny_model_dir, hf_reference, run_async
) -> None:
    """The adapter goes through any transport's engine-side receiver: here a gloo broadcast group."""
    from lightning_hybrid_rollout.rollout.weights.router import WeightRouter

    items, merged = _adapter(tiny_model_dir, seed=6)
    ref = [hf_reference.greedy(merged, p, 12) for p in PROMPTS]
    router = WeightRouter("collective")

    async def go() -> tuple[Any, list[list[int]]]:
        report = await router.push(items, [lora_replica], 41, bucket_bytes=50_000)
        return report, await _greedy(lora_replica, "collective")

    try:
        report, out = run_async(go())
    finally:
        router.close()
    assert report.per_replica_transport == {"lora0": "collective"}
    assert report.replica_checksums == {"lora0": checksum_state(items)} and out == ref
