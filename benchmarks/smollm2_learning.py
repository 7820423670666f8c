"""Does a real pretrained model learn here, fully fine-tuned and as a LoRA adapter? SmolLM2-135M-Instruct, GRPO with
dynamic scheduling on 2 CPU cores.

Prepares the model (``lhr prepare-model``) and the data (``examples/smollm2/make_data.py``) under ``--root`` if they
are missing, validates the untrained model once on the held-out prompts, then for each arm of ``--arms`` fits from that
same model and data for at most ``--minutes`` of wall time (or ``--max-steps``) in ``ROOT/<arm>`` and validates the
arm's last checkpoint. Arms: ``full`` trains the whole model (``examples/smollm2_cpu.yaml``), ``lora`` an r=16 adapter
with adapter-only weight syncs (``examples/smollm2_lora_cpu.yaml``). The "before" validation uses the ``full`` arm's
config: the base model, which is also what an untrained adapter computes (``lora_B`` starts at zero). Not a CI test:
it takes up to ``--minutes`` per arm + one validation per arm + one.

Each arm prints ``before -> after``, the steps it did and its fit minutes, and draws ``ROOT/<arm>/reward_curve.png``.
With one arm the LAST line is ``val reward gain: +X.XXX`` (after - before, absolute; the acceptance is >= 0.15 within
30 min). With both arms it is ``lora gain - full gain: +X.XXX (noise: +-Y.YYY)``. Both gains share the one "before",
which cancels, so the difference is ``after_lora - after_full`` and its noise is the standard error of that difference
of two independent means of ``N = val prompts x val_n`` rewards in [0, 1]::

    noise = sqrt(a_full * (1 - a_full) / N + a_lora * (1 - a_lora) / N)

``a * (1 - a)`` is the variance of a 0/1 reward of mean ``a`` (``sum_correct``'s) and bounds any [0, 1] reward's. The
``val_n`` samples of one prompt are counted as independent, so the noise is a lower bound where prompts differ in
difficulty. With 64 prompts x 4 samples and both arms near 0.7 it is about +-0.04.

Usage::

    python benchmarks/smollm2_learning.py [--root runs/smollm2 --minutes 20 --max-steps 200 --arms full,lora]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ARMS = {
    "full": REPO / "examples" / "smollm2_cpu.yaml",
    "lora": REPO / "examples" / "smollm2_lora_cpu.yaml",
}
"""Each arm's example config (the same task, model and data; the fine-tune differs)."""


def write_config(root: Path, max_steps: int, minutes: int, arm: str = "full") -> Path:
    """``arm``'s example config with the model and data under ``root``, its outputs under ``root / arm`` and the run's
    limits; written to ``root / arm / <the example's name>``."""
    import yaml

    config = yaml.safe_load(ARMS[arm].read_text())
    run_dir = root / arm
    t = config["trainer"]
    t.update(default_root_dir=str(run_dir), max_steps=max_steps, max_time=f"00:00:{minutes:02d}:00")
    t["logger"]["init_args"]["save_dir"] = str(run_dir)
    cb = t["callbacks"][0]["init_args"]
    cb["rollout"]["model_path"] = str(root / "model")
    cb["dataset"].update(path=str(root / "data" / "train.jsonl"), val_path=str(root / "data" / "val.jsonl"))
    cb["rewards"]["reward_funcs"] = [str(REPO / "examples" / "smollm2" / "rewards.py") + ":sum_correct"]
    ckpt = t["callbacks"][1]["init_args"]
    # a short run still leaves a checkpoint to validate (a long one keeps the example's cadence)
    ckpt.update(dirpath=str(run_dir / "checkpoints"), every_n_train_steps=min(ckpt["every_n_train_steps"], max_steps))
    path = run_dir / ARMS[arm].name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def parse_arms(text: str) -> list[str]:
    """``--arms``: a comma-separated list of distinct names from :data:`ARMS`, in the order given."""
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms or len(set(arms)) != len(arms):
        raise ValueError(f"--arms {text!r}: give distinct names from {', '.join(ARMS)}, e.g. --arms full,lora")
    return arms


def validation_samples(config: Path) -> int:
    """``N`` of the noise: the held-out prompts (rows of the config's ``val_path``) x its ``data.init_args.val_n``."""
    import yaml

    parsed = yaml.safe_load(config.read_text())
    val_path = Path(parsed["trainer"]["callbacks"][0]["init_args"]["dataset"]["val_path"])
    prompts = sum(1 for line in val_path.read_text().splitlines() if line.strip())
    return prompts * int(parsed["data"]["init_args"]["val_n"])


