"""Issue #15's acceptance: calibrated from one real CPU-miniature run, the planner predicts the other.

Real runs of ``benchmarks/cpu_miniature.py`` (its own ``main``, so its subprocess worker, its settings and its
per-run report: ``--policies static_fully_async,rate_matched --repeats R``, ``--repeats`` default 3), or run folders
it kept (``--reuse OUT``: every ``static_fully_async_r{i}`` / ``rate_matched_r{i}`` pair under ``OUT``; or
``--reuse STATIC_DIR DYNAMIC_DIR``: one pair), then, for each pair, the simulator
(``lightning_hybrid_rollout.sim``) three times:

1. calibrated from the static run (``sim.calibrate.calibrate_run``), it simulates that run itself and the dynamic
   run: the static scenario with its run swapped for the dynamic one (``Calibration.scenario_for``: hybrid, the
   dynamic run's own ``async_training`` options read from its saved ``hybrid_rollout_config.yaml``; nothing else of
   the dynamic run is read). Predicted speedup = simulated static wall / simulated dynamic wall;
2. calibrated from the dynamic run, it simulates the static run (the static run's options from its saved config);
3. for information only (not in the worst error), the dynamic run from its own calibration.

Rounds: ``cpu_miniature --order bracket`` (the default here, ``--order``) runs static, dynamic, static, dynamic, ...,
static: ``R`` dynamic runs ``rate_matched_r{i}``, each between the static runs ``static_fully_async_r{i}`` and
``static_fully_async_r{i+1}``. On the shared 2-core machine the speed drifts by 15-50% over minutes (one real pair:
the dynamic run 1.29x faster on training and 1.30x on decode than the static one, worst error 0.256, against 0.013
on a pair where the speed held), and a prediction across two runs carries that drift. A bracketed round is compared
against both static runs (:func:`compare` with each) and the two comparisons are averaged (:func:`bracketed`): the
real static wall is the mean of the two, the dynamic run is predicted from each static run's calibration and the two
predictions averaged, the static run predicted from the dynamic run's calibration is compared with the mean of the
two real ones, and the speedups are the mean static wall over the dynamic one, real and predicted. A drift linear
over the three runs then cancels. ``--order alternate`` runs ``R`` adjacent pairs (static, dynamic), then (dynamic,
static), ...; round ``i`` is its two runs. Each round is compared on its own, and the reported figures are medians
over the rounds, as the other acceptance figures (``cpu_miniature``'s 3-repeat medians): per prediction (row), the
median over the rounds of its ``|predicted / real - 1|``; the speedup error, the median over the rounds of
``|predicted - real speedup|`` (``statistics.median``: with an even number of rounds, the mean of the middle two).
Each round also prints how fast the machine ran in its dynamic run against its static one(s) (a diagnostic, read by
no counted prediction: only by the machine-drift-corrected ones below, information).

Steady rounds (since 2026-12-04): the medians count only the rounds over which the independent machine-speed probe
moved at most ``--steady-tolerance`` (default 10%: the slowest of the round's runs' probe readings over the fastest,
minus 1; :func:`machine_speed.probe_spread`), or the ``--repeats`` steadiest when fewer held
(:func:`machine_speed.counted_rounds`); a round set aside is printed with its figures and marked. ``cpu_miniature``
runs another round while too few held (its ``--extra-rounds``, default 4, passed on like every other option this
script does not take). The criterion reads only the probe,
nothing of the runs or the predictions. In the 18 rounds of six earlier sessions (pf12-pf17, ``--reuse``) the probe
moved more than 10% over 10; the 8 steady rounds' speedup errors have a median of 0.056 (0.008-0.133), the 10 others'
0.115 (0.013-0.174).

Machine-drift-corrected errors (information only: counted in neither of the last two lines, which stay the raw
figures above): each of the two cross predictions is simulated again, its calibrated scenario (after the swap,
``scenario_for``) with the trainer's cost (``trainer.device_s_per_token`` and ``trainer.step_overhead_s``) divided
by the training-speed ratio and the replicas' decode rates (``replica.tokens_per_s``,
``hybrid_replica.tokens_per_s``) multiplied by the decode-speed ratio, the ratios being how fast the machine ran in
the target run relative to the calibration run; the simulator itself combines the two (the phases overlap, and how
much each one bounds the wall depends on both speeds: one wall × one ratio would have to guess which phase decides
it). From the target run it reads exactly these two ratios, nothing else: the training ratio = the calibration run's
``trainer.device_s_per_token`` / the target run's (the printed "training" ratio, or its inverse), the decode ratio =
the target run's ``info.standalone_tokens_per_s_per_replica`` / the calibration run's (the printed "standalone
decode" ratio, or its inverse), divided by the factor ``scenario_for`` converted the static fit's standalone rate by
(``standalone_speed_with_hybrid``, the machine's 0.91 by default, both ways): that part of the measured ratio is
the swap's modelled contention, which ``scenario_for`` already applies, not the machine. Switch costs and everything
else keep their calibrated values. The corrected error (and the speedup predicted from the corrected dynamic wall)
says how much of a raw error is the model's and how much the machine's: what is left of it is what the model gets
wrong on a machine that held its speed. Per round, then the medians over the rounds.

Machine-speed-probe-corrected errors (information only, counted nowhere): ``cpu_miniature`` runs an independent probe
around every run (``benchmarks/machine_speed.py``: a fixed unit of pure-Python work timed by its own CPU time on each
core, ~0.1% of a core) and writes its median while the run trained to the run dir's ``machine_speed.json``. Where both
runs of a round have one, each cross prediction is also re-simulated at the probe's speed ratio (training and decoding
alike, :func:`machine_corrected`), which reads nothing of the target run at all; a line per round and the medians.

Rates across the swap (``sim/calibrate.py``): a static run never sees its hybrid replica serve, so the hybrid rate
is assumed ``hybrid_speed_ratio`` (default 0.71, ``--hybrid-speed-ratio``) × the standalone rate. How much slower the
standalone replica decodes beside a busy core 0 converts its rate across the swap, in both directions, by
``standalone_speed_with_hybrid`` (default 0.91, ``--standalone-speed-with-hybrid``; ``Calibration.scenario_for``): the
dynamic run keeps core 0 busy nearly throughout (training or serving), a static run only while it trains. Both
defaults are this machine's figures, medians over the runs of stops 32-33 (37 dynamic, 52 static). Since 2026-12-05
the static fit's own ``replica.speed_while_training`` (measured by each calibration run, printed per round) is not
the conversion: it does not carry over to the next run (docs/simulator.md, "The machine's two figures").

Wall times compare like with like: the real one is the trainer's traced wall of the run's ``trace.json`` (its first
``trainer/trainer`` span to its last: what ``cpu_miniature`` prints as ``traced wall`` and divides the bound by);
the predicted one is the same reading of the simulated run's trace (the simulator's first trainer span is at its
time 0, the start decision, its last the final weight sync: its ``time_s``). Both by ``lhr report``'s reading
(``lightning_hybrid_rollout.analysis.run_bound.read_run``: ``wall_s``, and ``bound_s`` for the speedup's two factors).

Staleness (information, counted in no error figure): each table row also gives the mean version lag of the trained
samples, real (the mean over the run's steps of ``train/staleness_mean``, ``param_version - weight_version_min``)
against predicted (the simulated run's ``version_lag_mean``, the figure ``lhr plan`` prints as ``lag``), and the
medians part a line with every round's pairs and the largest difference.

It prints the real runs (cpu_miniature's report, unless ``--reuse``), then per round a table (run, calibrated from,
real, predicted, signed relative error), the machine-speed line, the machine-drift-corrected line (information) and
the round's speedup; then the medians over the rounds (a table of the per-round errors and their median per row), the
machine-drift-corrected errors per round and their medians (information), the per-round speedups, on the line before the
last the speedup (median real, median predicted, and ``speedup error: X``, the median over rounds of the absolute
error) and last ``worst relative error: X``: the largest of the three counted wall-time predictions' medians over
rounds of ``|predicted / real - 1|``. With ``--reuse STATIC_DIR DYNAMIC_DIR`` (one pair) it prints that pair's table,
its machine-drift-corrected line (information), its speedup line and its worst error (no medians).

Usage::

    .venv/bin/python benchmarks/planner_fidelity.py                   # 3 rounds = 7 real runs (~12-15 min, 2 cores)
    .venv/bin/python benchmarks/planner_fidelity.py --out /tmp/pf_runs --steps 64 --repeats 3
    .venv/bin/python benchmarks/planner_fidelity.py --reuse /tmp/pf_runs   # offline: every *_r{i} pair (~2 s a pair)
    .venv/bin/python benchmarks/planner_fidelity.py --reuse /tmp/pf_runs/static_fully_async_r1 \\
        /tmp/pf_runs/rate_matched_r1                                 # offline: one pair

Other arguments go to ``cpu_miniature.py`` as they are (e.g. ``--set async_training.overlap_sync=true``).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.analysis.run_bound import read_run
from lightning_hybrid_rollout.sim import simulate
from lightning_hybrid_rollout.sim.calibrate import (
    Calibration,
    CalibrationError,
    calibrate_run,
    find_config,
)
from lightning_hybrid_rollout.sim.calibration import SHARED_2VCPU
from lightning_hybrid_rollout.sim.scenario import RUN_KEYS, Scenario

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when loaded by file path (tests)
from machine_speed import STEADY_TOLERANCE, counted_rounds, probe_spread

STATIC = "static_fully_async"
DYNAMIC = "rate_matched"
#: The host the real runs run on (cpu_miniature's 2 vCPUs): its figures where none is given.
HOST = SHARED_2VCPU
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
    """The simulated run's traced wall (:func:`simulated`)."""
    return simulated(scenario)[0]


