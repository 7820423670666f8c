"""Does a slow tool stall generation? Multi-turn episodes on a real vLLM replica (tiny model, one core, in Ray), each
model turn followed by one tool call, with a tool that sleeps 1-3 s versus one that answers at once.

Each run generates the same number of episodes (``--prompts`` x ``--n``, ``--turns`` model turns each) through the
:class:`Rollouter` with an :class:`EpisodeDriver`; the tool call is read by a parser registered here that calls the
tool after every turn (the tiny model writes no tool-call JSON; the benchmark measures the runtime, not the model).
While an episode waits on its tool, its replica should serve the other episodes: the figure is the replica's decode
throughput (model tokens per second of generation wall time, tool waits included) with slow tools over instant ones.
An episode waiting on its tool still holds its in-flight slot, so the figure depends on how many episodes are in
flight against how long the waits are: with few (``--prompts 8 --concurrency 32``: 0.13 on 2 vCPUs) the replica idles
while all of them wait; with the defaults (256 in flight) the waits overlap the others' decoding. A runtime that
blocked its loop on a tool would serialize every wait (here 1037 s of tool wait summed over the run's episodes). The
LAST line printed is ``decode tokens/s ratio (slow tools / instant): X.XX``.

Usage::

    python benchmarks/agentic_tool_latency.py [--prompts 64 --n 4 --turns 3 --concurrency 256]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.agentic import AgenticConfig, EpisodeDriver
from lightning_hybrid_rollout.agentic.tool_parsers import ParsedTurn, ToolCall, ToolCallParser, register_tool_parser
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter

#: Seconds each call of the slow tool sleeps, drawn uniformly; 0 for the instant one (set per run).
DELAY: tuple[float, float] = (0.0, 0.0)
_RNG = random.Random(0)


def lookup(key: str) -> str:
    """Look a key up (sleeps ``DELAY`` seconds, like a remote service).

    Args:
        key: The key.
    """
    low, high = DELAY
    if high > 0:
        time.sleep(_RNG.uniform(low, high))
    return f"value of {key}"


@register_tool_parser("every_turn")
class EveryTurnParser(ToolCallParser):
    """Calls ``lookup`` after every model turn (the benchmark's stand-in for a model that always uses its tool)."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, calls=[ToolCall("lookup", {"key": text[:8]})], errors=[])

    def format_instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        return "Call lookup."


def run(replica: Any, tok: Any, args: argparse.Namespace, delay: tuple[float, float]) -> dict[str, float]:
    """One run of ``prompts x n`` episodes; model tokens, generation seconds and tokens/s."""
    global DELAY
    DELAY = delay
    config = AgenticConfig(
        tools=(f"{__name__}:lookup",),
        tool_parser="every_turn",
        max_turns=args.turns,
        max_episode_tokens=480,
        tool_timeout_s=10.0,
        tool_workers=args.concurrency,
    )
    driver = EpisodeDriver(config, tok, max_turn_tokens=args.max_tokens)
    total = args.prompts * args.n
    queue = MessageQueue(maxsize=total)
    rollouter = Rollouter(
        [{"prompt": f"{(7 * i) % 100}+{(13 * i) % 100}="} for i in range(args.prompts)],
        lambda text: tok(text)["input_ids"],
        lambda sample: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True),
        replicas=[replica],
        n_samples_per_prompt=args.n,
        concurrent_samples_per_replica=args.concurrency,
        episodes=driver,
    )
    t0 = time.monotonic()
    with rollouter:
        samples = queue.get_batch(total, timeout=1800)
    seconds = time.monotonic() - t0
    driver.close()
    tokens = sum(sum(s.loss_mask) for s in samples)
    window = driver.take_window().metrics()
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "env_time_s": window["rollout/env_time_s"],
        "turns_mean": window["rollout/turns_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64, help="prompt groups per run")
    parser.add_argument("--n", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--turns", type=int, default=3, help="model turns per episode (a tool call after each)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per model turn")
    parser.add_argument("--concurrency", type=int, default=256, help="episodes in flight on the replica")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    work = Path(tempfile.mkdtemp(prefix="lhr_tool_latency_"))
    model_dir = build_tiny_model(work / "tiny", hidden=128, layers=2, seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = VLLMEngineConfig(
        model=str(model_dir), kv_cache_memory_bytes=128 * 2**20, max_model_len=512, run_dir=str(work / "run")
    )
    with RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0)))) as rt:
        [replica] = rt.start_replicas([ReplicaSpec("r0", "standalone", cfg, index=0)])
        run(replica, tok, args, (0.0, 0.0))  # warm-up: compile and cache the engine's graphs
        instant = run(replica, tok, args, (0.0, 0.0))
        slow = run(replica, tok, args, (1.0, 3.0))
    for name, r in (("instant tools", instant), ("tools sleeping 1-3 s", slow)):
        print(
            f"{name}: {r['tokens']:.0f} model tokens in {r['seconds']:.1f} s = {r['tokens_per_s']:.1f} tokens/s "
            f"(turns/episode {r['turns_mean']:.1f}, tool wait {r['env_time_s']:.1f} s summed over episodes)"
        )
    print(f"decode tokens/s ratio (slow tools / instant): {slow['tokens_per_s'] / instant['tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
