"""Weight-sync bandwidth: trainer → 2 vLLM-on-CPU replicas (Ray object store + shared-memory staging), vs memcpy.

Builds a random Llama of about 85 MB of float32 (hidden 512, 5 layers; ``--hidden/--layers`` to change), starts a
private Ray with two replicas (one pinned core each), and pushes the full weights ``--repeats`` times with
:func:`push_weights_async` (every push is verified: each replica's checksum must equal the trainer's).

How it counts:

- **achieved GB/s** = serialized bytes of the full weights × number of replicas / wall seconds of the whole push
  (trainer-side bucketing + hashing + ``ray.put``, fan-out, each replica copying into its staging file, vLLM's
  in-place reload, the worker's hashing and read-back, all replicas done). Median over the timed pushes (the first
  push warms the object store and is reported but not counted).
- **memcpy GB/s** = tensors of the same shapes and dtypes copied once, on one thread, in a fresh interpreter, two
  ways: ``torch.clone`` of every tensor into fresh pages (a fresh destination, as a receiver needs; glibc's mmap
  threshold is pinned there, else after a few frees a clone lands in already-mapped memory and reads 15-17 GB/s
  instead of 2-3) and ``Tensor.copy_`` into preallocated warm tensors (raw memory bandwidth). Best of 10 runs each
  (a clone into fresh pages is noisy on this VM: 0.24-2.9 GB/s from run to run, the first runs of a process the
  slowest), measured before and after the pushes and averaged (the host's speed drifts).

The LAST line is ``ratio: X.XX`` = achieved / clone memcpy GB/s (issue #14's target >= 0.85); the line before it
gives the ratio against warm ``copy_`` too.

``--lora`` measures LoRA's adapter-only sync instead (issue #40) on SmolLM2-135M-Instruct (prepared once under
``--out``, or ``$LHR_SMOLLM2_DIR``), r=16 on ``q_proj``/``k_proj``/``v_proj``/``o_proj``, float32 like a CPU run: one
plain replica takes the full merged weights (``rollout.lora_sync: merged``), one replica with vLLM's LoRA takes the
adapter alone (``adapter``), each ``--repeats`` verified pushes (median seconds). Then a hybrid activation of each
(``sleep``, ``wake_up`` and the sync of a new version): with the kept base only the adapter moves, without it the full
weights do. Its LAST line is ``ratio: X.X`` = full-sync seconds / adapter-sync seconds; the lines before it give the
bytes and activation ratios.

``--delta`` measures the exact delta sync instead (issue #46, ``rollout.weight_encoding: delta``) on
SmolLM2-135M-Instruct (``$LHR_SMOLLM2_DIR``, else ``runs/smollm2/model`` when prepared, else prepared under ``--out``),
fully fine-tuned as ``examples/smollm2_cpu.yaml`` trains it: float32 weights, AdamW lr 3e-5, betas (0.9, 0.99),
gradient clipping 1.0, each step a GRPO-style policy-gradient step on sum prompts answered by the replica (4 prompts
x 4 samples, group-normalized rewards). Two replicas hold the weights: ``float32`` (the example's ``rollout.dtype``)
and ``bfloat16``. After each of ``--repeats`` steps every replica takes the new version three ways, each verified by
checksum: as a delta (``weight_encoding: delta``: the encode on the trainer, the push, the apply), in full as the
trainer holds it (``weight_encoding: full``) and in full in the engine's dtype (what ``delta`` sends a replica it
cannot send a delta to). It prints, per engine dtype, the changed fraction, the bytes and the median seconds of each;
the LAST line is ``ratio: X.XX`` = bytes of a ``full`` sync / bytes of a delta sync at the example's float32 (the line
before it: at bfloat16).

Usage::

    python benchmarks/weight_sync.py [--hidden 512 --layers 5 --repeats 5 --bucket-mb 32]
    python benchmarks/weight_sync.py --transport ray     # the path replicas on other nodes take
    python benchmarks/weight_sync.py --staged            # staged pushes: how long generation is paused
    python benchmarks/weight_sync.py --lora --repeats 3  # adapter-only vs full sync of SmolLM2-135M (r=16)
    python benchmarks/weight_sync.py --delta --repeats 4  # delta vs full sync of SmolLM2-135M, full fine-tuning
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The memcpy baseline, run in a fresh interpreter (:func:`memcpy_gbps`): argv[1] the tensors' shapes and dtypes as
#: JSON, argv[2] the runs; prints ``{"clone": GB/s, "copy": GB/s, "clones": [...]}``.
_BASELINE = r"""
import ctypes, ctypes.util, json, sys, time
import torch

