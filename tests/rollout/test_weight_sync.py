"""Weight sync: checksums and the bucket format, pushes into in-process fakes (fast), and verified pushes into real
replicas (slow). The staging file and the receiver protocol have their own tests in ``tests/rollout/weights/``."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import numpy as np
import pytest
import torch

from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.weights.format import (
    WeightBucket,
    checksum_state,
    combine_digests,
    make_bucket,
    parse_safetensors,
    plan_buckets,
    tensor_digest,
)
from lightning_hybrid_rollout.rollout.weights.push import PushHooks, push_weights, push_weights_async, seam
from lightning_hybrid_rollout.rollout.weights.report import SyncReport
from lightning_hybrid_rollout.rollout.weights.staging import SharedStaging
from tests.rollout.fakes import FakeWeightReceiver


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {"model.embed_tokens.weight": torch.randn(16, 8, generator=g)}
    for i in range(3):
        sd[f"model.layers.{i}.self_attn.q_proj.weight"] = torch.randn(8, 8, generator=g)
        sd[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(16, 8, generator=g)
        sd[f"model.layers.{i}.input_layernorm.weight"] = torch.randn(8, generator=g)
    sd["model.norm.weight"] = torch.randn(8, generator=g)
    sd["lm_head.weight"] = torch.randn(16, 8, generator=g).to(torch.bfloat16)
    return sd


# ---------------------------------------------------------------------------------------------------------------
# fast
# ---------------------------------------------------------------------------------------------------------------
def test_checksum_is_order_independent_and_sensitive() -> None:
    sd = _state()
    c = checksum_state(sd)
    assert c == checksum_state(list(reversed(list(sd.items()))))
    assert c == checksum_state({k: v.clone() for k, v in sd.items()})
    changed = {k: v.clone() for k, v in sd.items()}
    changed["model.layers.1.mlp.up_proj.weight"][3, 2] += 1e-6
    assert checksum_state(changed) != c
    renamed = dict(sd)
    renamed["model.norm.weightX"] = renamed.pop("model.norm.weight")
    assert checksum_state(renamed) != c
    missing = dict(sd)
    missing.pop("model.norm.weight")
    assert checksum_state(missing) != c
    reshaped = dict(sd)
    reshaped["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"].reshape(8, 16)
    assert checksum_state(reshaped) != c
    recast = dict(sd)
    recast["model.norm.weight"] = sd["model.norm.weight"].double()
    assert checksum_state(recast) != c
    noncontig = dict(sd)
    noncontig["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"].t().contiguous().t()
    assert checksum_state(noncontig) == c  # values, not memory layout
    with pytest.raises(ValueError, match="duplicate"):
        checksum_state([("a", torch.zeros(1)), ("a", torch.zeros(1))])


def test_plan_buckets_keeps_layers_whole_and_bounded() -> None:
    sd = _state()
    layer_bytes = sum(v.numel() * v.element_size() for k, v in sd.items() if k.startswith("model.layers.0."))
    buckets = plan_buckets(sd.items(), bucket_bytes=layer_bytes + 10)
    assert [n for b in buckets for n, _ in b] == list(sd)  # order kept, nothing lost
    for b in buckets:
        layers = {n.split(".")[2] for n, _ in b if n.startswith("model.layers.")}
        assert len(layers) <= 1  # a layer fits once, two do not
    for i in range(3):
        owners = [j for j, b in enumerate(buckets) if any(n.startswith(f"model.layers.{i}.") for n, _ in b)]
        assert len(owners) == 1  # never split
    assert len(plan_buckets(sd.items(), bucket_bytes=1)) == 6  # each group alone: embed, 3 layers, norm, lm_head
    assert len(plan_buckets(sd.items(), bucket_bytes=10**9)) == 1
    with pytest.raises(ValueError):
        plan_buckets(sd.items(), bucket_bytes=0)


def test_bucket_is_valid_safetensors_and_roundtrips() -> None:
    from safetensors.torch import load

    sd = _state()
    b = make_bucket(list(sd.items()), index=3, metadata={"version": "7"})
    blob = b.to_bytes()
    assert len(blob) == b.nbytes and b.data_bytes < b.nbytes
    loaded = load(blob)  # the reference implementation agrees with the layout
    assert set(loaded) == set(sd) and all(torch.equal(loaded[k], v) for k, v in sd.items())
    items, size = parse_safetensors(blob)
    assert size == len(blob)
    assert [n for n, _ in items] == list(sd) and all(torch.equal(t, sd[n]) for n, t in items)
    # inside a bigger buffer at an offset, as in the engine's staging file
    buf = np.zeros(len(blob) + 100, dtype=np.uint8)
    b.write_into(buf, 40)
    items2, size2 = parse_safetensors(buf, 40)
    assert size2 == len(blob) and checksum_state(items2) == checksum_state(sd)
    # survives pickling (what ray.put does), payload stays raw bytes
    b2 = pickle.loads(pickle.dumps(b))
    assert isinstance(b2, WeightBucket) and b2.to_bytes() == blob


def test_a_bucket_written_with_digests_records_each_tensor_s_checksum_digest() -> None:
    sd = _state(2)
    sd["model.layers.3.mlp.down_proj.weight"] = torch.randn(300, 1100)  # 1.3 MB: several hash chunks
    sd["model.layers.3.empty"] = torch.empty(0, 4)
    b = make_bucket(list(sd.items()))
    buf, digests = np.zeros(b.nbytes + 16, dtype=np.uint8), {}
    assert b.write_into(buf, 16, digests) == b.nbytes
    assert digests == {n: tensor_digest(n, t) for n, t in sd.items()}
    assert combine_digests(digests) == checksum_state(sd)
    assert parse_safetensors(buf, 16)[0] and bytes(buf[16:]) == b.to_bytes()  # the copy is the same bytes


def test_a_node_staging_push_hashes_the_trainer_s_tensors_while_writing_them(run_async, monkeypatch) -> None:
    import lightning_hybrid_rollout.rollout.weights.push as push_mod

    sd = _state(9)
    expected = checksum_state(sd)

    def no_second_pass(*args: Any) -> str:
        raise AssertionError("the trainer's tensors were hashed in a pass of their own")

    monkeypatch.setattr(push_mod, "checksum_state", no_second_pass)
    reps = [FakeWeightReceiver("a"), FakeWeightReceiver("b")]
    rep = run_async(push_weights_async(sd, reps, version=2, bucket_bytes=1500, transport="node_shm"))
    assert rep.checksum == expected and set(rep.replica_checksums.values()) == {expected}


def test_parse_rejects_corrupt_headers() -> None:
    blob = bytearray(make_bucket(list(_state().items())).to_bytes())
    with pytest.raises(ValueError, match="truncated"):
        parse_safetensors(bytes(blob[:4]))
    bad_len = bytearray(blob)
    bad_len[0:8] = (10**9).to_bytes(8, "little")
    with pytest.raises(ValueError, match="invalid"):
        parse_safetensors(bytes(bad_len))
    bad_json = bytearray(blob)
    bad_json[9] = ord("#")
    with pytest.raises(ValueError, match="JSON"):
        parse_safetensors(bytes(bad_json))
    with pytest.raises(ValueError, match="past the end"):
        parse_safetensors(bytes(blob[:-10]))


def test_push_with_no_replicas_only_computes_the_checksum() -> None:
    sd = _state()
    rep = push_weights(sd, [], version=3)
    assert isinstance(rep, SyncReport) and rep.checksum == checksum_state(sd) and rep.num_replicas == 0
    assert rep.bytes > sum(v.numel() * v.element_size() for v in sd.values())


def test_node_staging_push_is_written_once_and_verified_per_replica(run_async) -> None:
    sd = _state(5)
    reps = [FakeWeightReceiver("a"), FakeWeightReceiver("b")]
    rep = run_async(push_weights_async(sd, reps, version=7, bucket_bytes=1500, transport="node_shm"))
    assert rep.num_buckets > 2 and rep.transport == "node_shm"
    assert rep.per_replica_transport == {"a": "node_shm", "b": "node_shm"}
    assert set(rep.replica_checksums.values()) == {checksum_state(sd)}
    for r in reps:  # every bucket loaded once, in order, contiguous (batched into fewer calls); never the Ray path
        assert len(r.loaded_spans) == rep.num_buckets and r.loaded_spans[0][0] == 0
        assert all(a[0] + a[1] == b[0] for a, b in zip(r.loaded_spans, r.loaded_spans[1:]))
        assert 1 <= r.calls.count("load_weight_from_node_staging") <= rep.num_buckets
        assert "load_weight_bucket" not in r.calls


def test_a_replica_that_attached_the_node_staging_file_is_not_asked_again_until_it_fails_a_push(run_async) -> None:
    reps = [FakeWeightReceiver("a"), FakeWeightReceiver("b")]
    for version in (1, 2, 3):  # the same file every push: one attach round trip per replica, at the first
        sd = _state(version)
        rep = run_async(push_weights_async(sd, reps, version=version, bucket_bytes=1500, transport="node_shm"))
        assert set(rep.replica_checksums.values()) == {checksum_state(sd)}
    assert [r.calls.count("attach_node_staging") for r in reps] == [1, 1]

    def flip(staging: SharedStaging, index: int, offset: int, nbytes: int) -> None:
        if index == 0:
            staging.view()[offset + nbytes - 3] ^= 0x01

    with pytest.raises(WeightSyncError), seam.installed(staging_hook=flip):  # both fail: both are asked again
        run_async(push_weights_async(_state(4), reps, version=4, bucket_bytes=1500, transport="node_shm"))
    rep = run_async(push_weights_async(_state(5), reps, version=5, bucket_bytes=1500, transport="node_shm"))
    assert set(rep.replica_checksums.values()) == {checksum_state(_state(5))}
    assert [r.calls.count("attach_node_staging") for r in reps] == [2, 2]
    fresh = FakeWeightReceiver("a")  # a replacement replica under the same id attaches for itself
    run_async(push_weights_async(_state(6), [fresh], version=6, bucket_bytes=1500, transport="node_shm"))
    assert fresh.calls.count("attach_node_staging") == 1


def test_node_staging_corruption_fails_every_replica_reading_it(run_async) -> None:
    sd = _state(6)

    def flip(staging: SharedStaging, index: int, offset: int, nbytes: int) -> None:
        if index == 0:
            staging.view()[offset + nbytes - 3] ^= 0x01  # inside the last tensor's data of bucket 0

    reps = [FakeWeightReceiver("a"), FakeWeightReceiver("b")]
    with pytest.raises(WeightSyncError) as err, seam.installed(staging_hook=flip):
        run_async(push_weights_async(sd, reps, version=8, bucket_bytes=1500, transport="node_shm"))
    assert set(err.value.failures) == {"a", "b"} and "checksum mismatch" in err.value.failures["a"]


def test_node_shm_transport_names_a_replica_that_cannot_map_the_file(run_async) -> None:
    reps = [FakeWeightReceiver("near"), FakeWeightReceiver("far", can_attach=False)]
    with pytest.raises(WeightSyncError) as err:
        run_async(push_weights_async(_state(), reps, version=9, transport="node_shm"))
    assert set(err.value.failures) == {"far"}
    assert "cannot map the trainer's node staging file" in err.value.failures["far"]
    assert "transport='auto'" in err.value.failures["far"]
    assert err.value.report is not None and err.value.report.replica_checksums["near"] == checksum_state(_state())


def test_staged_push_writes_every_bucket_before_any_replica_pauses(run_async) -> None:
    sd = _state(7)
    events: list[str] = []
    reps = [FakeWeightReceiver("a", events=events), FakeWeightReceiver("b", events=events)]

    async def on_commit() -> None:
        events.append("on_commit")

    def wrote(staging: SharedStaging, index: int, offset: int, nbytes: int) -> None:
        events.append(f"wrote:{index}")

    with seam.installed(staging_hook=wrote):
        rep = run_async(
            push_weights_async(
                sd, reps, version=3, bucket_bytes=1500, transport="node_shm", staged=True, on_commit=on_commit
            )
        )
    assert set(rep.replica_checksums.values()) == {checksum_state(sd)}
    commit = events.index("on_commit")
    assert events.count("on_commit") == 1
    assert [e for e in events[:commit] if e.startswith("wrote:")] == [f"wrote:{i}" for i in range(rep.num_buckets)]
    assert not any(e.endswith(("begin_weight_update", "load_weight_from_node_staging")) for e in events[:commit])
    for rid in ("a", "b"):  # one pause per replica: begin -> one load call with every bucket -> finish
        mine = [e.split(":")[1] for e in events[commit:] if e.startswith(rid + ":")]
        assert mine == ["begin_weight_update", "load_weight_from_node_staging", "finish_weight_update"]
    assert set(rep.per_replica_commit_seconds) == {"a", "b"}
    assert all(0 <= rep.per_replica_commit_seconds[rid] <= rep.per_replica_seconds[rid] for rid in ("a", "b"))


def test_unknown_transport_is_rejected(run_async) -> None:
    with pytest.raises(ValueError, match="transport must be 'auto', 'ray' or 'node_shm'"):
        run_async(push_weights_async(_state(), [], version=1, transport="nfs"))


def test_the_seam_defaults_to_no_op_hooks_and_restores_them() -> None:
    """The push's only test entry point: hooks are off by default, set for a block, then restored."""
    import inspect

    assert not {"bucket_hook", "staging_hook"} & set(inspect.signature(push_weights_async).parameters)
    b = make_bucket(list(_state().items()))
    defaults = PushHooks()
    assert defaults.bucket_hook("r0", b) is b and defaults.staging_hook(None, 0, 0, 0) is None  # type: ignore[arg-type]
    before = seam.bucket_hook

    def hook(rid: str, bucket: WeightBucket) -> WeightBucket:
        return bucket

    with seam.installed(bucket_hook=hook) as hooks:
        assert hooks is seam and seam.bucket_hook is hook
    assert seam.bucket_hook is before
    with pytest.raises(TypeError, match="no hook"), seam.installed(bucket_hok=hook):
        pass


