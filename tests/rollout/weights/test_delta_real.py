"""Exact delta weight sync into real vLLM-on-CPU replicas of the tiny model (slow): bit-identical to a full sync over
every transport, a corrupted delta repaired, a replica that slept through versions converging (a bfloat16 engine)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.weights.delta import VAL, DeltaSync
from lightning_hybrid_rollout.rollout.weights.format import WeightBucket, checksum_state
from lightning_hybrid_rollout.rollout.weights.push import seam
from lightning_hybrid_rollout.rollout.weights.router import WeightRouter

PROMPTS = [[1, 7, 14, 8, 18], [1, 40, 41, 42, 19, 18]]
GREEDY = SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True)


async def _greedy(replica: Any, tag: str) -> list[tuple[list[int], list[float]]]:
    res = await asyncio.gather(*(replica.generate(f"{tag}-{i}", p, GREEDY) for i, p in enumerate(PROMPTS)))
    return [(x.token_ids, x.logprobs) for x in res]


async def _both(*coros: Any) -> list[Any]:
    return list(await asyncio.gather(*coros))


def _sparse_step(model: Any, seed: int, fraction: float = 0.02) -> dict[str, torch.Tensor]:
    """A step that moves ``fraction`` of each matrix's elements (as a bf16 RL step does) and every element of the
    first MLP (a tensor sent whole); the norms stay. Returns a copy of the state dict."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                continue
            noise = torch.randn(p.shape, generator=g) * p.std() * 0.5
            if "layers.0.mlp.down_proj" not in name:
                noise *= torch.rand(p.shape, generator=g) < fraction
            p.add_(noise)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _corrupt_values(target: str):
    """Every value of the first sparsely changed tensor ``target`` receives, flipped."""

    def hook(rid: str, bucket: WeightBucket) -> WeightBucket:
        hits = [i for i, n in enumerate(bucket.names) if n.endswith(VAL)]
        if rid != target or not hits:
            return bucket
        payload = list(bucket.payload)
        payload[hits[0]] = payload[hits[0]] ^ 0x10
        return WeightBucket(bucket.header, payload, list(bucket.names), bucket.index)

    return hook


@pytest.mark.slow
def test_delta_sync_is_bit_identical_to_a_full_sync_over_every_transport_and_repairs_a_corrupted_delta(
    vllm_replicas, tiny_hf_model, hf_reference, run_async
) -> None:
    """``r0`` takes every version as a delta (node_shm, ray, collective, auto: one delta state), ``r1`` the same
    versions in full; after each, both hold the trainer's checksum, and at the end they and transformers generate
    the same tokens with the same log-probs. One delta, corrupted on its way to ``r0``, is repaired in the push."""
    r0, r1 = vllm_replicas
    delta = DeltaSync()
    transports = ["node_shm", "node_shm", "ray", "ray", "collective", "collective", "auto"]
    routers = {t: WeightRouter(t, "delta") for t in set(transports)}
    full = {t: WeightRouter(t, "full") for t in set(transports)}
    for router in routers.values():
        router.delta = delta  # every transport continues the same versions
    states = [_sparse_step(tiny_hf_model, seed=70 + v) for v in range(len(transports))]

    async def go() -> list[Any]:
        out = []
        for v, (t, state) in enumerate(zip(transports, states), start=801):
            await full[t].push(state, [r1], v, bucket_bytes=300_000)
            hook = _corrupt_values("r0") if v == 804 else (lambda rid, b: b)
            with seam.installed(bucket_hook=hook):
                out.append(await routers[t].push(state, [r0], v, bucket_bytes=300_000))
        return out

    try:
        reports = run_async(go())
        outs = run_async(_both(_greedy(r0, "delta"), _greedy(r1, "full")))
        health = run_async(r0.health())
    finally:
        for router in [*routers.values(), *full.values()]:
            router.close()
    assert [r.encoding for r in reports] == ["full", "delta", "delta", "full", "delta", "delta", "delta"]
    assert reports[3].repaired == ["r0"]  # the corrupted delta failed its checksum; a full sync repaired it
    for report, state in zip(reports, states):
        assert report.replica_checksums == {"r0": checksum_state(state)}  # a float32 engine: a full sync's checksum
    for report in reports[1:]:
        if report.encoding == "delta":
            assert report.bytes < report.full_bytes / 2 and report.changed_fraction < 0.3
    assert {r.per_replica_transport["r0"] for r in reports} == {"node_shm", "ray_object_store", "collective"}
    ref = [hf_reference.greedy(tiny_hf_model, p, 12) for p in PROMPTS]
    assert outs[0] == outs[1] and [tokens for tokens, _ in outs[0]] == ref
    assert health["last_update"]["encoding"] == "delta" and health["last_update"]["mode"] == "direct"
    assert health["engine_dtype"] == "float32"


@pytest.mark.slow
def test_a_bf16_hybrid_replica_that_slept_through_versions_converges_to_what_a_full_sync_gives(
    ray_runtime, tiny_model_dir, vllm_run_dir, vllm_replicas, tiny_hf_model, run_async
) -> None:
    """A bfloat16 engine parked through three versions wakes to the three deltas squashed into one (cast to its
    dtype on the trainer); it then generates exactly what a plain full sync of the float32 weights gives it."""
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    cfg = VLLMEngineConfig(
        model=str(tiny_model_dir),
        kv_cache_memory_bytes=32 * 2**20,
        max_model_len=256,
        run_dir=str(vllm_run_dir),
        dtype="bfloat16",
    )
    # no Ray CPU reservation (the session's two replicas may hold both), pinned to core 1 like r1
    (h16,) = ray_runtime.start_replicas([ReplicaSpec("h16", "hybrid", cfg, cpus=0, cpu_ids=[1])], timeout=600)
    r0 = vllm_replicas[0]
    router, plain = WeightRouter("auto", "delta"), WeightRouter("auto", "full")
    params = [p for p in tiny_hf_model.parameters()]
    g = torch.Generator().manual_seed(5)

    def adam_like_step() -> dict[str, torch.Tensor]:
        """Every element moves by about the learning rate (AdamW's first steps at lr 3e-5): few bf16 bits change."""
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn(p.shape, generator=g).sign() * 3e-5)
        return {k: v.detach().clone() for k, v in tiny_hf_model.state_dict().items()}

    async def go() -> tuple[Any, ...]:
        await router.push(adam_like_step(), [r0, h16], 901)
        await h16.sleep()
        for v in (902, 903, 904):
            await router.push(adam_like_step(), [r0], v)
        await h16.wake_up()
        state = adam_like_step()
        woke = await router.push(state, [r0, h16], 905)
        via_delta = await _greedy(h16, "delta")
        await plain.push(state, [h16], 905)  # float32 tensors, cast by vLLM as it loads them
        return woke, state, via_delta, await _greedy(h16, "full"), await h16.health()

    try:
        woke, state, via_delta, via_full, health = run_async(go())
    finally:
        run_async(h16.shutdown())
    assert health["engine_dtype"] == "bfloat16"
    # float32 (r0): every element moved, so no delta is smaller than a full sync; bfloat16: few bits moved, so the
    # squashed chain was (the encoder sends a delta only when it is smaller than the full weights in that dtype)
    assert woke.per_replica_encoding == {"r0": "full", "h16": "delta"}
    bf16 = {k: v.to(torch.bfloat16) for k, v in state.items()}
    assert woke.replica_checksums["h16"] == checksum_state(bf16)  # exactly the trainer's weights in its dtype
    assert woke.replica_checksums["r0"] == checksum_state(state)
    assert via_delta == via_full  # same tokens, same log-probs: the engine holds the same bits either way
