"""Does dynamic scheduling learn what static scheduling learns? Final and area-under-curve reward, arm against arm.

Each arm is a complete fit of the same config (``--config``, default the quickstart) under one scheduling policy:
``static_fully_async`` (the hybrid replica never lent), ``default`` (the seed's policy) and ``rate_matched`` (our best
measured policy), ``--repeats`` times each with the seeds ``0 .. repeats-1`` (``seed_everything``; the initial model is
the same in every run), one subprocess per fit, arms interleaved per seed. Per arm it prints the final reward (mean
``train/reward_mean`` over the last 10% of steps) and the area under the reward curve (mean ``train/reward_mean`` over
all steps), each as mean ± standard deviation over the repeats. The LAST line is
``max arm difference: X.XX pooled sd``: over both figures and every pair of arms, the largest ``|mean_a - mean_b|``
divided by the pooled standard deviation ``sqrt((sd_a² + sd_b²) / 2)`` (the acceptance is <= 2.0 on the quickstart).

``--smollm2`` runs ``examples/smollm2_cpu.yaml`` instead (model and data prepared as ``benchmarks/smollm2_learning.py``
does; use ``--repeats 1``: with one repeat the spread is unknown and the last line prints the largest raw difference).

Usage::

    .venv/bin/python benchmarks/learning_fidelity.py                      # quickstart, 3 arms x 3 seeds, ~20-30 min
    .venv/bin/python benchmarks/learning_fidelity.py --repeats 1 --steps 60 --out runs/lf_smoke
    .venv/bin/python benchmarks/learning_fidelity.py --smollm2 --repeats 1 --steps 100
    .venv/bin/python benchmarks/learning_fidelity.py --smollm2 --arms static_fully_async,rate_matched \\
        --partial-lending --set rollout.dtype=bfloat16 --set rollout.weight_encoding=delta --steps 12
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart_cpu.yaml"
ARMS = ("static_fully_async", "default", "rate_matched")
FIGURES = ("final", "auc")


def parse_set(items: list[str]) -> dict[str, Any]:
    """``--set SECTION.KEY=VALUE`` items: ``{"SECTION.KEY": value}``, each value read as YAML (``true``, ``0.5``)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or "." not in key or not key.split(".")[-1]:
            raise ValueError(f"--set {item!r}: give SECTION.KEY=VALUE of the callback, e.g. rollout.dtype=bfloat16")
        out[key] = yaml.safe_load(value)
    return out