# ---------------------------------------------------------------------------------------------------------------
# slow: real replicas
# ---------------------------------------------------------------------------------------------------------------
PROMPTS = [[1, 7, 14, 8, 18], [1, 40, 41, 42, 19, 18]]
GREEDY = SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True)


async def _greedy(replicas: list[Any], tag: str) -> list[list[list[int]]]:
    out = []
    for r in replicas:
        res = await asyncio.gather(*(r.generate(f"{tag}-{r.replica_id}-{i}", p, GREEDY) for i, p in enumerate(PROMPTS)))
        out.append([x.token_ids for x in res])
    return out


def _flip_one_byte(target: str, name_part: str):
    """Hook flipping one bit in the middle of the first tensor whose name contains ``name_part``, for ``target``."""

    def hook(rid: str, bucket: WeightBucket) -> WeightBucket:
        hits = [i for i, n in enumerate(bucket.names) if name_part in n]
        if rid != target or not hits:
            return bucket
        payload = list(bucket.payload)
        payload[hits[0]] = bad = payload[hits[0]].copy()
        bad[len(bad) // 2] ^= 0x10
        return WeightBucket(bucket.header, payload, list(bucket.names), bucket.index)

    return hook


def _drop_tensor(target: str, name_part: str):
    def hook(rid: str, bucket: WeightBucket) -> WeightBucket:
        if rid != target or not any(name_part in n for n in bucket.names):
            return bucket
        items, _ = parse_safetensors(bucket.to_bytes())
        return make_bucket([(n, t.clone()) for n, t in items if name_part not in n], bucket.index)

    return hook


@pytest.mark.slow
def test_push_changes_generations_and_checksums_match(vllm_replicas, tiny_hf_model, hf_reference, run_async) -> None:
    state_a = hf_reference.perturbed_state(tiny_hf_model, seed=21)
    ref_a = [hf_reference.greedy(tiny_hf_model, p, 12) for p in PROMPTS]
    state_b = hf_reference.perturbed_state(tiny_hf_model, seed=22)
    ref_b = [hf_reference.greedy(tiny_hf_model, p, 12) for p in PROMPTS]
    assert ref_a != ref_b

    async def go() -> tuple[Any, ...]:
        # replicas on the trainer's node load from the shared node staging file; transport="ray" forces the
        # object-store path (what replicas on other nodes of a cluster take)
        rep_a = await push_weights_async(state_a, vllm_replicas, version=201, bucket_bytes=300_000)
        out_a = await _greedy(vllm_replicas, "a")
        rep_b = await push_weights_async(state_b, vllm_replicas, version=202, transport="ray")
        out_b = await _greedy(vllm_replicas, "b")
        sums = [await r.weights_checksum() for r in vllm_replicas]
        health = [await r.health() for r in vllm_replicas]
        versions = [h["weight_version"] for h in health]
        # CPU: the direct reload ran (packs linear layers from the received tensors, re-packs the tied LM head)
        assert [h["last_update"]["mode"] for h in health] == ["direct", "direct"]
        return rep_a, out_a, rep_b, out_b, sums, versions

    rep_a, out_a, rep_b, out_b, sums, versions = run_async(go())
    assert rep_a.num_buckets > 1 and rep_b.num_buckets == 1
    assert rep_a.per_replica_transport == {"r0": "node_shm", "r1": "node_shm"}
    assert rep_b.per_replica_transport == {"r0": "ray_object_store", "r1": "ray_object_store"}
    for rep, state in ((rep_a, state_a), (rep_b, state_b)):
        assert rep.checksum == checksum_state(state)
        assert set(rep.replica_checksums.values()) == {rep.checksum}
        assert set(rep.per_replica_seconds) == {"r0", "r1"} and rep.gb_per_s > 0
    assert out_a == [ref_a, ref_a] and out_b == [ref_b, ref_b]
    assert sums == [rep_b.checksum] * 2 and versions == [202, 202]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["auto", "ray"])
