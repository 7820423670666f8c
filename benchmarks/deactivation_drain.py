"""Cost of a hybrid deactivation's abort step, with and without a drain budget (issue #14 point 3).

Two real vLLM replicas (tiny model, one pinned core each, in Ray): ``r0`` standalone, ``r1`` hybrid. A
:class:`Rollouter` produces continuously on both; every cycle the hybrid replica is activated (add + resume), serves
for ``--serve-s`` seconds, then deactivated as the controller does (remove -> abort step -> sleep), where the abort
step is :meth:`Rollouter.drain_replicas` with budget 0 (the seed: abort everything) or ``--budget`` seconds. Budgets
alternate cycle by cycle (ABAB), so load drift on a shared machine cancels.

Printed per budget: the abort step's seconds (what the trainer waits), requests in flight on the hybrid replica,
drained (finished within the budget) / aborted, and the re-prefill tokens the aborted ones cause (prompt + prefix,
prefilled again where they continue); plus the sleep's seconds and its in-flight count (always 0).

Usage::

    python benchmarks/deactivation_drain.py --cycles 8 --budget 0.15
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

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter


def _prompts(n_prompts: int) -> list[str]:
    return [f"{(7 * i) % 100}+{(13 * i) % 100}=" for i in range(n_prompts)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=8, help="deactivations per budget")
    parser.add_argument("--budget", type=float, default=0.15, help="drain budget (s) compared with 0")
    parser.add_argument("--serve-s", type=float, default=1.5, help="seconds the hybrid replica serves per cycle")
    parser.add_argument("--max-tokens", type=int, default=128, help="response length")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent samples per replica")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from transformers import AutoTokenizer

    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    work = Path(args.workdir or tempfile.mkdtemp(prefix="lhr-drain-"))
    model_dir = build_tiny_model(work / "tiny", hidden=128, layers=2, seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = VLLMEngineConfig(
        model=str(model_dir), kv_cache_memory_bytes=128 * 2**20, max_model_len=512, run_dir=str(work / "run")
    )
    budgets = [0.0, args.budget]
    rows: dict[float, list[dict[str, Any]]] = {b: [] for b in budgets}
    with RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0)))) as rt:
        standalone, hybrid = rt.start_replicas(
            [ReplicaSpec("r0", "standalone", cfg, index=0), ReplicaSpec("r1", "hybrid", cfg, index=1)]
        )
        queue = MessageQueue(maxsize=10**6)
        rollouter = Rollouter(
            _prompts(10**5),
            lambda text: tok(text)["input_ids"],
            lambda sample: 0.0,
            queue,
            sampling=SamplingSpec(max_tokens=args.max_tokens, temperature=1.0),
            replicas=[standalone],
            max_required_samples=10**6,
            concurrent_samples_per_replica=args.concurrency,
        )
        rollouter.start()
        try:
            rollouter.add_replicas([hybrid], paused=True)
            for cycle in range(2 * args.cycles + 1):
                budget = budgets[cycle % 2]
                asyncio.run(hybrid.wake_up())
                rollouter.resume_generation_replicas(["r1"])
                time.sleep(args.serve_s)
                rollouter.remove_replicas(["r1"])
                report = rollouter.drain_replicas(["r1"], budget)
                t0 = time.monotonic()
                health = asyncio.run(hybrid.health())
                asyncio.run(hybrid.sleep())
                sleep_s = time.monotonic() - t0
                rollouter.add_replicas([hybrid], paused=True)
                if cycle == 0:
                    continue  # warm-up
                rows[budget].append({**report.to_dict(), "sleep_s": sleep_s, "inflight_at_sleep": health["inflight"]})
                print(f"cycle {cycle:2d} budget {budget:.2f}s: {report}  sleep {sleep_s:.3f}s "
                      f"in flight at sleep {health['inflight']}")  # fmt: skip
        finally:
            rollouter.stop()
    for budget in budgets:
        r = rows[budget]

        def med(key: str, r: list[dict[str, Any]] = r) -> float:
            return statistics.median(x[key] for x in r)

        def tot(key: str, r: list[dict[str, Any]] = r) -> float:
            return sum(x[key] for x in r)

        print(
            f"budget {budget:.2f}s over {len(r)} deactivations: abort step median {med('seconds'):.3f}s "
            f"(max {max(x['seconds'] for x in r):.3f}s); requests {tot('requests'):.0f}, drained {tot('drained'):.0f}, "
            f"aborted {tot('aborted'):.0f}; re-prefill tokens {tot('reprefill_tokens'):.0f} "
            f"(median {med('reprefill_tokens'):.0f}/deactivation; aborted prefixes {tot('aborted_tokens'):.0f}); "
            f"in flight at sleep: {max(x['inflight_at_sleep'] for x in r)}"
        )


if __name__ == "__main__":
    main()