def simulated(scenario: Scenario) -> tuple[float, float, float | None]:
    """The simulated run's traced wall, its mean version lag (``version_lag_mean``) and its balance bound, its trace
    read as a real run's (``lhr report``'s ``read_run``; the bound None where it has none)."""
    with tempfile.TemporaryDirectory(prefix="lhr-fidelity-") as tmp:
        result = simulate(scenario, trace_dir=tmp).runs[0]
        assert result.trace_path is not None
        report = read_run(result.trace_path)
        return report.wall_s, result.version_lag_mean, report.bound_s


def real_version_lag(run_dir: str | Path) -> float:
    """A real run's mean version lag: the mean over its steps of ``train/staleness_mean`` (every step trains the same
    number of samples, so it is the mean over its trained samples of ``param_version - weight_version_min``)."""
    path = Path(run_dir) / "metrics.csv"
    with path.open(newline="") as f:
        values = [float(v) for row in csv.DictReader(f) if (v := row.get("train/staleness_mean"))]
    if not values:
        raise CalibrationError(f"{path} has no train/staleness_mean values (a run of this package logs them)")
    return statistics.fmean(values)


def machine_corrected(scenario: Scenario, training: float, decode: float) -> Scenario:
    """``scenario`` on a machine ``training`` times as fast at training and ``decode`` times as fast at decoding:
    the trainer's ``device_s_per_token`` and ``step_overhead_s`` divided by ``training``, the replicas' (and the
    hybrid replicas') ``tokens_per_s`` multiplied by ``decode``; nothing else changed."""
    if not (training > 0 and decode > 0):
        raise ValueError(f"machine-speed ratios must be > 0, got {training} and {decode}")
    data = scenario.to_dict()
    data["trainer"] = {
        **data["trainer"],
        "device_s_per_token": data["trainer"]["device_s_per_token"] / training,
        "step_overhead_s": data["trainer"]["step_overhead_s"] / training,
    }
    for key in ("replica", "hybrid_replica"):
        if data.get(key) is not None:
            data[key] = {**data[key], "tokens_per_s": data[key]["tokens_per_s"] * decode}
    return Scenario.from_dict(data)