def test_staged_push_keeps_replicas_generating_until_the_commit(
    transport, vllm_replicas, tiny_hf_model, hf_reference, run_async
) -> None:
    state = hf_reference.perturbed_state(tiny_hf_model, seed=27 if transport == "auto" else 28)
    ref = [hf_reference.greedy(tiny_hf_model, p, 12) for p in PROMPTS]
    r0 = vllm_replicas[0]

    async def go() -> tuple[Any, ...]:
        before = (await r0.health())["weight_version"]
        spec = SamplingSpec(max_tokens=480, temperature=1.0, ignore_eos=True)
        long = asyncio.ensure_future(r0.generate(f"staged-{transport}", [1, 5, 6], spec))
        while (await r0.health())["tokens_in_flight"] < 4:
            await asyncio.sleep(0.01)
        seen: dict[str, Any] = {}

        async def on_commit() -> None:  # every bucket is on the replica side; nothing paused yet
            seen["health"] = await r0.health()

        report = await push_weights_async(
            state, vllm_replicas, version=before + 1, transport=transport, staged=True, on_commit=on_commit
        )
        return report, seen["health"], await long, await _greedy(vllm_replicas, f"st-{transport}"), before

    report, at_commit, old, out, before = run_async(go())
    assert at_commit["state"] == "active" and at_commit["inflight"] >= 1  # still generating while staged
    assert old.finish_reason == "abort" and old.weight_version == before  # paused (aborted) only at the commit
    assert set(report.replica_checksums.values()) == {checksum_state(state)} and out == [ref, ref]
    assert set(report.per_replica_commit_seconds) == {"r0", "r1"}
    kind = "node_shm" if transport == "auto" else "ray_object_store"
    assert set(report.per_replica_transport.values()) == {kind}


