"""Issue #15's acceptance: calibrated from one real CPU-miniature run, the planner predicts the other.

Two real runs of ``benchmarks/cpu_miniature.py`` (its own ``main``, so its subprocess worker, its settings and its
per-run report: ``--policies static_fully_async,rate_matched --repeats 1``), or two run folders it kept
(``--reuse STATIC_DIR DYNAMIC_DIR``), then the simulator (``lightning_hybrid_rollout.sim``) three times:

1. calibrated from the static run (``sim.calibrate.calibrate_run``), it simulates that run itself and the dynamic
   run: the static scenario with its run swapped for the dynamic one (``Calibration.scenario_for``: hybrid, the
   dynamic run's own ``async_training`` options read from its saved ``hybrid_rollout_config.yaml``; nothing else of
   the dynamic run is read). Predicted speedup = simulated static wall / simulated dynamic wall;
2. calibrated from the dynamic run, it simulates the static run (the static run's options from its saved config);
3. for information only (not in the worst error), the dynamic run from its own calibration.

Rates across the swap (``sim/calibrate.py``): a static run never sees its hybrid replica serve, so the hybrid rate
is assumed ``hybrid_speed_ratio`` (default 0.73, ``--hybrid-speed-ratio``) × the standalone rate; the standalone
replica serves ``standalone_speed_with_hybrid`` (default 1.0, ``--standalone-speed-with-hybrid``) as fast in a run
whose hybrid replica serves as in one where it never does, converted both ways (below 1 where they contend).

Wall times compare like with like: the real one is the trainer's traced wall of the run's ``trace.json`` (its first
``trainer/trainer`` span to its last: what ``cpu_miniature`` prints as ``traced wall`` and divides the bound by);
the predicted one is the same reading of the simulated run's trace (the simulator's first trainer span is at its
time 0, the start decision, its last the final weight sync: its ``time_s``). Both by
``lightning_hybrid_rollout.run_bound.trainer_breakdown``.

It prints the real runs (cpu_miniature's report, unless ``--reuse``), a table (run, calibrated from, real,
predicted, relative error), the speedup (real, predicted, absolute error) on the line before the last, and last
``worst relative error: X``: the largest of the three wall-time predictions' ``|predicted / real - 1|``.

Usage::

    .venv/bin/python benchmarks/planner_fidelity.py                   # two real runs (~4-5 min on 2 cores)
    .venv/bin/python benchmarks/planner_fidelity.py --out /tmp/pf_runs --steps 64
    .venv/bin/python benchmarks/planner_fidelity.py --reuse /tmp/pf_runs/static_fully_async_r1 \\
        /tmp/pf_runs/rate_matched_r1                                 # offline: the comparison only (~2 s)

Other arguments go to ``cpu_miniature.py`` as they are (e.g. ``--set async_training.overlap_sync=true``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.run_bound import trainer_breakdown
from lightning_hybrid_rollout.sim import simulate
from lightning_hybrid_rollout.sim.calibrate import (
    HYBRID_SPEED_RATIO,
    STANDALONE_SPEED_WITH_HYBRID,
    Calibration,
    CalibrationError,
    calibrate_run,
    find_config,
)
from lightning_hybrid_rollout.sim.scenario import RUN_KEYS, Scenario
from lightning_hybrid_rollout.trace import load_trace

STATIC = "static_fully_async"
DYNAMIC = "rate_matched"
#: The workload keys both runs must share (else one cannot predict the other).
_WORKLOAD = ("mini_batch_size", "require_batches", "trigger_parameter_sync_step", "staleness_threshold")


def _miniature() -> Any:
    """``benchmarks/cpu_miniature.py`` as a module (its ``main`` runs the real fits in its subprocess worker)."""
    path = Path(__file__).resolve().parent / "cpu_miniature.py"
    spec = importlib.util.spec_from_file_location("cpu_miniature", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cpu_miniature", module)
    spec.loader.exec_module(module)
    return module


def traced_wall(trace_path: str | Path) -> float:
    """The trainer's traced wall: its first ``trainer/trainer`` span's start to its last span's end (seconds)."""
    _, start, end = trainer_breakdown(load_trace(trace_path))
    return end - start