specs, runs = json.loads(sys.argv[1]), int(sys.argv[2])
libc = ctypes.util.find_library("c")
# glibc serves a large allocation from fresh pages (mmap) until a free raises its dynamic threshold; after that a
# clone can land in freed, already-mapped memory and run at warm-copy speed (15-17 GB/s against 2-3 here). Pinning
# the threshold at its initial 128 KiB keeps every clone's destination fresh, as a receiver's is.
pinned = bool(libc) and ctypes.CDLL(libc).mallopt(-3, 128 * 1024) == 1  # M_MMAP_THRESHOLD
torch.set_num_threads(1)  # memcpy is one thread; torch's 2-thread copies collapse when a core is busy
tensors = [torch.randn(shape).to(getattr(torch, dtype)) for shape, dtype in specs]
nbytes = sum(t.numel() * t.element_size() for t in tensors)
dst = [torch.empty_like(t) for t in tensors]
clones, copies = [], []
for _ in range(runs):
    t0 = time.perf_counter()
    out = [t.clone() for t in tensors]
    clones.append(nbytes / (time.perf_counter() - t0) / 1e9)
    del out
    t0 = time.perf_counter()
    for d, t in zip(dst, tensors):
        d.copy_(t)
    copies.append(nbytes / (time.perf_counter() - t0) / 1e9)