@pytest.mark.slow
def test_layerwise_reload_fallback_matches_transformers(
    ray_runtime, tiny_model_dir, vllm_run_dir, tiny_hf_model, hf_reference, run_async
) -> None:
    """``direct_reload=False`` (what runs where the direct path is not exact: GPU, quantized models): vLLM's own
    layer-wise reload, same parity and checksums."""
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    cfg = VLLMEngineConfig(
        model=str(tiny_model_dir),
        kv_cache_memory_bytes=32 * 2**20,
        max_model_len=256,
        run_dir=str(vllm_run_dir),
        direct_reload=False,
    )
    # no Ray CPU reservation (the session's two replicas may hold both), pinned to core 0 like r0
    (rep,) = ray_runtime.start_replicas([ReplicaSpec("lw", "standalone", cfg, cpus=0, cpu_ids=[0])], timeout=600)
    try:
        state = hf_reference.perturbed_state(tiny_hf_model, seed=26)
        ref = [hf_reference.greedy(tiny_hf_model, p, 12) for p in PROMPTS]

        async def go() -> tuple[Any, Any, Any]:
            report = await push_weights_async(state, [rep], version=601, bucket_bytes=300_000)
            return report, await _greedy([rep], "lw"), await rep.health()

        report, out, health = run_async(go())
        assert health["last_update"]["mode"] == "layerwise" and out == [ref]
        assert report.replica_checksums == {"lw": checksum_state(state)}
    finally:
        run_async(rep.shutdown())