@dataclass
class Prediction:
    """One wall-time prediction: the run, the run calibrated from, real and predicted seconds."""

    run: str
    calibrated_from: str
    real_s: float
    predicted_s: float
    counted: bool = True
    #: The prediction re-simulated at the target run's measured machine speed (:func:`machine_corrected`;
    #: information, counted nowhere); None for a run predicted from its own calibration (nothing to correct).
    corrected_s: float | None = None
    #: The mean version lag of the trained samples (a real run's ``train/staleness_mean``; the simulated run's
    #: ``version_lag_mean``): information, counted in no error figure.
    real_lag: float = float("nan")
    predicted_lag: float = float("nan")
    #: The prediction re-simulated at the machine speed the independent probe saw (``benchmarks/machine_speed.py``:
    #: its time per work unit during the calibration run / during the target run, for training and decoding alike);
    #: information, counted nowhere; None without both runs' probe readings.
    probe_corrected_s: float | None = None

    @property
    def probe_corrected_error(self) -> float | None:
        """``probe_corrected / real - 1`` (signed; information), None without a probe-corrected prediction."""
        return None if self.probe_corrected_s is None else self.probe_corrected_s / self.real_s - 1.0

    @property
    def relative_error(self) -> float:
        """``|predicted / real - 1|``."""
        return abs(self.predicted_s / self.real_s - 1.0)

    @property
    def corrected_error(self) -> float | None:
        """``corrected / real - 1`` (signed; information), None without a corrected prediction."""
        return None if self.corrected_s is None else self.corrected_s / self.real_s - 1.0


@dataclass
class Comparison:
    """One pair's predictions side by side with its real runs."""

    predictions: list[Prediction]
    real_speedup: float
    predicted_speedup: float
    #: How fast the machine ran in the dynamic run against the static one: training (inverse s/token), decode rate.
    machine_training: float = 1.0
    machine_decode: float = 1.0
    #: The dynamic run's measured hybrid / standalone decode rate (the static side assumes ``hybrid_speed_ratio``).
    measured_hybrid_ratio: float = float("nan")
    hybrid_speed_ratio: float = HOST.hybrid_speed_ratio
    #: The factor the standalone rate was converted by across the swap (both ways).
    standalone_speed_with_hybrid: float = HOST.standalone_speed_with_hybrid
    #: Whether that factor is the default (:data:`HOST`'s, the machine's figure) or was given.
    standalone_speed_default: bool = False
    #: How fast the independent probe found the machine in the dynamic run against the static one (None: unknown).
    machine_probe: float | None = None
    #: ``replica.speed_while_training`` fitted from the static run and from the dynamic run (1.0: not measured).
    speed_while_training: tuple[float, float] = (1.0, 1.0)
    #: Whether the static side is the mean of the static runs before and after the dynamic one (:func:`bracketed`).
    bracketed: bool = False
    #: Balance bounds (s) read from the traces: the real static run, the real dynamic run, the static fit's own
    #: simulated static run and its simulated dynamic run (:meth:`factors`); None where a trace has none.
    bounds: tuple[float | None, float | None, float | None, float | None] | None = None

    def factors(self) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """The real and the predicted speedup as ``cpu_miniature``'s two factors, ``(scheduling, machine)`` each:
        machine = the static run's balance bound / the dynamic run's, scheduling = speedup / machine (= the dynamic
        run's efficiency over the static run's); None without every bound."""
        if self.bounds is None or any(b is None or not b > 0 for b in self.bounds):
            return None
        real_static, real_dynamic, predicted_static, predicted_dynamic = self.bounds  # type: ignore[misc]
        real_machine, predicted_machine = real_static / real_dynamic, predicted_static / predicted_dynamic
        return (
            (self.real_speedup / real_machine, real_machine),
            (self.predicted_speedup / predicted_machine, predicted_machine),
        )

    def factors_line(self) -> str | None:
        """The speedup's two factors, real and predicted (information, counted nowhere); None without them."""
        f = self.factors()
        if f is None:
            return None
        (rs, rm), (ps, pm) = f
        return (
            f"speedup as two factors (docs/cpu_miniature.md; information): real scheduling {rs:.3f} x machine "
            f"{rm:.3f} = {self.real_speedup:.3f}, predicted {ps:.3f} x {pm:.3f} = {self.predicted_speedup:.3f} "
            "(scheduling: the dynamic run's efficiency over the static run's; machine: the static run's balance bound "
            "over the dynamic run's)"
        )

    def training_line(self) -> str:
        """The standalone replica's speed while the trainer trains, as each run's calibration fitted it."""
        a, b = self.speed_while_training
        return (
            f"standalone replica's speed while the trainer trains (replica.speed_while_training, fitted): "
            f"{STATIC} run {a:.3f}, {DYNAMIC} run {b:.3f}"
        )

    def probe_line(self) -> str | None:
        """The independent probe's machine speed and the cross predictions re-simulated at it (information)."""
        rows = [p for p in self.predictions if p.probe_corrected_s is not None]
        if self.machine_probe is None or not rows:
            return None
        return (
            f"machine-speed probe (benchmarks/machine_speed.py, reads nothing of the runs), dynamic / static run: "
            f"{self.machine_probe:.2f}x; cross predictions re-simulated at it (information, not counted): "
            + ", ".join(f"{p.run} from {p.calibrated_from} {p.probe_corrected_error:+.1%}" for p in rows)
        )

    @property
    def speedup_error(self) -> float:
        """``|predicted speedup - real speedup|``."""
        return abs(self.predicted_speedup - self.real_speedup)

    @property
    def corrected(self) -> list[Prediction]:
        """The predictions with a machine-drift-corrected value (the two cross predictions)."""
        return [p for p in self.predictions if p.corrected_s is not None]

    @property
    def corrected_speedup(self) -> float:
        """The static fit's own wall / the corrected prediction of the dynamic run (information)."""
        static_self = self.predictions[0].predicted_s
        dynamic = next(p for p in self.corrected if p.run == DYNAMIC)
        assert dynamic.corrected_s is not None
        return static_self / dynamic.corrected_s

    @property
    def corrected_speedup_error(self) -> float:
        """``|corrected predicted speedup - real speedup|`` (information)."""
        return abs(self.corrected_speedup - self.real_speedup)

    def corrected_line(self) -> str:
        """The machine-drift-corrected predictions (information: counted in no acceptance figure)."""
        rows = ", ".join(
            f"{p.run} from {p.calibrated_from} {p.corrected_s:.1f} s ({p.corrected_error:+.1%})" for p in self.corrected
        )
        return (
            f"machine-drift-corrected (information, not counted): {rows}; speedup predicted "
            f"{self.corrected_speedup:.3f}, error {self.corrected_speedup_error:.3f} (each prediction re-simulated at "
            "the training / decode speed the target run measured relative to the calibration run)"
        )

    @property
    def worst_relative_error(self) -> float:
        """The largest relative error of the counted wall-time predictions."""
        return max(p.relative_error for p in self.predictions if p.counted)

    def table(self, indent: str = "") -> list[str]:
        """The header and one row per prediction (signed relative error)."""
        out = [
            f"{indent}{'run':<20} {'calibrated from':<28} {'real wall (s)':>13} {'predicted (s)':>13} "
            f"{'rel. error':>10} {'lag real/pred':>14}",
        ]
        for p in self.predictions:
            signed = p.predicted_s / p.real_s - 1.0
            extra = "" if p.counted else "  (its own fit: information, not counted)"
            out.append(
                f"{indent}{p.run:<20} {p.calibrated_from:<28} {p.real_s:>13.1f} {p.predicted_s:>13.1f} "
                f"{signed:>+10.1%} {f'{p.real_lag:.2f}/{p.predicted_lag:.2f}':>14}{extra}"
            )
        return out

    def drift_line(self) -> str:
        """How fast the machine ran in the dynamic run against the static one (a diagnostic of the real side)."""
        return (
            f"machine speed, dynamic run / static run (measured in both; no counted prediction reads it): training "
            f"{self.machine_training:.2f}x, standalone decode {self.machine_decode:.2f}x"
        )

    def assumed_line(self, measured: str | None = None) -> str:
        """The rates assumed across the swap (and what the dynamic run(s) measured)."""
        measured = measured or f"the dynamic run measured {self.measured_hybrid_ratio:.2f}"
        return (
            f"assumed across the swap: hybrid_speed_ratio {self.hybrid_speed_ratio:g} (a static run never sees the "
            f"hybrid replica serve; {measured}), standalone_speed_with_hybrid "
            + (
                f"{self.standalone_speed_with_hybrid:g} both ways (the machine's figure: the standalone replica "
                "beside a busy core 0, throughout the dynamic run and while the static run trains)"
                if self.standalone_speed_default
                else f"{self.standalone_speed_with_hybrid:g} (given)"
            )
        )

    def lines(self) -> list[str]:
        """The table, the notes, the speedup line and (last) ``worst relative error: X``."""
        return [
            *self.table(),
            WALL_NOTE,
            self.assumed_line(),
            self.training_line(),
            self.drift_line(),
            self.corrected_line(),
            *([] if (factors := self.factors_line()) is None else [factors]),
            f"speedup ({STATIC} / {DYNAMIC}): real {self.real_speedup:.3f}, predicted {self.predicted_speedup:.3f} "
            f"(static calibration), speedup error: {self.speedup_error:.3f}",
            f"worst relative error: {self.worst_relative_error:.3f}",
        ]