def gain_difference_noise(after_full: float, after_lora: float, samples: int) -> float:
    """The standard error of ``lora gain - full gain`` (the module docstring's formula): the two "after" means of
    ``samples`` rewards in [0, 1] each, independent; the shared "before" cancels."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    return math.sqrt((after_full * (1 - after_full) + after_lora * (1 - after_lora)) / samples)


def _validate(config: Path, root: Path, ckpt: Path | None) -> dict[str, float]:
    """``lhr validate`` in this process; the logged ``val/*`` metrics."""
    from lightning_hybrid_rollout.lightning.cli import cli_main

    args = ["validate", "--config", str(config), f"--trainer.default_root_dir={root / 'validate'}"]
    args += ["--trainer.logger=false", "--trainer.limit_val_batches=1.0"]
    if ckpt is not None:
        args += ["--ckpt_path", str(ckpt)]
    cli = cli_main(args)
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val/")}


def plot_reward_curve(
    root: Path, before: float, after: float, fit_minutes: float, out: Path, what: str = "GRPO"
) -> Path:
    """``train/reward_mean`` per step (and its 5-step moving mean) from the fit's ``metrics.csv``, with the
    validation reward before and after as horizontal lines, to ``out`` (PNG); ``what`` names the fine-tune."""
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
    ax.set_title(f"SmolLM2-135M-Instruct, {what} on 2 CPU cores ({fit_minutes:.0f} min fit)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _steps_done(run_dir: Path) -> int:
    """The optimizer steps the fit did: the distinct ``step`` values of ``metrics.csv``'s rows with a
    ``train/reward_mean`` (logged once per step; 0 without the file)."""
    import csv

    path = run_dir / "metrics.csv"
    if not path.exists():
        return 0
    with open(path) as f:
        return len({r["step"] for r in csv.DictReader(f) if r.get("train/reward_mean")})


def _checkpoint_step(ckpt: Path) -> int:
    import torch

    return int(torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)["global_step"])


def run_arm(
    arm: str, root: Path, max_steps: int, minutes: int, before: dict[str, float], lhr: list[str]
) -> dict[str, Any]:
    """Fit ``arm`` from the prepared model and data, validate its last checkpoint, draw its curve, print its lines."""
    config = write_config(root, max_steps, minutes, arm)
    run_dir = root / arm
    t0 = time.monotonic()
    subprocess.run([*lhr, "fit", "--config", str(config)], check=True, cwd=REPO)
    fit_s = time.monotonic() - t0
    ckpts = sorted((run_dir / "checkpoints").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    if not ckpts:
        raise SystemExit(f"the {arm} fit wrote no checkpoint under {run_dir / 'checkpoints'}")
    after = _validate(config, run_dir, ckpts[-1])
    print(f"[{arm}] after: {json.dumps(after)}", flush=True)
    what = "GRPO, full fine-tune" if arm == "full" else "GRPO, LoRA r=16"
    png = plot_reward_curve(
        run_dir, before["val/reward"], after["val/reward"], fit_s / 60, run_dir / "reward_curve.png", what
    )
    result = {
        "before": before["val/reward"],
        "after": after["val/reward"],
        "gain": after["val/reward"] - before["val/reward"],
        "steps": _steps_done(run_dir),
        "checkpoint_step": _checkpoint_step(ckpts[-1]),
        "fit_minutes": fit_s / 60,
        "samples": validation_samples(config),
    }
    print(f"[{arm}] reward curve: {png}")
    print(
        f"[{arm}] val reward: {result['before']:.3f} -> {result['after']:.3f} ({result['gain']:+.3f}), "
        f"{result['steps']} steps (validated: step {result['checkpoint_step']}), "
        f"fit {result['fit_minutes']:.1f} min (limit {minutes} min)",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs/smollm2")
    parser.add_argument("--minutes", type=float, default=20.0, help="wall-time limit of each arm's fit")
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--arms", default="full", help=f"comma-separated, from {', '.join(ARMS)} (e.g. full,lora)")
    args = parser.parse_args(argv)
    try:
        arms = parse_arms(args.arms)
    except ValueError as err:
        parser.error(str(err))
    root = Path(args.root).resolve()
    lhr = [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli"]
    if not (root / "model" / "config.json").exists():
        subprocess.run([*lhr, "prepare-model", "smollm2-135m-instruct", "--out", str(root / "model")], check=True)
    if not (root / "data" / "train.jsonl").exists():
        subprocess.run(
            [sys.executable, str(REPO / "examples/smollm2/make_data.py"), "--out", str(root / "data")], check=True
        )

    minutes = int(args.minutes)
    before = _validate(write_config(root, args.max_steps, minutes, "full"), root, None)
    print(f"before: {json.dumps(before)}", flush=True)
    results = {arm: run_arm(arm, root, args.max_steps, minutes, before, lhr) for arm in arms}
    for arm, r in results.items():
        print(
            f"{arm}: {r['before']:.3f} -> {r['after']:.3f} ({r['gain']:+.3f}) in {r['steps']} steps, "
            f"{r['fit_minutes']:.1f} min"
        )
    if set(results) == set(ARMS):
        full, lora = results["full"], results["lora"]
        noise = gain_difference_noise(full["after"], lora["after"], full["samples"])
        print(f"lora gain - full gain: {lora['gain'] - full['gain']:+.3f} (noise: +-{noise:.3f})")
    else:
        [result] = results.values()
        print(f"val reward gain: {result['gain']:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