@pytest.mark.slow
def test_corrupted_push_is_detected_and_named(vllm_replicas, tiny_hf_model, hf_reference, run_async) -> None:
    state = hf_reference.perturbed_state(tiny_hf_model, seed=23)
    expected = checksum_state(state)

    async def go() -> tuple[WeightSyncError, WeightSyncError, Any]:
        # a linear weight (repacked by vLLM on CPU, so only the checksum can see it) corrupted for r1 only
        flip_r1 = _flip_one_byte("r1", "layers.0.mlp.down_proj")
        with pytest.raises(WeightSyncError) as err, seam.installed(bucket_hook=flip_r1):
            await push_weights_async(state, vllm_replicas, version=301)
        # the embedding (kept materialized by vLLM) corrupted for r0: the engine's read-back refuses the load
        with pytest.raises(WeightSyncError) as err2, seam.installed(bucket_hook=_flip_one_byte("r0", "embed_tokens")):
            await push_weights_async(state, vllm_replicas, version=302)

        # the shared node staging file corrupted after the trainer wrote it: every replica reading it refuses it
        def flip(staging: SharedStaging, index: int, offset: int, nbytes: int) -> None:
            if index == 0:
                staging.view()[offset + nbytes // 2] ^= 0x10

        with pytest.raises(WeightSyncError) as err3, seam.installed(staging_hook=flip):
            await push_weights_async(state, vllm_replicas, version=304)
        healed = await push_weights_async(state, vllm_replicas, version=305)  # a clean push repairs both
        return err.value, err2.value, err3.value, healed

    err, err2, err3, healed = run_async(go())
    assert set(err3.failures) == {"r0", "r1"}
    assert err.report is not None and err.report.per_replica_transport == {"r0": "node_shm", "r1": "ray_object_store"}
    assert set(err.failures) == {"r1"}
    assert f"replica r1: checksum mismatch: expected {expected}, got " in str(err)
    assert err.report is not None and err.report.replica_checksums["r0"] == expected
    assert set(err2.failures) == {"r0"} and "read-back mismatch" in err2.failures["r0"]
    assert "embed_tokens" in err2.failures["r0"]
    assert set(healed.replica_checksums.values()) == {expected}


@pytest.mark.slow
def test_missing_tensor_is_detected_by_the_engine(vllm_replicas, tiny_hf_model, hf_reference, run_async) -> None:
    state = hf_reference.perturbed_state(tiny_hf_model, seed=24)

    async def go() -> tuple[WeightSyncError, Any]:
        with pytest.raises(WeightSyncError) as err, seam.installed(bucket_hook=_drop_tensor("r0", "layers.1.mlp")):
            await push_weights_async(state, vllm_replicas, version=401)
        with pytest.raises(Exception, match="unknown state"):
            await vllm_replicas[0].weights_checksum()
        healed = await push_weights_async(state, vllm_replicas, version=402)
        return err.value, healed

    err, healed = run_async(go())
    assert set(err.failures) == {"r0"}
    assert "got no new weights" in err.failures["r0"] and "layers.1.mlp" in err.failures["r0"]
    assert set(healed.replica_checksums.values()) == {checksum_state(state)}


@pytest.mark.slow
def test_update_aborts_inflight_and_versions_segments(vllm_replicas, tiny_hf_model, hf_reference, run_async) -> None:
    state = hf_reference.perturbed_state(tiny_hf_model, seed=25)
    r0 = vllm_replicas[0]

    async def go() -> tuple[Any, Any, int]:
        before = (await r0.health())["weight_version"]
        long = asyncio.ensure_future(
            r0.generate("during-sync", [1, 5, 6], SamplingSpec(max_tokens=480, temperature=1.0, ignore_eos=True))
        )
        while (await r0.health())["tokens_in_flight"] < 8:
            await asyncio.sleep(0.01)
        await push_weights_async(state, [r0], version=before + 1)
        after = await r0.generate("after-sync", [1, 5, 6], SamplingSpec(max_tokens=4, ignore_eos=True))
        return await long, after, before

    old, new, before = run_async(go())
    assert old.finish_reason == "abort" and old.weight_version == before and old.token_ids
    assert new.weight_version == before + 1 and len(new.token_ids) == 4


# ---------------------------------------------------------------------------------------------------------------
# rollout.weight_transport: collective, end to end in a real fit (gloo on CPU)
# ---------------------------------------------------------------------------------------------------------------
def _transport_fit(tmp_path: Any, model_dir: Any, transport: str, max_steps: int = 4) -> dict[str, Any]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / transport
    root.mkdir()
    spec = {"root": str(root), "out": str(root / "report.json"), "model_dir": str(model_dir)}
    spec.update(max_steps=max_steps, weight_transport=transport)
    (root / "spec.json").write_text(json.dumps(spec))
    script = Path(__file__).parent.parent / "lightning" / "_weight_transport_fit.py"  # beside no vllm/ folder
    proc = subprocess.run(
        [sys.executable, str(script), str(root / "spec.json")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=str(root),
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads((root / "report.json").read_text())


@pytest.mark.slow
def test_a_fit_with_the_collective_transport_pushes_every_sync_through_gloo(tmp_path, tiny_model_dir) -> None:
    out = _transport_fit(tmp_path, tiny_model_dir, "collective")
    syncs, steps = out["syncs"], out["steps"]
    replicas = {"standalone-0", "hybrid-0"}
    assert len(syncs) >= 2 and {rid for s in syncs for rid in s["replica_checksums"]} == replicas
    for s in syncs:  # every sync: collective for every replica, each replica's checksum the trainer's
        assert s["transport"] == "collective", s
        assert set(s["per_replica_transport"].values()) == {"collective"}, s
        assert set(s["replica_checksums"].values()) == {s["checksum"]}, s
    # the replicas' own count: one verified collective update per sync that reached them, nothing else
    for step in steps:
        for rid, counters in step["counters"].items():
            assert counters == ({"collective": step["pushed"][rid]} if step["pushed"].get(rid) else {}), step
    assert steps[-1]["pushed"] == {rid: sum(rid in s["replica_checksums"] for s in syncs) for rid in replicas}


# ---------------------------------------------------------------------------------------------------------------
# GPU transports (need CUDA + a CUDA build of vLLM; skipped elsewhere)
# ---------------------------------------------------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_gpu_cuda_ipc_and_nccl_collective_pushes(
    ray_runtime, tiny_model_dir, tiny_hf_model, hf_reference, run_async
) -> None:
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
    from lightning_hybrid_rollout.rollout.weights.router import WeightRouter

    cfg = VLLMEngineConfig(model=str(tiny_model_dir), gpu_memory_utilization=0.2, max_model_len=256)
    hybrid, standalone = ray_runtime.start_replicas(
        [ReplicaSpec("gpu-hybrid", "hybrid", cfg, gpus=0.3), ReplicaSpec("gpu-standalone", "standalone", cfg, gpus=0.3)]
    )
    state = hf_reference.perturbed_state(tiny_hf_model, seed=31)
    ref = hf_reference.greedy(tiny_hf_model, PROMPTS[0], 12)
    cuda_state = {k: v.cuda() for k, v in state.items()}
    router = WeightRouter("auto")

    async def go() -> list[list[int]]:
        for r in (hybrid, standalone):
            await r.health()
        assert router.plan([hybrid, standalone]) == {"cuda_ipc": [hybrid], "collective": [standalone]}
        rep = await router.push(cuda_state, [hybrid, standalone], version=1)
        assert rep.per_replica_transport == {"gpu-hybrid": "cuda_ipc", "gpu-standalone": "collective"}
        assert set(rep.replica_checksums.values()) == {checksum_state(state)}
        committed: list[bool] = []

        async def on_commit() -> None:
            committed.append(True)

        rep = await router.push(cuda_state, [standalone], version=2, staged=True, on_commit=on_commit)
        assert rep.transport == "collective" and committed == [True]
        assert rep.replica_checksums["gpu-standalone"] == checksum_state(state)
        return [(await r.generate(f"g-{r.replica_id}", PROMPTS[0], GREEDY)).token_ids for r in (hybrid, standalone)]

    try:
        assert run_async(go()) == [ref, ref]
    finally:
        router.close()
        for h in (hybrid, standalone):
            run_async(h.shutdown())


@pytest.mark.slow
def test_keep_mode_push_continues_in_flight_requests_without_abort_or_resubmission_with_exact_versions(
    vllm_replicas, tiny_hf_model, hf_reference, run_async
) -> None:
    prompt, n = [1, 7, 14, 8, 18], 160
    state_old = hf_reference.perturbed_state(tiny_hf_model, seed=41)
    ref_old = hf_reference.greedy(tiny_hf_model, prompt, n)
    state_new = hf_reference.perturbed_state(tiny_hf_model, seed=42)
    r0 = vllm_replicas[0]

    async def go() -> tuple[Any, ...]:
        v = (await r0.health())["weight_version"] + 1
        await push_weights_async(state_old, [r0], version=v)
        spec = SamplingSpec(max_tokens=n, temperature=0.0, ignore_eos=True)
        running = asyncio.ensure_future(r0.generate("keep-0", prompt, spec))
        while (await r0.health())["tokens_in_flight"] < 8:
            await asyncio.sleep(0.005)
        report = await push_weights_async(state_new, [r0], version=v + 1, keep=True)
        return v, report, await running, await r0.health()

    v, report, out, health = run_async(go())
    assert set(report.replica_checksums.values()) == {checksum_state(state_new)}
    # one engine request, never aborted: it went on from where it was frozen (no second request)
    assert out.finish_reason == "length" and len(out.token_ids) == n and out.weight_version == v
    assert health["inflight"] == 0 and health["weight_version"] == v + 1
    ((split, version),) = out.info["version_splits"]
    assert version == v + 1 and 8 <= split < n
    assert list(out.token_ids[:split]) == ref_old[:split]  # before the load: the old weights' own continuation
    assert list(out.token_ids[split:]) != ref_old[split:]  # after it: the new weights