def round_header(label: str, c: Comparison) -> str:
    """The first line of a round's block: which runs it compares."""
    if not c.bracketed:
        return f"round {label}: {STATIC}_{label} and {DYNAMIC}_{label} (run one after the other)"
    after = f"r{int(label[1:]) + 1}"
    return (
        f"round {label}: {DYNAMIC}_{label} between {STATIC}_{label} and {STATIC}_{after} (run in that order; the "
        "static side, real and predicted, is the mean of the two, each prediction from each static run's calibration)"
    )


WALL_NOTE = (
    "wall = the trainer's traced wall (first trainer/trainer span to last) of the real and of the simulated trace"
)


@dataclass
class Rounds:
    """Several rounds' comparisons (round ``i``: ``static_fully_async_r{i}`` and ``rate_matched_r{i}``, run one
    after the other) and the medians over the rounds: per prediction, of its ``|predicted / real - 1|``; of the
    speedup's ``|predicted - real|``."""

    rounds: list[tuple[str, Comparison]]
    #: Rounds left out of the medians: the machine's speed moved more than ``tolerance`` over them (by the probe).
    set_aside: list[tuple[str, Comparison]] = field(default_factory=list)
    #: Per round label (counted or not): its :func:`machine_speed.probe_spread` (None: no probe reading).
    spreads: dict[str, float | None] = field(default_factory=dict)
    tolerance: float = STEADY_TOLERANCE

    def __post_init__(self) -> None:
        if not self.rounds:
            raise ValueError("no rounds to compare")
        keys = {tuple((p.run, p.calibrated_from) for p in c.predictions) for _, c in self.rounds}
        if len(keys) != 1:
            raise ValueError("the rounds do not make the same predictions")

    @property
    def predictions(self) -> list[Prediction]:
        """The predictions made in every round (their values: the first round's)."""
        return self.rounds[0][1].predictions

    @property
    def median_errors(self) -> list[float]:
        """Per prediction (in :attr:`predictions`' order): the median over the rounds of ``|predicted / real - 1|``."""
        return [
            statistics.median(c.predictions[i].relative_error for _, c in self.rounds)
            for i in range(len(self.predictions))
        ]

    @property
    def worst_relative_error(self) -> float:
        """The largest of the counted predictions' median errors (each a median over the rounds)."""
        return max(e for e, p in zip(self.median_errors, self.predictions) if p.counted)

    @property
    def speedup_error(self) -> float:
        """The median over the rounds of ``|predicted speedup - real speedup|``."""
        return statistics.median(c.speedup_error for _, c in self.rounds)

    @property
    def real_speedup(self) -> float:
        """The median over the rounds of the real speedup (information: the error is :attr:`speedup_error`)."""
        return statistics.median(c.real_speedup for _, c in self.rounds)

    @property
    def predicted_speedup(self) -> float:
        """The median over the rounds of the predicted speedup (information)."""
        return statistics.median(c.predicted_speedup for _, c in self.rounds)

    @property
    def corrected_median_errors(self) -> list[float | None]:
        """Per prediction: the median over the rounds of ``|corrected / real - 1|`` (None: not corrected)."""
        out: list[float | None] = []
        for i in range(len(self.predictions)):
            errors = [c.predictions[i].corrected_error for _, c in self.rounds]
            known = [abs(e) for e in errors if e is not None]
            out.append(statistics.median(known) if len(known) == len(errors) else None)
        return out

    @property
    def corrected_speedup_error(self) -> float:
        """The median over the rounds of the corrected speedup error (information)."""
        return statistics.median(c.corrected_speedup_error for _, c in self.rounds)

    @property
    def largest_lag_difference(self) -> float:
        """The largest ``|predicted - real|`` mean version lag over every round's counted predictions."""
        return max(abs(p.predicted_lag - p.real_lag) for _, c in self.rounds for p in c.predictions if p.counted)

    def lag_line(self) -> str:
        """The predicted staleness against the real one (information, counted in no error figure)."""
        rows = "; ".join(
            f"{label} "
            + ", ".join(
                f"{p.run} from {p.calibrated_from.split(' ')[0]} {p.real_lag:.2f}/{p.predicted_lag:.2f}"
                for p in c.predictions
                if p.counted
            )
            for label, c in self.rounds
        )
        return (
            "version lag (mean param versions between the weights a trained sample was first generated under and the "
            f"weights it trained: real train/staleness_mean / predicted), per round: {rows}; largest |difference| "
            f"{self.largest_lag_difference:.2f} (information, not counted)"
        )

    def corrected_lines(self, width: int) -> list[str]:
        """The machine-drift-corrected errors per round and their medians (information: not counted)."""
        out = [
            "machine-drift-corrected errors (information only, not counted in the last two lines): each cross "
            "prediction re-simulated with its calibrated trainer cost / the training-speed ratio and replica rates x "
            "the decode-speed ratio of the target run relative to the calibration run (the machine speed above; "
            "nothing else of the target run is read): what is left is the model's error, the rest was the machine's",
            f"{'run':<20} {'calibrated from':<28} {'corrected, per round':<{width}} {'median |error|':>14}",
        ]
        for i, (p, med) in enumerate(zip(self.predictions, self.corrected_median_errors)):
            if med is None:
                continue
            signed = ", ".join(f"{c.predictions[i].corrected_error:+.1%}" for _, c in self.rounds)
            out.append(f"{p.run:<20} {p.calibrated_from:<28} {signed:<{width}} {med:>14.1%}")
        out.append(
            "corrected speedup per round, real / predicted (|error|): "
            + ", ".join(
                f"{label} {c.real_speedup:.3f} / {c.corrected_speedup:.3f} ({c.corrected_speedup_error:.3f})"
                for label, c in self.rounds
            )
            + f"; median error {self.corrected_speedup_error:.3f}; largest corrected median |error| "
            f"{max(e for e in self.corrected_median_errors if e is not None):.3f}"
        )
        return out

    def factors_line(self) -> str | None:
        """The speedup's two factors per round and their medians, real / predicted (information); None where a
        round has none."""
        rows = [(label, f) for label, c in self.rounds if (f := c.factors()) is not None]
        if len(rows) < len(self.rounds):
            return None

        def med(k: int, i: int) -> float:
            return statistics.median(f[k][i] for _, f in rows)

        return (
            "speedup as two factors per round, real / predicted (docs/cpu_miniature.md; information, not counted): "
            + ", ".join(
                f"{label} scheduling {f[0][0]:.2f} / {f[1][0]:.2f}, machine {f[0][1]:.2f} / {f[1][1]:.2f}"
                for label, f in rows
            )
            + f"; medians: scheduling {med(0, 0):.3f} / {med(1, 0):.3f}, machine {med(0, 1):.3f} / {med(1, 1):.3f} "
            "(the simulated schedule against the real one; what the machine took back, real and as predicted)"
        )

    def lines(self) -> list[str]:
        """Each round's table, machine speed and speedup; then the medians over the rounds: a table (per-round
        signed errors, the median of the absolute ones), the per-round speedups, the speedup line (the median
        speedup error last on it) and last ``worst relative error: X`` (the largest counted median)."""
        n = len(self.rounds)
        out: list[str] = []
        aside = {label for label, _ in self.set_aside}
        for label, c in sorted(self.rounds + self.set_aside, key=lambda lc: int(lc[0][1:])):
            out.append(round_header(label, c))
            if (spread := self.spreads.get(label)) is not None:
                if label in aside:
                    verdict = f"more than {self.tolerance:.0%}: NOT counted in the medians below"
                elif spread > self.tolerance:
                    verdict = f"more than {self.tolerance:.0%}, counted all the same: too few steady rounds"
                else:
                    verdict = "steady, counted"
                out.append(f"  the machine-speed probe moved {spread:.1%} over this round's runs, {verdict}")
            out += c.table(indent="  ")
            out.append("  " + c.training_line())
            out.append("  " + c.drift_line())
            out.append("  " + c.corrected_line())
            if (probe := c.probe_line()) is not None:
                out.append("  " + probe)
            if (factors := c.factors_line()) is not None:
                out.append("  " + factors)
            out.append(
                f"  speedup: real {c.real_speedup:.3f}, predicted {c.predicted_speedup:.3f}, error "
                f"{c.speedup_error:.3f}; this round's worst wall error {c.worst_relative_error:.3f}"
            )
        labels = ", ".join(label for label, _ in self.rounds)
        out.append(
            f"medians over the {n} round(s) ({labels}): per row, the median over the rounds of |predicted / real - 1|, "
            "each round's prediction against that round's real run; the machine's speed drifts between runs "
            "minutes apart, a median keeps one drifted round from deciding the figure"
            + (
                f"; not counted ({', '.join(label for label, _ in self.set_aside)}): the machine-speed probe moved "
                f"more than {self.tolerance:.0%} over them"
                if self.set_aside
                else ""
            )
        )
        per_round = "per round (signed)"
        width = max(len(per_round), 8 * n)
        out.append(f"{'run':<20} {'calibrated from':<28} {per_round:<{width}} {'median |error|':>14}")
        for i, (p, med) in enumerate(zip(self.predictions, self.median_errors)):
            signed = ", ".join(
                f"{c.predictions[i].predicted_s / c.predictions[i].real_s - 1.0:+.1%}" for _, c in self.rounds
            )
            extra = "" if p.counted else "  (its own fit: information, not counted)"
            out.append(f"{p.run:<20} {p.calibrated_from:<28} {signed:<{width}} {med:>14.1%}{extra}")
        out.append(
            "machine speed, dynamic run / static run per round (training, standalone decode; no counted prediction "
            "reads it): "
            + ", ".join(f"{label} {c.machine_training:.2f}x / {c.machine_decode:.2f}x" for label, c in self.rounds)
        )
        out.append(WALL_NOTE)
        out.append(self.lag_line())
        first = self.rounds[0][1]
        out.append(
            first.assumed_line(
                "the dynamic runs measured " + ", ".join(f"{c.measured_hybrid_ratio:.2f}" for _, c in self.rounds)
            )
        )
        out += self.corrected_lines(width)
        probed = [
            [abs(e) for _, c in self.rounds if (e := c.predictions[i].probe_corrected_error) is not None]
            for i in range(len(self.predictions))
        ]
        if any(len(errors) == n for errors in probed):
            out.append(
                "machine-speed-probe-corrected median |error| (information, not counted): "
                + ", ".join(
                    f"{p.run} from {p.calibrated_from} {statistics.median(errors):.1%}"
                    for p, errors in zip(self.predictions, probed)
                    if len(errors) == n
                )
            )
        if (factors := self.factors_line()) is not None:
            out.append(factors)
        out.append(
            "speedup per round, real / predicted (|error|): "
            + ", ".join(
                f"{label} {c.real_speedup:.3f} / {c.predicted_speedup:.3f} ({c.speedup_error:.3f})"
                for label, c in self.rounds
            )
            + "; the speedup error below is the median of these errors, the worst relative error (last line) the "
            "largest counted median |error| of the first table above (the raw errors, not the corrected ones)"
        )
        out.append(
            f"speedup ({STATIC} / {DYNAMIC}), medians over {n} round(s): real {self.real_speedup:.3f}, predicted "
            f"{self.predicted_speedup:.3f} (static calibration), speedup error: {self.speedup_error:.3f}"
        )
        out.append(f"worst relative error: {self.worst_relative_error:.3f}")
        return out


