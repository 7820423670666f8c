"""Does a real pretrained model learn here? SmolLM2-135M-Instruct, GRPO with dynamic scheduling on 2 CPU cores.

Prepares the model (``lhr prepare-model``) and the data (``examples/smollm2/make_data.py``) under ``--root`` if they
are missing, validates the untrained model on the held-out prompts, trains with ``examples/smollm2_cpu.yaml`` for at
most ``--minutes`` of wall time (or its ``max_steps``), validates the last checkpoint, and prints both. Not a CI test:
it takes up to ``--minutes`` + two validations.

The LAST line is ``val reward gain: +X.XXX`` (after - before, absolute; the acceptance is >= 0.15 within 30 min).

Usage::

    python benchmarks/smollm2_learning.py [--root runs/smollm2 --minutes 20 --max-steps 200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "smollm2_cpu.yaml"


def write_config(root: Path, max_steps: int, minutes: int) -> Path:
    """``examples/smollm2_cpu.yaml`` with its paths under ``root`` and the run's limits."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    t = config["trainer"]
    t.update(default_root_dir=str(root), max_steps=max_steps, max_time=f"00:00:{minutes:02d}:00")
    t["logger"]["init_args"]["save_dir"] = str(root)
    cb = t["callbacks"][0]["init_args"]
    cb["rollout"]["model_path"] = str(root / "model")
    cb["dataset"].update(path=str(root / "data" / "train.jsonl"), val_path=str(root / "data" / "val.jsonl"))
    cb["reward_funcs"] = [str(REPO / "examples" / "smollm2" / "rewards.py") + ":sum_correct"]
    t["callbacks"][1]["init_args"]["dirpath"] = str(root / "checkpoints")
    path = root / "smollm2_cpu.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _validate(config: Path, root: Path, ckpt: Path | None) -> dict[str, float]:
    """``lhr validate`` in this process; the logged ``val/*`` metrics."""
    from lightning_hybrid_rollout.lightning.cli import cli_main

    args = ["validate", "--config", str(config), f"--trainer.default_root_dir={root / 'validate'}"]
    args += ["--trainer.logger=false", "--trainer.limit_val_batches=1.0"]
    if ckpt is not None:
        args += ["--ckpt_path", str(ckpt)]
    cli = cli_main(args)
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val/")}


def plot_reward_curve(root: Path, before: float, after: float, fit_minutes: float, out: Path) -> Path:
    """``train/reward_mean`` per step (and its 5-step moving mean) from the fit's ``metrics.csv``, with the
    validation reward before and after as horizontal lines, to ``out`` (PNG)."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(root / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/reward_mean")]
    steps = [int(float(r["step"])) for r in rows]
    rewards = [float(r["train/reward_mean"]) for r in rows]
    smooth = [sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1]) for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    ax.plot(steps, rewards, color="#9ecae1", lw=1, label="train reward (per step, T=1)")
    ax.plot(steps, smooth, color="#08519c", lw=2, label="train reward (5-step mean)")
    ax.axhline(before, color="#d62728", ls="--", lw=1.2, label=f"val reward before: {before:.3f}")
    ax.axhline(after, color="#2ca02c", ls="--", lw=1.2, label=f"val reward after: {after:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(0, 1)
    ax.set_title(f"SmolLM2-135M-Instruct, GRPO on 2 CPU cores ({fit_minutes:.0f} min fit)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs/smollm2")
    parser.add_argument("--minutes", type=float, default=20.0, help="wall-time limit of the fit")
    parser.add_argument("--max-steps", type=int, default=200)
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    lhr = [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli"]
    if not (root / "model" / "config.json").exists():
        subprocess.run([*lhr, "prepare-model", "smollm2-135m-instruct", "--out", str(root / "model")], check=True)
    if not (root / "data" / "train.jsonl").exists():
        subprocess.run(
            [sys.executable, str(REPO / "examples/smollm2/make_data.py"), "--out", str(root / "data")], check=True
        )

    minutes = int(args.minutes)
    config = write_config(root, args.max_steps, minutes)
    before = _validate(config, root, None)
    print(f"before: {json.dumps(before)}", flush=True)
    t0 = time.monotonic()
    fit = [*lhr, "fit", "--config", str(config)]
    subprocess.run(fit, check=True, cwd=REPO)
    fit_s = time.monotonic() - t0
    ckpts = sorted((root / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    if not ckpts:
        raise SystemExit(f"the fit wrote no checkpoint under {root / 'checkpoints'}")
    ckpt = ckpts[-1]
    after = _validate(config, root, ckpt)
    print(f"after: {json.dumps(after)}", flush=True)
    gain = after["val/reward"] - before["val/reward"]
    png = plot_reward_curve(root, before["val/reward"], after["val/reward"], fit_s / 60, root / "reward_curve.png")
    print(f"reward curve: {png}")
    print(f"fit wall time: {fit_s / 60:.1f} min (limit {minutes} min)")
    print(f"val reward: {before['val/reward']:.3f} -> {after['val/reward']:.3f}")
    print(f"val reward gain: {gain:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