print(json.dumps({"clone": max(clones), "copy": max(copies), "clones": clones, "pinned": pinned}))
"""


def memcpy_gbps(tensors: list[Any], runs: int = 10) -> dict[str, Any]:
    """Copying ``tensors`` once, on one thread, in a fresh interpreter (its allocator in a known state): ``clone``
    (GB/s into fresh pages, best of ``runs``), ``copy`` (warm ``copy_`` into preallocated tensors, best of ``runs``),
    ``clones`` (every clone run) and ``pinned`` (whether glibc's mmap threshold could be pinned)."""
    specs = [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in tensors]
    out = subprocess.run(
        [sys.executable, "-c", _BASELINE, json.dumps(specs), str(runs)], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


async def bench(args: argparse.Namespace, model_dir: Path, rt: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from lightning_hybrid_rollout.rollout.engine import SamplingSpec
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
    from lightning_hybrid_rollout.rollout.weights.format import checksum_state
    from lightning_hybrid_rollout.rollout.weights.push import push_weights_async

    cfg = VLLMEngineConfig(
        model=str(model_dir), kv_cache_memory_bytes=64 * 2**20, max_model_len=256, run_dir=str(args.out / "run")
    )
    t0 = time.perf_counter()
    replicas = await rt.start_replicas_async(
        [ReplicaSpec(f"r{i}", "standalone", cfg, index=i) for i in range(args.replicas)]
    )
    print(
        f"replicas up in {time.perf_counter() - t0:.1f} s: "
        + ", ".join(
            f"{r.replica_id} cores {r.info['cores']} engine start {r.info['timings'].get('engine_start_s', 0):.1f} s"
            for r in replicas
        )
    )

    async def generation_speed(tag: str) -> None:
        """64 concurrent fixed-length requests per replica, after a warm-up round (for the record)."""
        spec = SamplingSpec(max_tokens=64, temperature=1.0, ignore_eos=True)
        for rnd in range(2):
            t0 = time.perf_counter()
            res = await asyncio.gather(
                *(
                    r.generate(f"gen-{tag}-{rnd}-{r.replica_id}-{i}", [1, 5 + i % 10, 14], spec)
                    for r in replicas
                    for i in range(64)
                )
            )
            dt = time.perf_counter() - t0
        ntok = sum(len(x.token_ids) for x in res)
        print(f"generation {tag}: {ntok} tokens in {dt:.2f} s = {ntok / dt:.0f} tok/s over {len(replicas)} replicas")

    await generation_speed("before the pushes")

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    named = [(k, v.detach().contiguous()) for k, v in hf.state_dict().items()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    t0 = time.perf_counter()
    expected = checksum_state(named)
    hash_s = time.perf_counter() - t0
    print(f"weights: {len(named)} tensors, {nbytes / 1e6:.1f} MB; trainer-side checksum {hash_s * 1e3:.0f} ms")
    before = memcpy_gbps([t for _, t in named])

    reports = []
    for i in range(args.repeats + 1):
        with torch.no_grad():
            for _, t in named:
                t.mul_(1.0001)  # new weights every push
        rep = await push_weights_async(
            named,
            replicas,
            version=i + 1,
            bucket_bytes=args.bucket_mb * 2**20,
            transport=args.transport,
            staged=args.staged,
        )
        reports.append(rep)
        assert set(rep.replica_checksums.values()) == {rep.checksum} != {expected}
        info = [(await r.health())["last_update"] for r in replicas]
        print(
            f"push {i + 1}{' (warm-up, not counted)' if i == 0 else ''}: {rep.seconds * 1e3:.0f} ms, "
            f"{rep.gb_per_s:.2f} GB/s, {rep.num_buckets} buckets, {rep.transport}; "
            f"trainer-side write {rep.prepare_seconds * 1e3:.0f} ms; "
            + "; ".join(
                f"{rid} {s * 1e3:.0f} ms (in engine {u.get('seconds', 0) * 1e3:.0f}: "
                + ", ".join(f"{k} {u.get(k + '_s', 0) * 1e3:.0f}" for k in ("begin", "stage", "load", "hash", "finish"))
                + f" ms, {u.get('page_faults', 0)} page faults, {u.get('mode')})"
                for (rid, s), u in zip(rep.per_replica_seconds.items(), info)
            )
        )
    after = memcpy_gbps([t for _, t in named])
    await generation_speed("after the pushes")  # the reloaded (re-packed) weights serve as fast as the originals
    # the baseline before and after the pushes, averaged: a host whose speed drifts during the pushes moves both sides
    clone_gbps, copy_gbps = (before["clone"] + after["clone"]) / 2, (before["copy"] + after["copy"]) / 2
    timed = reports[1:]
    secs = statistics.median(r.seconds for r in timed)
    achieved = nbytes * len(replicas) / secs / 1e9
    wire = timed[0].bytes
    print(
        f"bytes per replica {wire / 1e6:.1f} MB (tensor data {nbytes / 1e6:.1f} MB), replicas {len(replicas)}, "
        f"median push {secs * 1e3:.0f} ms (best {min(r.seconds for r in timed) * 1e3:.0f} ms)"
    )
    if args.staged:
        commit = statistics.median(max(r.per_replica_commit_seconds.values()) for r in timed)
        print(f"staged: median commit (generation paused) {commit * 1e3:.0f} ms = {commit / secs:.2f} of the push")
    print(f"achieved: {achieved:.2f} GB/s (= tensor bytes x replicas / median push seconds)")
    print(
        f"memcpy:   {clone_gbps:.2f} GB/s torch.clone into fresh pages (before the pushes {before['clone']:.2f}, "
        f"after {after['clone']:.2f}; every run: {', '.join(f'{x:.2f}' for x in before['clones'] + after['clones'])}"
        f"{'' if before['pinned'] and after['pinned'] else '; mmap threshold NOT pinned: a clone may reuse pages'}), "
        f"{copy_gbps:.2f} GB/s warm copy_ (same shapes, best of 10, each in a fresh interpreter; mean of the two)"
    )
    print(f"ratio vs warm copy_: {achieved / copy_gbps:.2f}")
    print(f"ratio: {achieved / clone_gbps:.2f}")


LORA_PEFT = {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
"""The adapter of the ``--lora`` measurement."""


async def bench_lora(args: argparse.Namespace, model_dir: Path, rt: Any) -> None:
    """Adapter-only vs full sync, and a hybrid activation with and without the kept base (see the module doc)."""
    import torch
    from transformers import AutoModelForCausalLM

    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
    from lightning_hybrid_rollout.rollout.weights.push import push_weights_async
    from lightning_hybrid_rollout.training.lora import (
        adapter_groups,
        engine_lora_config,
        inject_lora,
        lora_config_from,
        merged_state_dict,
    )

    config = lora_config_from(LORA_PEFT)
    policy = inject_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), config)
    g = torch.Generator().manual_seed(0)
    lora_params = [p for n, p in policy.named_parameters() if ".lora_" in n]
    common = {"model": str(model_dir), "kv_cache_memory_bytes": 64 * 2**20, "max_model_len": 256}
    plain = VLLMEngineConfig(**common, run_dir=str(args.out / "run"))
    lora = VLLMEngineConfig(**common, run_dir=str(args.out / "run"), lora=engine_lora_config(config))
    t0 = time.perf_counter()
    full_rep, lora_rep = await rt.start_replicas_async(
        [ReplicaSpec("full", "hybrid", plain, index=0), ReplicaSpec("adapter", "hybrid", lora, index=1)]
    )
    print(f"replicas up in {time.perf_counter() - t0:.1f} s (one core each): 'full' plain, 'adapter' with LoRA on")

    def next_version() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        """A new adapter (a training step's worth of change): its tensors, and the merged full weights."""
        with torch.no_grad():
            for p in lora_params:
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
        adapter = [
            (grp.name, t.detach().clone())
            for grp in adapter_groups(policy, policy.state_dict().items())
            for _, t in grp.parts
        ]
        return adapter, list(merged_state_dict(policy).items())

    async def push(items: list[tuple[str, Any]], replica: Any, version: int) -> Any:
        rep = await push_weights_async(items, [replica], version=version, bucket_bytes=args.bucket_mb * 2**20)
        assert set(rep.replica_checksums.values()) == {rep.checksum}  # verified
        return rep

    full_s, adapter_s, full_b, adapter_b = [], [], 0, 0
    for i in range(args.repeats + 1):
        adapter, merged = next_version()
        rf = await push(merged, full_rep, i + 1)
        ra = await push(adapter, lora_rep, i + 1)
        full_b, adapter_b = rf.bytes, ra.bytes
        if i:  # the first push warms the staging files up
            full_s.append(rf.seconds)
            adapter_s.append(ra.seconds)
        print(
            f"sync {i + 1}{' (warm-up, not counted)' if i == 0 else ''}: full {rf.seconds * 1e3:.0f} ms "
            f"({rf.bytes / 1e6:.1f} MB), adapter {ra.seconds * 1e3:.1f} ms ({ra.bytes / 1e6:.2f} MB)"
        )
    activation = {}
    for name, replica, items in (("full", full_rep, merged), ("adapter", lora_rep, adapter)):
        await replica.sleep()
        t0 = time.perf_counter()
        await replica.wake_up()
        wake_s = time.perf_counter() - t0
        await push(items, replica, args.repeats + 2)
        activation[name] = time.perf_counter() - t0
        print(f"activation ({name}): wake {wake_s * 1e3:.1f} ms + sync = {activation[name] * 1e3:.0f} ms")
    fs, ad = statistics.median(full_s), statistics.median(adapter_s)
    print(
        f"full sync: {full_b / 1e6:.1f} MB in {fs * 1e3:.0f} ms; adapter sync: {adapter_b / 1e6:.2f} MB in "
        f"{ad * 1e3:.1f} ms (medians of {len(full_s)}, SmolLM2-135M float32, r=16 on q/k/v/o)"
    )
    print(f"bytes ratio (full / adapter): {full_b / adapter_b:.1f}")
    print(
        f"activation ratio (without / with kept base): {activation['full'] / activation['adapter']:.1f} "
        "(CPU engines park: the wake is free, the sync is the difference)"
    )
    print(f"ratio: {fs / ad:.1f}")


DELTA_LR = 3e-5
"""The SmolLM2 example's learning rate (``examples/smollm2_cpu.yaml``: ``model.init_args.lr``)."""


async def bench_delta(args: argparse.Namespace, model_dir: Path, rt: Any) -> None:
    """Delta vs full syncs of SmolLM2 after real optimizer steps, float32 and bfloat16 engines (see the module doc)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_hybrid_rollout.rollout.engine import SamplingSpec
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
    from lightning_hybrid_rollout.rollout.weights.router import WeightRouter

    common = {"model": str(model_dir), "kv_cache_memory_bytes": 64 * 2**20, "max_model_len": 256}
    run_dir = str(args.out / "run")
    specs = [
        ReplicaSpec(dtype, "standalone", VLLMEngineConfig(**common, run_dir=run_dir, dtype=dtype), index=i)
        for i, dtype in enumerate(("float32", "bfloat16"))
    ]
    t0 = time.perf_counter()
    replicas = await rt.start_replicas_async(specs)
    print(f"replicas up in {time.perf_counter() - t0:.1f} s (one core each): engine dtypes float32, bfloat16")
    tok = AutoTokenizer.from_pretrained(model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(policy.parameters(), lr=DELTA_LR, betas=(0.9, 0.99), weight_decay=0.0)
    rng = random.Random(0)
    bb = args.bucket_mb * 2**20
    delta = {r.replica_id: WeightRouter(args.transport, "delta") for r in replicas}
    full = WeightRouter(args.transport, "full")

    def weights() -> list[tuple[str, Any]]:
        return [(k, v.detach()) for k, v in policy.state_dict().items()]

    async def rl_step(step: int) -> float:
        """One GRPO-style step: 4 sum prompts x 4 samples from the float32 replica, rewards normalized per group."""
        spec = SamplingSpec(max_tokens=24, temperature=1.0, stop_token_ids=[tok.eos_token_id])
        rows, adv = [], []
        for p in range(4):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            msgs = [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
            prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
            outs = await asyncio.gather(*(replicas[0].generate(f"s{step}-{p}-{i}", prompt, spec) for i in range(4)))
            rewards = [float(str(a + b) in tok.decode(o.token_ids)) for o in outs]
            mean, std = statistics.mean(rewards), statistics.pstdev(rewards)
            for o, rw in zip(outs, rewards):
                rows.append((prompt, list(o.token_ids)))
                adv.append((rw - mean) / (std + 1e-4) if std > 0 else rw - 0.5)  # a flat group still pushes
        opt.zero_grad()
        for (prompt, resp), a in zip(rows, adv):
            ids = torch.tensor([prompt + resp])
            logp = torch.log_softmax(policy(ids).logits[0, :-1].float(), -1)
            pos = torch.arange(len(prompt) - 1, ids.shape[1] - 1)
            tok_logp = logp[pos, ids[0, len(prompt) :]]
            loss = -(a * tok_logp.sum()) / len(rows)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        return sum(1 for x in adv if x > 0) / len(adv)

    # version 1: each replica in full, the delta state primed
    for r in replicas:
        await full.push(weights(), [r], 1, bucket_bytes=bb)
        await delta[r.replica_id].push(weights(), [r], 1, bucket_bytes=bb)
    rows: dict[str, list[dict[str, float]]] = {r.replica_id: [] for r in replicas}
    for step in range(args.repeats):
        t = time.perf_counter()
        await rl_step(step)
        train_s = time.perf_counter() - t
        v = step + 2
        for r in replicas:
            router = delta[r.replica_id]
            d = await router.push(weights(), [r], v, bucket_bytes=bb)  # the delta from v-1
            f = await full.push(weights(), [r], v, bucket_bytes=bb)  # weight_encoding: full (drops the copy)
            assert router.delta is not None
            router.delta.forget(r)  # so this push is delta's full sync in the engine's dtype (copy rebuilt)
            e = await router.push(weights(), [r], v, bucket_bytes=bb)
            for rep in (d, f, e):
                assert set(rep.replica_checksums.values()) == {rep.checksum}  # every sync verified
            assert e.encoding == "full" and f.encoding == "full"
            rows[r.replica_id].append(
                {
                    "fraction": float(d.changed_fraction or 0.0),
                    "delta_b": d.bytes,
                    "delta_s": d.seconds,
                    "encode_s": d.encode_seconds,
                    "full_b": f.bytes,
                    "full_s": f.seconds,
                    "engine_b": e.bytes,
                    "engine_s": e.seconds,
                    "delta_kind": d.encoding == "delta",
                }
            )
            print(
                f"step {step + 1} ({train_s:.1f} s) {r.replica_id:8s}: changed {d.changed_fraction:.4f}, "
                f"{d.encoding} {d.bytes / 1e6:.1f} MB in {d.seconds:.2f} s (encode {d.encode_seconds:.2f} s) | "
                f"full {f.bytes / 1e6:.1f} MB in {f.seconds:.2f} s | full in engine dtype {e.bytes / 1e6:.1f} MB in "
                f"{e.seconds:.2f} s"
            )
    ratios = {}
    for rid, rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        ratios[rid] = med["full_b"] / med["delta_b"]
        print(
            f"{rid} engine (medians of {len(rs)} steps, lr {DELTA_LR:g}, transport {args.transport}): changed fraction "
            f"{med['fraction']:.4f}; delta {med['delta_b'] / 1e6:.1f} MB in {med['delta_s']:.2f} s (encode "
            f"{med['encode_s']:.2f} s; a delta in {sum(x['delta_kind'] for x in rs)}/{len(rs)} steps); full "
            f"(trainer float32) {med['full_b'] / 1e6:.1f} MB in {med['full_s']:.2f} s; full in the engine's dtype "
            f"{med['engine_b'] / 1e6:.1f} MB in {med['engine_s']:.2f} s"
        )
    print(f"bytes ratio (full / delta), bfloat16 engine: {ratios['bfloat16']:.2f}")
    print(f"ratio: {ratios['float32']:.2f}")


def _main_delta(args: argparse.Namespace) -> None:
    from lightning_hybrid_rollout.models.pretrained import prepare_model
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    prepared = Path("runs/smollm2/model")
    target = os.environ.get("LHR_SMOLLM2_DIR") or (
        prepared if (prepared / "config.json").exists() else args.out / "smollm2-135m-instruct"
    )
    model_dir = prepare_model("smollm2-135m-instruct", target)
    print(f"model ready in {time.perf_counter() - t0:.1f} s at {model_dir}")
    rt = RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0))), object_store_memory=768 * 2**20)
    rt.start()
    try:
        asyncio.run(bench_delta(args, model_dir, rt))
    finally:
        rt.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=32)
    parser.add_argument("--transport", choices=("auto", "ray", "node_shm"), default="auto")
    parser.add_argument(
        "--staged", action="store_true", help="staged pushes (replicas serve while staging; prints the commit share)"
    )
    parser.add_argument(
        "--lora", action="store_true", help="adapter-only vs full sync of SmolLM2-135M-Instruct (r=16 on q/k/v/o)"
    )
    parser.add_argument(
        "--delta", action="store_true", help="delta vs full syncs of SmolLM2-135M-Instruct after real optimizer steps"
    )
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "lhr-bench-weight-sync")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.lora:
        _main_lora(args)
        return
    if args.delta:
        _main_delta(args)
        return

    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = build_tiny_model(
        args.out / f"llama-h{args.hidden}-l{args.layers}", hidden=args.hidden, layers=args.layers
    )
    print(f"model ready in {time.perf_counter() - t0:.1f} s at {model_dir}")
    rt = RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0))), object_store_memory=768 * 2**20)
    rt.start()
    print(f"ray up in {rt.init_seconds:.1f} s")
    try:
        asyncio.run(bench(args, model_dir, rt))
    finally:
        rt.shutdown()


def _main_lora(args: argparse.Namespace) -> None:
    from lightning_hybrid_rollout.models.pretrained import prepare_model
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = prepare_model(
        "smollm2-135m-instruct", os.environ.get("LHR_SMOLLM2_DIR") or args.out / "smollm2-135m-instruct"
    )
    print(f"model ready in {time.perf_counter() - t0:.1f} s at {model_dir}")
    rt = RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0))), object_store_memory=768 * 2**20)
    rt.start()
    try:
        asyncio.run(bench_lora(args, model_dir, rt))
    finally:
        rt.shutdown()


if __name__ == "__main__":
    main()