def write_config(
    base: dict[str, Any],
    run_dir: Path,
    policy: str,
    seed: int,
    steps: int | None,
    settings: dict[str, Any] | None = None,
    partial_lending: bool = False,
) -> Path:
    """``base`` (a parsed ``lhr fit`` config) with its outputs under ``run_dir``, ``policy`` and ``seed``; every arm
    gets the callback ``settings`` (:func:`parse_set`), and ``rate_matched`` lends k of n with ``partial_lending``."""
    import copy

    import yaml

    config = copy.deepcopy(base)
    config["seed_everything"] = seed
    t = config["trainer"]
    t["default_root_dir"] = str(run_dir)
    if steps is not None:
        t["max_steps"] = steps
    t["logger"]["init_args"].update(save_dir=str(run_dir), name="", version="")
    cb = t["callbacks"][0]["init_args"]
    if cb.get("build_model"):  # each run builds the same model (the build's own seed is fixed) in its run dir
        cb["rollout"]["model_path"] = str(run_dir / "model")
    for key, value in (settings or {}).items():
        *sections, name = key.split(".")
        node = cb
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    at = cb.setdefault("async_training", {})
    at["dynamic_schedule_policy"] = policy
    if partial_lending and policy == "rate_matched":
        at["dynamic_schedule_policy_kwargs"] = {**at.get("dynamic_schedule_policy_kwargs", {}), "partial_lending": True}
    for extra in t["callbacks"][1:]:
        if "dirpath" in extra.get("init_args", {}):
            extra["init_args"]["dirpath"] = str(run_dir / "checkpoints")
    path = run_dir / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def reward_curve(metrics_csv: Path) -> list[float]:
    """``train/reward_mean`` per optimizer step, in step order, from a CSVLogger ``metrics.csv``."""
    with open(metrics_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/reward_mean") not in (None, "")]
    rows.sort(key=lambda r: int(float(r["step"])))
    return [float(r["train/reward_mean"]) for r in rows]


def curve_figures(curve: list[float]) -> dict[str, float]:
    """``final``: mean over the last 10% of steps (at least one); ``auc``: mean over all steps (area / steps)."""
    if not curve:
        raise ValueError("the run logged no train/reward_mean: did the fit run any step?")
    tail = curve[-max(1, len(curve) // 10) :]
    return {"final": statistics.fmean(tail), "auc": statistics.fmean(curve)}


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def max_pooled_difference(results: dict[str, list[dict[str, float]]]) -> tuple[float, str]:
    """Largest ``|mean_a - mean_b| / sqrt((sd_a² + sd_b²) / 2)`` over figures and arm pairs, and where it was.

    With one repeat per arm (no spread) the raw difference is returned, labelled ``raw``; a zero pooled spread with
    a non-zero difference is ``inf``.
    """
    worst, where = 0.0, "none"
    for figure in FIGURES:
        for a, b in itertools.combinations(sorted(results), 2):
            ma, sa = mean_sd([r[figure] for r in results[a]])
            mb, sb = mean_sd([r[figure] for r in results[b]])
            diff = abs(ma - mb)
            if min(len(results[a]), len(results[b])) < 2:
                value, unit = diff, "raw"
            else:
                pooled = math.sqrt((sa * sa + sb * sb) / 2)
                value = diff / pooled if pooled > 0 else (math.inf if diff > 0 else 0.0)
                unit = "pooled sd"
            if value >= worst:
                worst, where = value, f"{figure} {a} vs {b} ({unit})"
    return worst, where


def _prepare_smollm2(root: Path) -> dict[str, Any]:
    """The SmolLM2 example's config with the model and data under ``root`` (prepared once)."""
    import yaml

    sys.path.insert(0, str(REPO / "benchmarks"))
    import smollm2_learning

    lhr = [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli"]
    if not (root / "model" / "config.json").exists():
        subprocess.run([*lhr, "prepare-model", "smollm2-135m-instruct", "--out", str(root / "model")], check=True)
    if not (root / "data" / "train.jsonl").exists():
        subprocess.run(
            [sys.executable, str(REPO / "examples/smollm2/make_data.py"), "--out", str(root / "data")], check=True
        )
    path = smollm2_learning.write_config(root, max_steps=200, minutes=59)
    return yaml.safe_load(path.read_text())


def main(argv: list[str] | None = None) -> int:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(QUICKSTART), help="the fit config every arm runs")
    parser.add_argument("--smollm2", action="store_true", help="run examples/smollm2_cpu.yaml (prepared under --out)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated scheduling policies")
    parser.add_argument("--repeats", type=int, default=3, help="seeds 0 .. repeats-1 per arm")
    parser.add_argument("--steps", type=int, default=None, help="max_steps (default: the config's)")
    parser.add_argument("--out", default="runs/learning_fidelity")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a callback setting for every arm, e.g. rollout.dtype=bfloat16 rollout.weight_encoding=delta (repeatable)",
    )
    parser.add_argument(
        "--partial-lending", action="store_true", help="rate_matched lends k of n hybrid replicas (partial_lending)"
    )
    args = parser.parse_args(argv)
    settings = parse_set(args.set)
    out = Path(args.out).resolve()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    base = _prepare_smollm2(out) if args.smollm2 else yaml.safe_load(Path(args.config).read_text())

    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    lhr = [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli", "fit"]
    for seed in range(args.repeats):
        for arm in arms:
            run_dir = out / arm / f"seed{seed}"
            config = write_config(base, run_dir, arm, seed, args.steps, settings, args.partial_lending)
            t0 = time.monotonic()
            with open(run_dir / "fit.log", "w") as log:
                proc = subprocess.run([*lhr, "--config", str(config)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise SystemExit(f"{arm} seed {seed} failed (exit {proc.returncode}); see {run_dir / 'fit.log'}")
            figures = curve_figures(reward_curve(run_dir / "metrics.csv"))
            results[arm].append(figures)
            print(
                f"{arm:>20} seed {seed}: final {figures['final']:.3f}  auc {figures['auc']:.3f}  "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    for arm in arms:
        parts = []
        for figure in FIGURES:
            m, s = mean_sd([r[figure] for r in results[arm]])
            parts.append(f"{figure} {m:.3f} ± {s:.3f}")
        print(f"{arm:>20}: " + "  ".join(parts) + f"  (n={len(results[arm])})")
    worst, where = max_pooled_difference(results)
    print(f"largest difference at: {where}")
    unit = "raw" if args.repeats < 2 else "pooled sd"
    print(f"max arm difference: {worst:.2f} {unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
