"""Does a real model learn a multi-turn task here? SmolLM2-135M-Instruct, GRPO on "guess the number" episodes
(``examples/smollm2_agentic_cpu.yaml``: 1 to 8, at most 3 guesses, after a wrong guess: higher or lower than it).

Prepares the model (``lhr prepare-model``) under ``--root`` if it is missing, measures the untrained model's mean
reward on ``--episodes`` held-out episodes (greedy; their secrets fixed by a seed the training never draws), trains for
at most ``--minutes`` of wall time (or ``--max-steps``), exports the last checkpoint as a model directory, measures it
on the same episodes, and prints both with turns per episode; ``ROOT/reward_curve.png`` draws the training reward per
step with both. Not a CI test.

The LAST line is ``val reward gain: +X.XXX`` (after - before, absolute).

Usage::

    python benchmarks/agentic_learning.py [--root runs/smollm2_agentic --minutes 28 --max-steps 120 --episodes 64]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "smollm2_agentic_cpu.yaml"
#: The held-out episodes' first seed: their secrets come from seeds the training's episodes never use (seed None).
EVAL_SEED = 10_000


def write_config(root: Path, max_steps: int, minutes: int) -> tuple[Path, dict[str, Any]]:
    """``examples/smollm2_agentic_cpu.yaml`` with its paths under ``root`` and the run's limits; the callback's args."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    t = config["trainer"]
    t.update(default_root_dir=str(root), max_steps=max_steps, max_time=f"00:00:{minutes:02d}:00")
    t["logger"]["init_args"]["save_dir"] = str(root)
    cb = t["callbacks"][0]["init_args"]
    cb["rollout"]["model_path"] = str(root / "model")
    cb["agentic"]["environment"] = str(REPO / "examples" / "agentic" / "guess_env.py") + ":GuessNumber"
    # every step: a fit stopped by max_time leaves last.ckpt at its last step, not at the last multiple of 10
    t["callbacks"][1]["init_args"].update(dirpath=str(root / "checkpoints"), every_n_train_steps=1)
    path = root / "smollm2_agentic_cpu.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, cb


def evaluate(model_dir: Path, cb: dict[str, Any], episodes: int, run_dir: Path) -> dict[str, float]:
    """Mean environment reward and turns of ``episodes`` greedy episodes of the model at ``model_dir`` on one vLLM
    replica (the run's environment, budgets and stop tokens)."""
    from transformers import AutoTokenizer

    from lightning_hybrid_rollout.agentic import AgenticConfig, EpisodeDriver
    from lightning_hybrid_rollout.rollout.engine import SamplingSpec
    from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.rollouter import Rollouter
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
    from lightning_hybrid_rollout.rollout.vllm.tokenizer_info import stop_token_ids

    tok = AutoTokenizer.from_pretrained(model_dir)
    rollout = cb["rollout"]
    agentic = AgenticConfig(
        environment=cb["agentic"]["environment"],
        environment_kwargs=cb["agentic"].get("environment_kwargs") or {},
        max_turns=cb["agentic"]["max_turns"],
        max_episode_tokens=cb["agentic"]["max_episode_tokens"],
    )
    driver = EpisodeDriver(agentic, tok, max_turn_tokens=rollout["response_length"])
    cfg = VLLMEngineConfig(
        model=str(model_dir),
        kv_cache_memory_bytes=rollout["kv_cache_memory_bytes"],
        max_model_len=rollout["max_model_len"],
        run_dir=str(run_dir),
    )
    queue = MessageQueue(maxsize=episodes)
    with RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0)))) as rt:
        [replica] = rt.start_replicas([ReplicaSpec("eval", "standalone", cfg, index=0)])
        rollouter = Rollouter(
            [{"prompt": ""} for _ in range(episodes)],
            lambda text: tok(text)["input_ids"],
            lambda sample: float(sample.metadata["episode"]["env_reward"] or 0.0),
            queue,
            sampling=SamplingSpec(
                max_tokens=rollout["response_length"],
                temperature=0.0,
                seed=EVAL_SEED,
                stop_token_ids=stop_token_ids(model_dir, tok),
            ),
            replicas=[replica],
            concurrent_samples_per_replica=32,
            episodes=driver,
        )
        with rollouter:
            samples = queue.get_batch(episodes, timeout=1800)
    driver.close()
    return {
        "reward": sum(s.reward for s in samples) / len(samples),
        "turns": sum(s.metadata["episode"]["turns"] for s in samples) / len(samples),
    }


def export_last(root: Path, model_dir: Path) -> Path:
    """The last checkpoint's policy as a plain model directory (``GRPOModule.export_merged``)."""
    import torch

    from lightning_hybrid_rollout.lightning.module import GRPOModule

    ckpt = root / "checkpoints" / "last.ckpt"
    module = GRPOModule(model_path=str(model_dir))
    module.configure_model()
    module.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"])
    return module.export_merged(root / "trained")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO / "runs" / "smollm2_agentic")
    parser.add_argument("--minutes", type=int, default=28, help="wall-time limit of the fit")
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--episodes", type=int, default=64, help="held-out episodes measured before and after")
    args = parser.parse_args()
    root: Path = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        subprocess.run([sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli", "prepare-model",
                        "smollm2-135m-instruct", "--out", str(model_dir)], check=True)  # fmt: skip
    config, cb = write_config(root, args.max_steps, args.minutes)
    before = evaluate(model_dir, cb, args.episodes, root / "eval_before")
    print(f"before: reward {before['reward']:.3f}, turns/episode {before['turns']:.2f}", flush=True)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli", "fit", "--config", str(config)],
                   check=True)  # fmt: skip
    fit_minutes = (time.monotonic() - t0) / 60
    after = evaluate(export_last(root, model_dir), cb, args.episodes, root / "eval_after")
    print(f"after ({fit_minutes:.1f} min of fit): reward {after['reward']:.3f}, turns/episode {after['turns']:.2f}")
    sys.path.insert(0, str(REPO / "benchmarks"))
    from smollm2_learning import plot_reward_curve

    what = "multi-turn GRPO (guess the number)"
    png = plot_reward_curve(root, before["reward"], after["reward"], fit_minutes, root / "reward_curve.png", what)
    print(f"reward curve: {png}")
    print(f"val reward gain: {after['reward'] - before['reward']:+.3f}")


if __name__ == "__main__":
    main()
