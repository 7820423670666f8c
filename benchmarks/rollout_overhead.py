"""Overhead of the rollout data plane: Rollouter + LoadBalancer vs calling the same engines directly.

Two real vLLM replicas (tiny model, one pinned core each, in Ray) serve the same requests (same prompts, same
per-request seeds, so the same tokens) at the same concurrency, two ways:

- **direct**: asyncio workers call ``ReplicaHandle.generate_group`` (one call per prompt group, as the rollouter
  does) in a loop, ``concurrency_per_replica // n`` workers per replica, so the same number of samples in flight;
- **rollouter**: the :class:`Rollouter` (its own loop thread, load balancer, staleness bookkeeping, utilization
  history, reward, message queue) with ``concurrent_samples_per_replica`` = the same number; the trainer thread
  waits on the queue.

Runs come in adjacent pairs, alternating which goes first (ABBA), so load drift on a shared machine cancels; the
figure is the median over pairs of (rollouter tokens/s / direct tokens/s). The driver process's CPU seconds per
1k tokens are printed for both modes, and the pure data-plane cost per sample is measured with instant in-process
engines (no noise from the machine). The LAST line printed is ``ratio: X.XX`` (target >= 0.97).

Usage::

    python benchmarks/rollout_overhead.py --requests 512 --max-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.rollout.engine import GenerationResult, GroupRequest, SamplingSpec, generate_group
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter


def _prompts(n_prompts: int) -> list[str]:
    return [f"{(7 * i) % 100}+{(13 * i) % 100}=" for i in range(n_prompts)]


async def _direct(replicas: list[Any], work: list[list[GroupRequest]], per_replica: int) -> int:
    """Same requests straight to the handles, one ``generate_group`` call per prompt group (as the rollouter makes),
    with ``per_replica`` samples in flight per replica (``per_replica // n`` group workers); returns tokens."""
    queue: asyncio.Queue[list[GroupRequest]] = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)
    tokens = 0

    async def worker(replica: Any) -> None:
        nonlocal tokens
        while True:
            try:
                group = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            for result in await generate_group(replica, group):
                assert isinstance(result, GenerationResult), result
                tokens += len(result.token_ids)

    workers = max(1, per_replica // len(work[0]))
    await asyncio.gather(*(worker(r) for r in replicas for _ in range(workers)))
    return tokens


def _run_direct(replicas, prompts, tokenize, args, tag: str) -> tuple[float, int]:
    work = []
    for g, text in enumerate(prompts):
        ids = tokenize(text)
        group = []
        for k in range(args.n):
            seed = args.seed + g * args.n + k
            spec = SamplingSpec(max_tokens=args.max_tokens, temperature=1.0, seed=seed)
            group.append((f"{tag}-g{g}-{k}:0", ids, spec))
        work.append(group)
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = asyncio.run(_direct(replicas, work, args.concurrency_per_replica))
    return time.perf_counter() - t0, tokens, time.process_time() - c0


def _run_rollouter(replicas, prompts, tokenize, args) -> tuple[float, int]:
    total = len(prompts) * args.n
    queue = MessageQueue(maxsize=total)
    ro = Rollouter(
        prompts,
        tokenize,
        lambda s: float(len(s.response_token_ids)),
        queue,
        sampling=SamplingSpec(max_tokens=args.max_tokens, temperature=1.0, seed=args.seed),
        replicas=replicas,
        n_samples_per_prompt=args.n,
        max_required_samples=total,
        concurrent_samples_per_replica=args.concurrency_per_replica,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    ro.start()
    try:
        batch = queue.get_batch(total, timeout=600)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        ro.stop()
    return dt, sum(s.response_length for s in batch), cpu


class _InstantReplica:
    """An in-process engine that answers at once (``max_tokens`` tokens): isolates the data plane's own cost."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.is_alive = True

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        await asyncio.sleep(0)
        n = sampling.max_tokens
        return GenerationResult(request_id, [5] * n, [-1.0] * n, "length", 0, self.replica_id)

    async def abort(self, request_ids: list[str]) -> None:
        return None


def _data_plane_cost_us(samples: int, n: int, per_replica: int) -> float:
    """Microseconds of rollouter + load balancer + queue work per sample, with instant engines."""
    queue = MessageQueue(maxsize=samples)
    ro = Rollouter(
        [f"{i}+{i}=" for i in range(samples // n)],
        lambda text: [ord(c) for c in text],
        lambda s: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=8),
        replicas=[_InstantReplica("a"), _InstantReplica("b")],
        n_samples_per_prompt=n,
        max_required_samples=samples,
        concurrent_samples_per_replica=per_replica,
    )
    t0 = time.perf_counter()
    with ro:
        queue.get_batch(samples, timeout=600)
        dt = time.perf_counter() - t0
    return dt / samples * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256, help="samples per run (prompts x n)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency-per-replica", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=8, help="(direct, rollouter) pairs")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--workdir", default=None, help="model + run dir (default: a temp dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from transformers import AutoTokenizer

    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    work = Path(args.workdir or tempfile.mkdtemp(prefix="lhr-bench-"))
    model_dir = build_tiny_model(work / "tiny", hidden=128, layers=2, seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)

    def tokenize(text: str) -> list[int]:
        return tok(text)["input_ids"]

    prompts = _prompts(args.requests // args.n)
    cfg = VLLMEngineConfig(
        model=str(model_dir), kv_cache_memory_bytes=128 * 2**20, max_model_len=512, run_dir=str(work / "run")
    )
    with RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0)))) as rt:
        replicas = rt.start_replicas(
            [ReplicaSpec("r0", "standalone", cfg, index=0), ReplicaSpec("r1", "standalone", cfg, index=1)]
        )
        print(f"replicas up; {len(prompts)} prompts x {args.n} = {len(prompts) * args.n} requests, "
              f"max_tokens={args.max_tokens}, concurrency {args.concurrency_per_replica}/replica")  # fmt: skip
        _run_direct(replicas, prompts[:8], tokenize, args, "warm")  # compile / logprob warm-up
        rates: dict[str, list[float]] = {"direct": [], "rollouter": []}
        cpu_per_ktok: dict[str, list[float]] = {"direct": [], "rollouter": []}
        pair_ratios = []
        for rep in range(args.repeats):
            order = ["direct", "rollouter"] if rep % 2 == 0 else ["rollouter", "direct"]
            pair = {}
            for mode in order:
                if mode == "direct":
                    dt, tokens, cpu = _run_direct(replicas, prompts, tokenize, args, f"d{rep}")
                else:
                    dt, tokens, cpu = _run_rollouter(replicas, prompts, tokenize, args)
                pair[mode] = tokens / dt
                rates[mode].append(tokens / dt)
                cpu_per_ktok[mode].append(cpu / tokens * 1000)
                print(f"pair {rep} {mode:9s}: {tokens} tokens in {dt:.2f} s = {tokens / dt:,.0f} tok/s, "
                      f"driver cpu {cpu:.2f} s")  # fmt: skip
            pair_ratios.append(pair["rollouter"] / pair["direct"])
    cost = statistics.median(_data_plane_cost_us(4096, args.n, args.concurrency_per_replica) for _ in range(3))
    for mode in ("direct", "rollouter"):
        r, c = rates[mode], statistics.median(cpu_per_ktok[mode])
        print(f"{mode} tokens/s: median {statistics.median(r):,.0f} (min {min(r):,.0f}, max {max(r):,.0f}); "
              f"driver cpu {c:.3f} s / 1k tokens")  # fmt: skip
    print(f"pair ratios: {', '.join(f'{x:.2f}' for x in pair_ratios)}")
    print(f"data-plane cost with instant engines: {cost:.0f} us / sample")
    print(f"ratio: {statistics.median(pair_ratios):.2f}")


if __name__ == "__main__":
    main()