def compare(
    static_dir: str | Path,
    dynamic_dir: str | Path,
    *,
    hybrid_speed_ratio: float = HOST.hybrid_speed_ratio,
    standalone_speed_with_hybrid: float | None = None,
) -> Comparison:
    """Calibrate from each run, predict the other (and the static run itself), compare with the real walls."""
    static_dir, dynamic_dir = Path(static_dir), Path(dynamic_dir)
    static_report, dynamic_report = read_run(static_dir), read_run(dynamic_dir)  # each trace read once
    real_static, real_dynamic = static_report.wall_s, dynamic_report.wall_s  # the traced walls
    factors = {"standalone_speed_with_hybrid": standalone_speed_with_hybrid}

    from_static = calibrate_run(static_dir, hybrid_speed_ratio=hybrid_speed_ratio, host=HOST)
    static_run = run_from_config(static_dir, from_static, STATIC)
    dynamic_run = run_from_config(dynamic_dir, from_static, DYNAMIC)  # its configuration only
    dynamic_scenario = from_static.scenario_for(dynamic_run, **factors)
    static_self, static_self_lag, static_self_bound = simulated(from_static.scenario_for(static_run, **factors))
    dynamic_pred, dynamic_pred_lag, dynamic_pred_bound = simulated(dynamic_scenario)

    from_dynamic = calibrate_run(dynamic_dir, hybrid_speed_ratio=hybrid_speed_ratio, host=HOST)
    static_from_dynamic = run_from_config(static_dir, from_dynamic, STATIC)
    static_scenario = from_dynamic.scenario_for(static_from_dynamic, **factors)
    static_pred, static_pred_lag, _ = simulated(static_scenario)
    dynamic_self, dynamic_self_lag, _ = simulated(
        from_dynamic.scenario_for(run_from_config(dynamic_dir, from_dynamic, DYNAMIC))
    )
    lag_static, lag_dynamic = real_version_lag(static_dir), real_version_lag(dynamic_dir)

    def ratio(name: str) -> float:  # the dynamic run's value / the static run's, on work both runs did alike
        return from_dynamic.parameter(name).value / from_static.parameter(name).value

    # the machine's speed in the dynamic run relative to the static run: all the corrections read of the target run
    training = 1.0 / ratio("trainer.device_s_per_token")
    # the standalone rate outside the training spans (each run's average over its own training share: the simulator
    # applies replica.speed_while_training to each run's training time itself)
    decode = ratio("info.standalone_tokens_per_s_per_replica") * (
        from_static.standalone_average_over_outside / from_dynamic.standalone_average_over_outside
    )
    # of the measured standalone decode ratio, the swap's assumed factor (the dynamic run's hybrid replicas serve, the
    # static run's never do) is the model's, already in scenario_for's rates; the rest is the machine's
    applied = from_static.standalone_speed_with_hybrid(standalone_speed_with_hybrid)
    machine_decode = decode / applied
    dynamic_corrected = simulated_wall(machine_corrected(dynamic_scenario, training, machine_decode))
    static_corrected = simulated_wall(machine_corrected(static_scenario, 1.0 / training, 1.0 / machine_decode))

    rho = from_dynamic.parameter("hybrid_replica.tokens_per_s").value / (
        from_dynamic.scenario.replica.tokens_per_s * from_dynamic.standalone_average_over_outside
    )  # over the standalone replica's average rate, as hybrid_speed_ratio is
    probe = machine_probe(static_dir, dynamic_dir)
    dynamic_probed = None if probe is None else simulated_wall(machine_corrected(dynamic_scenario, probe, probe))
    static_probed = None if probe is None else simulated_wall(machine_corrected(static_scenario, 1 / probe, 1 / probe))
    return Comparison(
        predictions=[
            Prediction(
                STATIC,
                f"{STATIC} (itself)",
                real_static,
                static_self,
                real_lag=lag_static,
                predicted_lag=static_self_lag,
            ),
            Prediction(
                DYNAMIC,
                STATIC,
                real_dynamic,
                dynamic_pred,
                corrected_s=dynamic_corrected,
                probe_corrected_s=dynamic_probed,
                real_lag=lag_dynamic,
                predicted_lag=dynamic_pred_lag,
            ),
            Prediction(
                STATIC,
                DYNAMIC,
                real_static,
                static_pred,
                corrected_s=static_corrected,
                probe_corrected_s=static_probed,
                real_lag=lag_static,
                predicted_lag=static_pred_lag,
            ),
            Prediction(
                DYNAMIC,
                f"{DYNAMIC} (itself)",
                real_dynamic,
                dynamic_self,
                counted=False,
                real_lag=lag_dynamic,
                predicted_lag=dynamic_self_lag,
            ),
        ],
        real_speedup=real_static / real_dynamic,
        predicted_speedup=static_self / dynamic_pred,
        machine_training=training,
        machine_decode=decode,
        measured_hybrid_ratio=rho,
        hybrid_speed_ratio=hybrid_speed_ratio,
        standalone_speed_with_hybrid=applied,
        standalone_speed_default=standalone_speed_with_hybrid is None,
        machine_probe=probe,
        speed_while_training=(
            from_static.scenario.replica.speed_while_training,
            from_dynamic.scenario.replica.speed_while_training,
        ),
        bounds=(static_report.bound_s, dynamic_report.bound_s, static_self_bound, dynamic_pred_bound),
    )


