"""Does a slow tool stall generation? Multi-turn episodes streamed to a real vLLM replica (tiny model, one core, in
Ray), each model turn followed by one tool call, with a tool that sleeps 1-3 s versus one that answers at once.

One :class:`Rollouter` with an :class:`EpisodeDriver` streams episodes (``--n`` per prompt, ``--turns`` model turns
each) from an endless prompt stream, as in training: a thread stands in for an instant trainer, taking each finished
group and opening the next staleness budget (``--episodes`` = ``max_required_samples``: episodes admitted and not yet
consumed). The tool call is read by a parser registered here that calls the tool after every turn but the last (the
tiny model writes no tool-call JSON; the benchmark measures the runtime, not the model). The two tool delays
alternate on the same stream, ``--rounds`` windows each: after a switch the stream settles ``--settle`` s, then a
window of ``--window`` s counts the model tokens of the turns the replica returned between its start and end marks
(``Rollouter.take_role_window``). The figure is decode tokens/s over the windows with slow tools over the same with
instant ones; alternating them on one engine keeps a loaded host's drift out of the ratio.

An episode in its tool turn holds no engine request, so it leaves the in-flight cap (``--concurrency`` =
``concurrent_samples_per_replica``) and the replica decodes other episodes meanwhile. Enough concurrency means enough
episodes admitted to keep the cap full while the others wait (Little's law): about 3500 tokens/s / 32 tokens per turn
x 2/3 of turns followed by a tool x 2 s mean wait = ~150 episodes in tools, plus the 64 decoding and the groups whose
first episodes finished; the default 512 covers that with room, and 64 slots keep this engine busy. With episodes
holding their slot through the tool (before 2026-12-06) the same settings gave 0.41. The LAST line printed is
``decode tokens/s ratio (slow tools / instant): X.XX``.

Usage::

    python benchmarks/agentic_tool_latency.py [--concurrency 64 --episodes 512 --window 15 --rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.agentic import AgenticConfig, EpisodeDriver
from lightning_hybrid_rollout.agentic.tool_parsers import ParsedTurn, ToolCall, ToolCallParser, register_tool_parser
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue, MessageQueueClosed
from lightning_hybrid_rollout.rollout.rollouter import Rollouter

#: Seconds each tool call sleeps, drawn uniformly, per measured mode.
MODES: dict[str, tuple[float, float]] = {"instant tools": (0.0, 0.0), "tools sleeping 1-3 s": (1.0, 3.0)}
#: The current mode's delay (switched while the stream runs).
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


def run(replica: Any, tok: Any, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Stream episodes; per tool delay, the decode tokens/s and mean occupancy over its windows."""
    global DELAY
    config = AgenticConfig(
        tools=(f"{__name__}:lookup",),
        tool_parser="every_turn",
        max_turns=args.turns,
        max_episode_tokens=480,
        tool_timeout_s=10.0,
        tool_workers=args.episodes,
    )
    driver = EpisodeDriver(config, tok, max_turn_tokens=args.max_tokens)
    queue = MessageQueue(maxsize=args.episodes)  # max_required_samples: the episodes admitted and not yet consumed
    rollouter = Rollouter(
        ({"prompt": f"{(7 * i) % 100}+{(13 * i) % 100}="} for i in itertools.count()),
        lambda text: tok(text)["input_ids"],
        lambda sample: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True),
        replicas=[replica],
        n_samples_per_prompt=args.n,
        concurrent_samples_per_replica=args.concurrency,
        episodes=driver,
    )
    done = threading.Event()

    def train() -> None:  # an instant trainer: takes each group and opens the next staleness budget
        while not done.is_set():
            with contextlib.suppress(TimeoutError, MessageQueueClosed):
                queue.get_batch(args.n, timeout=0.2)
            rollouter.reset_staleness()

    trainer = threading.Thread(target=train, daemon=True)
    totals = {mode: {"tokens": 0.0, "seconds": 0.0, "decoding": 0.0, "in_tools": 0.0} for mode in MODES}
    with rollouter:
        trainer.start()
        time.sleep(args.warmup)  # the engine compiles its graphs
        for mode in [m for _ in range(args.rounds) for m in MODES]:
            DELAY = MODES[mode]
            time.sleep(args.settle)  # the episodes of the other delay leave; the stream settles
            rollouter.take_role_window()  # the start mark
            occupancy = []
            for _ in range(int(args.window / 0.5)):
                time.sleep(0.5)
                occupancy.append((rollouter.in_flight, rollouter.episodes_in_tools))
            window = rollouter.take_role_window()  # the end mark
            t = totals[mode]
            t["tokens"] += window.decoded_tokens["standalone"]
            t["seconds"] += window.end_s - window.start_s
            t["decoding"] += sum(d for d, _ in occupancy) / len(occupancy) / args.rounds
            t["in_tools"] += sum(w for _, w in occupancy) / len(occupancy) / args.rounds
        done.set()
        trainer.join()
    driver.close()
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--turns", type=int, default=3, help="model turns per episode (a tool call after each)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per model turn")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent_samples_per_replica (decoding)")
    parser.add_argument("--episodes", type=int, default=512, help="max_required_samples: episodes admitted at once")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the first mode")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after a mode switch before its window")
    parser.add_argument("--window", type=float, default=15.0, help="seconds of each measured window")
    parser.add_argument("--rounds", type=int, default=2, help="windows per mode (the modes alternate)")
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
        totals = run(replica, tok, args)
    for name, r in totals.items():
        rate = r["tokens"] / r["seconds"]
        print(
            f"{name}: {r['tokens']:.0f} model tokens in {r['seconds']:.1f} s = {rate:.1f} tokens/s "
            f"(episodes decoding {r['decoding']:.0f}, in tools {r['in_tools']:.0f}, on average)"
        )
    instant, slow = (r["tokens"] / r["seconds"] for r in totals.values())
    print(f"decode tokens/s ratio (slow tools / instant): {slow / instant:.2f}")


if __name__ == "__main__":
    main()