def _saved_sections(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's saved ``async_training`` and ``rollout`` sections (its configuration, nothing it measured)."""
    import yaml

    path = find_config(run_dir)
    if path is None:
        raise CalibrationError(f"{run_dir} has no saved config (hybrid_rollout_config.yaml or config.yaml)")
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    found: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("async_training", "rollout") and isinstance(value, dict):
                    found.setdefault(key, value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(doc)
    return found.get("async_training", {}), found.get("rollout", {})


def run_from_config(run_dir: str | Path, fit: Calibration, name: str) -> dict[str, Any]:
    """The run ``run_dir`` made, as a scenario run: the fit's split (same machine), hybrid if the saved config has
    hybrid replicas, and the config's own ``async_training`` run options (:data:`RUN_KEYS`)."""
    at, rollout = _saved_sections(Path(run_dir))
    base = fit.scenario.async_training
    differ = [k for k in _WORKLOAD if k in at and at[k] != getattr(base, k)]
    if differ:
        raise CalibrationError(
            f"{run_dir} ran another workload ({', '.join(f'{k} {at[k]} vs {getattr(base, k)}' for k in differ)}): "
            "one run predicts another of the same workload only"
        )
    spec = fit.scenario.runs[0]
    return {
        "name": name,
        "train_devices": spec.train_devices,
        "rollout_devices": spec.rollout_devices,
        "hybrid": int(rollout.get("hybrid_replicas", 1 if spec.hybrid else 0)) > 0,
        "async_training": {k: at[k] for k in RUN_KEYS if k in at},
    }


def simulated_wall(scenario: Scenario) -> float:
    """The simulated run's traced wall (its trace read as a real one's: :func:`traced_wall`)."""
    with tempfile.TemporaryDirectory(prefix="lhr-fidelity-") as tmp:
        result = simulate(scenario, trace_dir=tmp).runs[0]
        assert result.trace_path is not None
        return traced_wall(result.trace_path)


@dataclass
class Prediction:
    """One wall-time prediction: the run, the run calibrated from, real and predicted seconds."""

    run: str
    calibrated_from: str
    real_s: float
    predicted_s: float
    counted: bool = True

    @property
    def relative_error(self) -> float:
        """``|predicted / real - 1|``."""
        return abs(self.predicted_s / self.real_s - 1.0)


@dataclass
class Comparison:
    """The predictions side by side with the real runs."""

    predictions: list[Prediction]
    real_speedup: float
    predicted_speedup: float
    notes: list[str] = field(default_factory=list)

    @property
    def speedup_error(self) -> float:
        """``|predicted speedup - real speedup|``."""
        return abs(self.predicted_speedup - self.real_speedup)

    @property
    def worst_relative_error(self) -> float:
        """The largest relative error of the counted wall-time predictions."""
        return max(p.relative_error for p in self.predictions if p.counted)

    def lines(self) -> list[str]:
        """The table, the notes, the speedup line and (last) ``worst relative error: X``."""
        out = [
            f"{'run':<20} {'calibrated from':<28} {'real wall (s)':>13} {'predicted (s)':>13} {'rel. error':>10}",
        ]
        for p in self.predictions:
            signed = p.predicted_s / p.real_s - 1.0
            extra = "" if p.counted else "  (its own fit: information, not counted)"
            out.append(
                f"{p.run:<20} {p.calibrated_from:<28} {p.real_s:>13.1f} {p.predicted_s:>13.1f} {signed:>+10.1%}{extra}"
            )
        out += self.notes
        out.append(
            f"speedup ({STATIC} / {DYNAMIC}): real {self.real_speedup:.3f}, predicted {self.predicted_speedup:.3f} "
            f"(static calibration), speedup error: {self.speedup_error:.3f}"
        )
        out.append(f"worst relative error: {self.worst_relative_error:.3f}")
        return out


def _drift_line(from_static: Calibration, from_dynamic: Calibration) -> str:
    """How fast the machine ran in the dynamic run against the static one, on the work both runs did alike (training
    seconds per token; the standalone replica's decode rate): a diagnostic of the real side, read by no prediction."""

    def ratio(name: str) -> float:
        return from_dynamic.parameter(name).value / from_static.parameter(name).value

    train = 1.0 / ratio("trainer.device_s_per_token")
    rate = ratio("info.standalone_tokens_per_s_per_replica")
    return (
        f"machine speed, dynamic run / static run (measured in both; no prediction reads it): training "
        f"{train:.2f}x, standalone decode {rate:.2f}x"
    )


def compare(
    static_dir: str | Path,
    dynamic_dir: str | Path,
    *,
    hybrid_speed_ratio: float = HYBRID_SPEED_RATIO,
    standalone_speed_with_hybrid: float = STANDALONE_SPEED_WITH_HYBRID,
) -> Comparison:
    """Calibrate from each run, predict the other (and the static run itself), compare with the real walls."""
    static_dir, dynamic_dir = Path(static_dir), Path(dynamic_dir)
    real_static = traced_wall(static_dir / "trace.json")
    real_dynamic = traced_wall(dynamic_dir / "trace.json")
    factors = {"standalone_speed_with_hybrid": standalone_speed_with_hybrid}

    from_static = calibrate_run(static_dir, hybrid_speed_ratio=hybrid_speed_ratio)
    static_run = run_from_config(static_dir, from_static, STATIC)
    dynamic_run = run_from_config(dynamic_dir, from_static, DYNAMIC)  # its configuration only
    static_self = simulated_wall(from_static.scenario_for(static_run, **factors))
    dynamic_pred = simulated_wall(from_static.scenario_for(dynamic_run, **factors))

    from_dynamic = calibrate_run(dynamic_dir, hybrid_speed_ratio=hybrid_speed_ratio)
    static_from_dynamic = run_from_config(static_dir, from_dynamic, STATIC)
    static_pred = simulated_wall(from_dynamic.scenario_for(static_from_dynamic, **factors))
    dynamic_self = simulated_wall(from_dynamic.scenario_for(run_from_config(dynamic_dir, from_dynamic, DYNAMIC)))

    rho = from_dynamic.parameter("hybrid_replica.tokens_per_s").value / from_dynamic.scenario.replica.tokens_per_s
    notes = [
        "wall = the trainer's traced wall (first trainer/trainer span to last) of the real and of the simulated trace",
        f"assumed across the swap: hybrid_speed_ratio {hybrid_speed_ratio:g} (a static run never sees the hybrid "
        f"replica serve; the dynamic run measured {rho:.2f}), standalone_speed_with_hybrid "
        f"{standalone_speed_with_hybrid:g}",
        _drift_line(from_static, from_dynamic),
    ]
    return Comparison(
        predictions=[
            Prediction(STATIC, f"{STATIC} (itself)", real_static, static_self),
            Prediction(DYNAMIC, STATIC, real_dynamic, dynamic_pred),
            Prediction(STATIC, DYNAMIC, real_static, static_pred),
            Prediction(DYNAMIC, f"{DYNAMIC} (itself)", real_dynamic, dynamic_self, counted=False),
        ],
        real_speedup=real_static / real_dynamic,
        predicted_speedup=static_self / dynamic_pred,
        notes=notes,
    )


def main(argv: list[str] | None = None) -> Comparison:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reuse", nargs=2, metavar=("STATIC_DIR", "DYNAMIC_DIR"), help="compare two kept run folders")
    p.add_argument("--steps", type=int, default=64, help="optimizer steps per real run")
    p.add_argument("--out", default=None, help="keep the real runs' folders here (default: a temp dir)")
    p.add_argument("--hybrid-speed-ratio", type=float, default=HYBRID_SPEED_RATIO)
    p.add_argument("--standalone-speed-with-hybrid", type=float, default=STANDALONE_SPEED_WITH_HYBRID)
    args, rest = p.parse_known_args(argv)
    factors = {
        "hybrid_speed_ratio": args.hybrid_speed_ratio,
        "standalone_speed_with_hybrid": args.standalone_speed_with_hybrid,
    }
    if args.reuse:
        if rest:
            p.error(f"unrecognized arguments with --reuse: {' '.join(rest)}")
        comparison = compare(*args.reuse, **factors)
    else:
        with tempfile.TemporaryDirectory(prefix="lhr-fidelity-runs-") as tmp:
            out = Path(args.out or tmp)
            _miniature().main(
                [
                    "--policies",
                    f"{STATIC},{DYNAMIC}",
                    "--speedup-policy",
                    DYNAMIC,
                    "--repeats",
                    "1",
                    "--steps",
                    str(args.steps),
                    "--out",
                    str(out),
                    *rest,
                ]
            )
            print(f"planner fidelity: the real runs above ({out}), then the predictions")
            comparison = compare(out / f"{STATIC}_r1", out / f"{DYNAMIC}_r1", **factors)
    print("\n".join(comparison.lines()))
    return comparison


if __name__ == "__main__":
    main()