def probe_ms(run_dir: Path) -> float | None:
    """The run's median machine-speed probe time per work unit while it trained (``cpu_miniature`` writes it to the
    run dir's ``machine_speed.json``); None when the run has no reading."""
    path = run_dir / "machine_speed.json"
    value = json.loads(path.read_text()).get("unit_ms_mean") if path.exists() else None
    return float(value) if value else None


def machine_probe(static_dir: Path, dynamic_dir: Path) -> float | None:
    """How fast the machine ran in the dynamic run against the static one by the independent probe: the static
    run's :func:`probe_ms` over the dynamic run's; None when either run has no reading."""
    static, dynamic = probe_ms(static_dir), probe_ms(dynamic_dir)
    return None if static is None or dynamic is None else static / dynamic


def bracketed(before: Comparison, after: Comparison) -> Comparison:
    """One dynamic run compared against the static runs before and after it (``cpu_miniature --order bracket``):
    ``before`` and ``after`` are :func:`compare` of the same dynamic run with each static run. Every wall (real,
    predicted, corrected), lag and machine-speed ratio is the mean of the two (speed ratios: the geometric mean), so
    the speedups are the mean static wall over the dynamic one, real and predicted alike: a machine whose speed
    drifts linearly across the three runs moves the static side by the dynamic run's own drift, and the
    predictions from the two static calibrations bracket it the same way."""
    if [(p.run, p.calibrated_from) for p in before.predictions] != [
        (p.run, p.calibrated_from) for p in after.predictions
    ]:
        raise ValueError("the two comparisons do not make the same predictions")

    def mean(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (a + b) / 2

    predictions = [
        Prediction(
            a.run,
            a.calibrated_from,
            (a.real_s + b.real_s) / 2,
            (a.predicted_s + b.predicted_s) / 2,
            counted=a.counted,
            corrected_s=mean(a.corrected_s, b.corrected_s),
            real_lag=(a.real_lag + b.real_lag) / 2,
            predicted_lag=(a.predicted_lag + b.predicted_lag) / 2,
            probe_corrected_s=mean(a.probe_corrected_s, b.probe_corrected_s),
        )
        for a, b in zip(before.predictions, after.predictions)
    ]
    static_self, dynamic_pred = predictions[0], predictions[1]
    probes = (before.machine_probe, after.machine_probe)
    return Comparison(
        predictions=predictions,
        real_speedup=static_self.real_s / dynamic_pred.real_s,
        predicted_speedup=static_self.predicted_s / dynamic_pred.predicted_s,
        machine_training=(before.machine_training * after.machine_training) ** 0.5,
        machine_decode=(before.machine_decode * after.machine_decode) ** 0.5,
        measured_hybrid_ratio=before.measured_hybrid_ratio,
        hybrid_speed_ratio=before.hybrid_speed_ratio,
        standalone_speed_with_hybrid=(before.standalone_speed_with_hybrid + after.standalone_speed_with_hybrid) / 2,
        standalone_speed_default=before.standalone_speed_default,
        machine_probe=None if None in probes else (probes[0] * probes[1]) ** 0.5,  # type: ignore[operator]
        speed_while_training=(
            (before.speed_while_training[0] + after.speed_while_training[0]) / 2,
            before.speed_while_training[1],
        ),
        bracketed=True,
        bounds=_mean_bounds(before.bounds, after.bounds),
    )


def _mean_bounds(
    a: tuple[float | None, ...] | None, b: tuple[float | None, ...] | None
) -> tuple[float | None, float | None, float | None, float | None] | None:
    """Two comparisons' bounds averaged one by one (the same dynamic run: its real bound is the same in both)."""
    if a is None or b is None:
        return None
    x = [None if u is None or v is None else (u + v) / 2 for u, v in zip(a, b, strict=True)]
    return (x[0], x[1], x[2], x[3])


def find_rounds(out: str | Path) -> list[tuple[str, list[Path], Path]]:
    """The rounds ``cpu_miniature`` left under ``out``, by ``i``: ``(r{i}, [static_fully_async_r{i}],
    rate_matched_r{i})`` when every round has both runs (``--order alternate``); ``(r{i}, [static_fully_async_r{i},
    static_fully_async_r{i+1}], rate_matched_r{i})`` when the static runs are numbered 1..R+1 and the dynamic ones
    1..R (``--order bracket``: each dynamic run between two static ones)."""
    out = Path(out)
    if not out.is_dir():
        raise CalibrationError(f"{out} is not a folder")
    found: dict[str, dict[int, Path]] = {STATIC: {}, DYNAMIC: {}}
    for child in out.iterdir():
        m = re.fullmatch(rf"({STATIC}|{DYNAMIC})_r(\d+)", child.name)
        if m and child.is_dir():
            found[m.group(1)][int(m.group(2))] = child
    statics, dynamics = sorted(found[STATIC]), sorted(found[DYNAMIC])
    if dynamics and dynamics == list(range(1, len(dynamics) + 1)) and statics == list(range(1, len(dynamics) + 2)):
        return [(f"r{i}", [found[STATIC][i], found[STATIC][i + 1]], found[DYNAMIC][i]) for i in dynamics]
    unpaired = sorted(set(found[STATIC]) ^ set(found[DYNAMIC]))
    if unpaired:
        raise CalibrationError(
            f"{out}: round(s) {', '.join(f'r{i}' for i in unpaired)} lack their {STATIC} or {DYNAMIC} run"
        )
    if not found[STATIC]:
        raise CalibrationError(f"{out} holds no {STATIC}_r{{i}} / {DYNAMIC}_r{{i}} run folders")
    return [(f"r{i}", [found[STATIC][i]], found[DYNAMIC][i]) for i in statics]


def compare_rounds(
    out: str | Path, *, wanted: int | None = None, tolerance: float = STEADY_TOLERANCE, **factors: float
) -> Rounds:
    """:func:`compare` on every round under ``out`` (:func:`find_rounds`), each round on its own; a bracketed
    round's two comparisons combined by :func:`bracketed`. The medians count the rounds
    :func:`machine_speed.counted_rounds` keeps (``wanted``, default all: every round over which the probe moved at
    most ``tolerance``, or the ``wanted`` steadiest); the others are set aside, printed but not counted."""
    rounds, spreads = [], []
    for label, statics, dynamic in find_rounds(out):
        pairs = [compare(s, dynamic, **factors) for s in statics]
        rounds.append((label, pairs[0] if len(pairs) == 1 else bracketed(*pairs)))
        spreads.append(probe_spread([probe_ms(d) for d in (statics[0], dynamic, *statics[1:])]))
    keep = counted_rounds(spreads, wanted or len(rounds), tolerance)
    return Rounds(
        [r for i, r in enumerate(rounds) if i in keep],
        set_aside=[r for i, r in enumerate(rounds) if i not in keep],
        spreads={label: spread for (label, _), spread in zip(rounds, spreads)},
        tolerance=tolerance,
    )


def main(argv: list[str] | None = None) -> Comparison | Rounds:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--reuse",
        nargs="+",
        metavar="DIR",
        help="offline: OUT (every static_fully_async_r{i} / rate_matched_r{i} pair under it, medians over the "
        "rounds) or STATIC_DIR DYNAMIC_DIR (one pair)",
    )
    p.add_argument("--repeats", type=int, default=3, help="rounds of real runs (cpu_miniature's)")
    p.add_argument(
        "--order",
        choices=("bracket", "alternate"),
        default="bracket",
        help="cpu_miniature's run order: bracket (static, dynamic, static, ...: each dynamic run compared with the "
        "mean of the static runs around it; repeats + 1 static runs) or alternate (adjacent (static, dynamic) pairs)",
    )
    p.add_argument(
        "--steady-tolerance",
        type=float,
        default=STEADY_TOLERANCE,
        help="a round counts when the machine-speed probe moved at most this fraction over its runs (cpu_miniature's)",
    )
    p.add_argument("--steps", type=int, default=64, help="optimizer steps per real run")
    p.add_argument("--out", default=None, help="keep the real runs' folders here (default: a temp dir)")
    p.add_argument("--hybrid-speed-ratio", type=float, default=HOST.hybrid_speed_ratio)
    p.add_argument(
        "--standalone-speed-with-hybrid",
        type=float,
        default=None,
        help="convert the standalone rate by this factor across the swap, both ways (default: the machine's "
        f"figure, {HOST.name}'s {HOST.standalone_speed_with_hybrid:g}; Calibration.scenario_for)",
    )
    args, rest = p.parse_known_args(argv)
    factors = {
        "hybrid_speed_ratio": args.hybrid_speed_ratio,
        "standalone_speed_with_hybrid": args.standalone_speed_with_hybrid,
    }
    result: Comparison | Rounds
    if args.reuse:
        if rest:
            p.error(f"unrecognized arguments with --reuse: {' '.join(rest)}")
        if len(args.reuse) == 2:
            result = compare(*args.reuse, **factors)
        elif len(args.reuse) == 1:
            result = compare_rounds(args.reuse[0], wanted=args.repeats, tolerance=args.steady_tolerance, **factors)
        else:
            p.error("--reuse takes OUT (a folder of *_r{i} rounds) or STATIC_DIR DYNAMIC_DIR")
    else:
        if args.repeats < 1:
            p.error("--repeats must be at least 1")
        with tempfile.TemporaryDirectory(prefix="lhr-fidelity-runs-") as tmp:
            out = Path(args.out or tmp)
            _miniature().main(
                [
                    "--policies",
                    f"{STATIC},{DYNAMIC}",
                    "--speedup-policy",
                    DYNAMIC,
                    "--repeats",
                    str(args.repeats),
                    "--order",
                    args.order,
                    "--steps",
                    str(args.steps),
                    "--steady-tolerance",
                    str(args.steady_tolerance),
                    "--out",
                    str(out),
                    *rest,
                ]
            )
            print(f"planner fidelity: the real runs above ({out}), then the predictions, round by round")
            result = compare_rounds(out, wanted=args.repeats, tolerance=args.steady_tolerance, **factors)
    print("\n".join(result.lines()))
    return result


if __name__ == "__main__":
    main()
