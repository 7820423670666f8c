"""A scenario fitted to a real run: the simulator's parameters measured from the run's trace, metrics and config.

``lhr simulate --from-run RUN_DIR`` (issue #15, build 1). :func:`calibrate` reads what a run recorded (its
``trace.json``, :mod:`lightning_hybrid_rollout.trace`; optionally its ``metrics.csv`` and saved ``config.yaml``)
and returns a :class:`Calibration`: a :class:`~lightning_hybrid_rollout.sim.scenario.Scenario` with one run, the
run's own split and options, and one :class:`FittedParameter` per scenario number saying its value, its spread
over the run's sync cycles, how many observations it rests on and where it came from. What the run did not record
keeps the default (of the class, or of a ``defaults`` scenario) and says so (``source`` starts with ``default``).

What is read from where (docs/simulator.md, "Calibrating from a real run"):

* the split: the devices the trace's tracks describe (``trainer/trainer``, ``replica/<kind>_<i>``);
* decode rates: the running totals ``decoded_tokens.<role>`` / ``serving_s.<role>`` per sync cycle, per replica
  (each replica's throughput at its concurrency); ``tokens_per_s`` is that throughput divided by the model's
  ``X(m) / tokens_per_s = m / (1 + batch_slowdown·(m − 1))`` averaged over the role's ``active`` spans inside the
  counted window (the trainer's first span to the last cycle's end), ``m`` from the ``in_flight`` counter (held at
  its first value before its first sample), or at ``m = cap`` without one; ``batch_slowdown`` not measured. A run
  whose hybrid replicas never served (a static run) gets ``hybrid_replica.tokens_per_s`` = ``hybrid_speed_ratio``
  (:data:`HYBRID_SPEED_RATIO`, an assumption) × the standalone one;
* the trainer: ``training`` spans × devices over the trained tokens (``trained_tokens`` + ``trained_samples`` ×
  ``prompt_tokens``) per cycle; ``step_overhead_s``: the trainer track's time outside its spans (Lightning's loop,
  logging, the cycle's bookkeeping) per training span;
* lengths: the mean trained response length per cycle (``trained_tokens`` / ``trained_samples``), a line over the
  cycles (``mean_tokens``, ``drift_per_step``; the first cycle, biased to the responses that finish first, is left
  out when there are three or more), or the per-step ``train/response_length_mean`` of ``metrics.csv`` when the
  trace has fewer than three cycles; ``sigma`` from the within-cycle spread (``trained_tokens_sq``), and
  ``mean_tokens`` (and ``sigma``) chosen so that the model's log-normal, clipped at one token and
  ``rollout.response_length``, has the measured mean (and spread); ``prompt_tokens`` = ``trained_prompt_tokens`` /
  ``trained_samples``;
* switch costs: the trainer's ``weight_sync`` spans (``standalone_sync_s``; ``hybrid_sync_s`` when it has its own),
  its ``switching`` spans by ``args.op`` (the simulator's one per pool method), or, for the runtime's one
  ``activate`` / ``deactivate`` span, split by the hybrid replica's own spans inside it (wake until its ``syncing``
  span, the hybrid sync, ``add`` + ``resume`` after; remove + abort until its ``switching`` span, sleep after);
  ``standalone_commit_s``: the standalone replicas' ``syncing`` spans of a staged sync; a cost the run never paid
  (a static run's hybrid wake, sync, sleep, ...) is its default scaled as the measured ``standalone_sync_s`` is
  (the defaults' proportions at this run's speed: an assumption);
* the workload and the run's options: the saved config's ``async_training`` and ``rollout`` sections (found
  anywhere in ``config.yaml``, e.g. in the Lightning CLI's layout), else the trace (samples per training span,
  training spans per cycle, the simulator's run metadata).

Values are the totals' ratios (token-weighted), spreads the interquartile range of the per-cycle values.

:meth:`Calibration.scenario_for` swaps the measured run for another of the same workload (another policy, static
instead of dynamic): a prediction. The standalone rate converts between a run whose hybrid replicas serve and one
where they never do by :data:`STANDALONE_SPEED_WITH_HYBRID` (an assumption; ``benchmarks/planner_fidelity.py``
measures how well the swap predicts, issue #15).

Example::

    from lightning_hybrid_rollout.sim.calibrate import calibrate_run

    fit = calibrate_run("tests/data/cpu_miniature_default_8_steps")
    print("\\n".join(fit.lines()))
    fit.write_yaml("fitted.yaml")  # edit, then: lhr simulate fitted.yaml
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.config import RUN_CONFIG_FILE, AsyncTrainingConfig, ConfigError
from lightning_hybrid_rollout.errors import CalibrationError as CalibrationError  # re-exported
from lightning_hybrid_rollout.sim.scenario import (
    RUN_KEYS,
    ReplicaModel,
    RunSpec,
    Scenario,
    ScenarioError,
    SwitchCosts,
    TrainerModel,
)
from lightning_hybrid_rollout.trace import (
    DECODED_TOKENS,
    IN_FLIGHT,
    SERVING_S,
    TRAINED_PROMPT_TOKENS,
    TRAINED_SAMPLES,
    TRAINED_TOKENS,
    TRAINED_TOKENS_SQ,
    TRAINER_TRACK,
    Span,
    TraceData,
    load_trace,
)

__all__ = [
    "HYBRID_SPEED_RATIO",
    "STANDALONE_SPEED_WITH_HYBRID",
    "Calibration",
    "CalibrationError",
    "FittedParameter",
    "calibrate",
    "calibrate_run",
    "find_config",
]

#: The workload keys of ``async_training`` a scenario holds once (the rest are a run's own, ``RUN_KEYS``).
_WORKLOAD_KEYS: tuple[str, ...] = (
    "mini_batch_size",
    "require_batches",
    "trigger_parameter_sync_step",
    "staleness_threshold",
)
#: The simulator's pool methods (its trainer spans' ``args.op``) and the switch cost each one charges.
_OP_COSTS: dict[str, str] = {
    "wake_up_replicas": "wake_s",
    "sync_weights": "hybrid_sync_s",
    "add_replicas": "add_s",
    "resume_generation_replicas": "resume_s",
    "remove_replicas": "remove_s",
    "abort_replicas": "abort_s",
    "sleep_replicas": "sleep_s",
    "rebalance_requests": "rebalance_s",
}
_NOT_MEASURED = "default, not measured"

#: A run whose hybrid replicas never served (a static run) cannot measure their speed: their ``tokens_per_s`` is
#: assumed this fraction of the standalone replicas' (``ρ``, the bound's hybrid/standalone ratio within one run).
#: 0.73: the middle of the 0.70-0.76 the CPU miniature's dynamic runs measured (docs/cpu_miniature.md, issue #14),
#: where the hybrid replica shares the trainer's core; ``calibrate(..., hybrid_speed_ratio=)`` overrides it.
HYBRID_SPEED_RATIO = 0.73
#: The standalone replicas' speed in a run whose hybrid replicas serve, over their speed in a run where they never
#: do (:meth:`Calibration.scenario_for` converts between the two). 1.0: on the CPU miniature, every trainer thread
#: pinned to the trainer's core, the standalone replica keeps its rate in a dynamic run (docs/cpu_miniature.md: 4620
#: vs 4620 tok/s; issue #15's pair 4277 static vs 4291 dynamic); the one dynamic run measured 15% slower (4283 vs
#: 3656) ran under more load from other processes (4.6 vs 3.2), which no fit can know. Set it below 1 where hybrid
#: replicas contend with the standalone ones (a shared host, memory bandwidth):
#: ``scenario_for(..., standalone_speed_with_hybrid=)``.
STANDALONE_SPEED_WITH_HYBRID = 1.0


@dataclass(frozen=True)
class FittedParameter:
    """One fitted scenario number.

    Args:
        name: Its place in the scenario (``replica.tokens_per_s``, ``switch.wake_s``, ``async_training.X``, ...), or
            a measurement that is not a scenario number (``info.*``: shown, not written).
        value: The value written into the scenario.
        spread: Interquartile range of the per-observation values (same unit; None with fewer than two).
        observations: How many values it rests on (0: not measured).
        source: Where it came from (``default, not measured`` when the run did not record it).
    """

    name: str
    value: Any
    spread: float | None
    observations: int
    source: str

    @property
    def measured(self) -> bool:
        """Whether the run recorded it (the value is not a default)."""
        return self.observations > 0


@dataclass
class Calibration:
    """A fitted scenario and what each of its numbers rests on.

    Args:
        scenario: The scenario: one run, the measured run's split and options.
        parameters: One :class:`FittedParameter` per fitted number, in the scenario's order.
        notes: What the run did not record and other caveats, one line each.
    """

    scenario: Scenario
    parameters: list[FittedParameter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hybrid_served: bool = False
    hybrid_speed_ratio: float | None = None

    def scenario_for(
        self,
        run: Mapping[str, Any] | RunSpec,
        *,
        standalone_speed_with_hybrid: float | None = None,
        hybrid_speed_ratio: float | None = None,
    ) -> Scenario:
        """The fitted scenario with ``run`` instead of the measured run: a prediction of another run of the same
        workload on the same machine (another policy, static instead of dynamic, other options, another split).

        The standalone replicas' rate is converted between a run whose hybrid replicas serve and one where they
        never do (``run`` is static, or its policy is ``static_fully_async``): multiplied by
        ``standalone_speed_with_hybrid`` (default :data:`STANDALONE_SPEED_WITH_HYBRID`) from a static fit to a
        serving run, divided by it the other way. Where the fitted run never measured the hybrid replicas, their rate
        is ``hybrid_speed_ratio`` (default: the fit's, :data:`HYBRID_SPEED_RATIO`) × the converted standalone rate.

        Args:
            run: The run to predict (a :class:`~lightning_hybrid_rollout.sim.scenario.RunSpec` or its mapping:
                ``name``, ``train_devices``, ``rollout_devices``, ``hybrid``, ``async_training`` of
                :data:`~lightning_hybrid_rollout.sim.scenario.RUN_KEYS`).
            standalone_speed_with_hybrid: The conversion factor (0 < f).
            hybrid_speed_ratio: ``ρ`` when the fit did not measure it (ignored when it did).

        Raises:
            CalibrationError: A factor that is not > 0, or a run the scenario refuses.
        """
        f = (
            STANDALONE_SPEED_WITH_HYBRID
            if standalone_speed_with_hybrid is None
            else float(standalone_speed_with_hybrid)
        )
        rho = self.hybrid_speed_ratio if hybrid_speed_ratio is None else float(hybrid_speed_ratio)
        if not f > 0 or (rho is not None and not rho > 0):
            raise CalibrationError(
                f"standalone_speed_with_hybrid and hybrid_speed_ratio must be > 0, got {f} and {rho}"
            )
        data = self.scenario.to_dict()
        data["runs"] = [dataclasses.asdict(run) if isinstance(run, RunSpec) else dict(run)]
        try:
            probe = Scenario.from_dict(data)
        except ScenarioError as err:
            raise CalibrationError(f"the run to predict is not valid here: {err}") from None
        spec = probe.runs[0]
        serves = spec.hybrid and spec.policy != "static_fully_async"
        v = self.scenario.replica.tokens_per_s
        if self.hybrid_served and not serves:
            v /= f
        elif serves and not self.hybrid_served:
            v *= f
        data["replica"] = {**data["replica"], "tokens_per_s": v}
        if self.hybrid_speed_ratio is not None and rho is not None:  # not measured: follows the standalone rate
            hybrid = data["hybrid_replica"] or dict(data["replica"])
            data["hybrid_replica"] = {**hybrid, "tokens_per_s": rho * v}
        return Scenario.from_dict(data)

    def parameter(self, name: str) -> FittedParameter:
        """The parameter called ``name``."""
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(f"no fitted parameter {name!r}; fitted: {[p.name for p in self.parameters]}")

    def lines(self) -> list[str]:
        """The fitted parameters, one line each (``name = value (IQR x, n obs; source)``), then the notes."""
        out = []
        width = max((len(p.name) for p in self.parameters), default=0)
        for p in self.parameters:
            spread = "" if p.spread is None else f"IQR {_fmt(p.spread)}, "
            obs = f"{p.observations} obs; " if p.observations else ""
            out.append(f"{p.name:<{width}} = {_fmt(p.value):>10}  ({spread}{obs}{p.source})")
        out += [f"note: {n}" for n in self.notes]
        return out

    def to_yaml(self) -> str:
        """The scenario as YAML (what ``lhr simulate FILE`` reads), with a header saying where it came from."""
        import yaml

        head = [
            f"# fitted by `lhr simulate --from-run` from run {self.scenario.runs[0].name!r}; edit and re-run.",
            "# numbers not measured by the run keep their defaults (see the fit's report).",
        ]
        return "\n".join(head) + "\n" + yaml.safe_dump(self.scenario.to_dict(), sort_keys=False)

    def write_yaml(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_yaml` to ``path``; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(), encoding="utf-8")
        return path


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None or isinstance(v, (str, int)):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _iqr(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


# ------------------------------------------------------------------------------------------------------ inputs


def find_config(run_dir: str | os.PathLike[str]) -> Path | None:
    """The run's saved config in ``run_dir``: ``config.yaml`` (the Lightning CLI's) if there, else the callback's own
    copy (:data:`~lightning_hybrid_rollout.config.RUN_CONFIG_FILE`), else None."""
    for name in ("config.yaml", RUN_CONFIG_FILE):
        path = Path(run_dir) / name
        if path.is_file():
            return path
    return None


def _sections(doc: Any, out: dict[str, Mapping[str, Any]]) -> None:
    """The first ``async_training`` and ``rollout`` mappings anywhere in a config document."""
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            if key in ("async_training", "rollout") and isinstance(value, Mapping) and key not in out:
                out[key] = value
            else:
                _sections(value, out)
    elif isinstance(doc, list):
        for item in doc:
            _sections(item, out)


def _read_metrics(path: Path) -> list[dict[str, float]]:
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            parsed = {}
            for k, v in row.items():
                try:
                    parsed[k] = float(v)
                except (TypeError, ValueError):
                    continue
            rows.append(parsed)
    return rows


def calibrate_run(
    run_dir: str | os.PathLike[str],
    *,
    config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    defaults: Scenario | None = None,
    require_metrics: bool = False,
    hybrid_speed_ratio: float | None = None,
) -> Calibration:
    """:func:`calibrate` the run in ``run_dir`` (``trace.json``, ``metrics.csv`` if there, ``config.yaml`` if there).

    Args:
        run_dir: The run's folder.
        config: The run's saved config (a YAML file or its loaded mapping) when it is not ``RUN_DIR/config.yaml``.
        defaults: A scenario whose numbers stand in for what the run did not measure (default: the classes').
        require_metrics: Refuse a folder without ``metrics.csv``.
        hybrid_speed_ratio: ``ρ`` assumed when the hybrid replicas never served (:func:`calibrate`).

    Raises:
        CalibrationError: No such folder, no ``trace.json`` (or ``metrics.csv`` when required), an unreadable trace
            or config, or a trace without what every fit needs.
    """
    import yaml

    path = Path(run_dir)
    if not path.is_dir():
        raise CalibrationError(f"{path} is not a folder: give the run's folder (it holds trace.json and metrics.csv)")
    trace_path = path / "trace.json"
    if not trace_path.is_file():
        raise CalibrationError(
            f"no trace.json in {path}: run training with the trace enabled (it writes RUN_DIR/trace.json)"
        )
    metrics_path = path / "metrics.csv"
    if require_metrics and not metrics_path.is_file():
        raise CalibrationError(
            f"no metrics.csv in {path}: the run's per-step metrics (Lightning's CSVLogger) are needed"
        )
    try:
        trace = load_trace(trace_path)
    except ValueError as err:
        raise CalibrationError(str(err)) from None
    rows = _read_metrics(metrics_path) if metrics_path.is_file() else None
    doc: Any = None
    config_name = "config"
    if config is None:
        found = find_config(path)
        if found is not None:
            config = found
    if isinstance(config, Mapping):
        doc = config
    elif config is not None:
        config_name = str(config)
        try:
            doc = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise CalibrationError(f"{config}: cannot read the run's config: {err}") from None
    name = str(trace.metadata.get("run") or path.name)
    fit = calibrate(
        trace,
        rows,
        doc,
        name=name,
        defaults=defaults,
        config_name=config_name,
        hybrid_speed_ratio=hybrid_speed_ratio,
    )
    if rows is None:
        fit.notes.append(f"no metrics.csv in {path}: lengths come from the trace's counters only")
    return fit


# ------------------------------------------------------------------------------------------------------ the fit


@dataclass
class _Cycle:
    """One sync cycle's deltas of the running totals and its trainer spans."""

    start: float
    end: float
    samples: float
    tokens: float
    decoded: dict[str, float]
    serving: dict[str, float]
    train_s: float = 0.0
    train_spans: int = 0
    tokens_sq: float | None = None  # squared response lengths summed (the runtime's TRAINED_TOKENS_SQ)
    prompt_tokens: float | None = None  # their prompt tokens (TRAINED_PROMPT_TOKENS)
    untraced_s: float = 0.0  # the trainer's time in the cycle outside its spans (Lightning's loop, bookkeeping)


def _totals_at(trace: TraceData) -> tuple[list[float], dict[str, list[float]]]:
    """Cycle-end times (the ``trained_samples`` samples) and each running total's value at each."""
    ends = [c.t for c in trace.counter_series(TRAINED_SAMPLES)]
    names = {c.name for c in trace.counters}
    names = {
        n
        for n in names
        if n in (TRAINED_SAMPLES, TRAINED_TOKENS, TRAINED_TOKENS_SQ, TRAINED_PROMPT_TOKENS)
        or n.startswith((f"{DECODED_TOKENS}.", f"{SERVING_S}."))
    }
    values: dict[str, list[float]] = {}
    for n in names:
        series = trace.counter_series(n)
        out = []
        for t in ends:
            v = 0.0
            for c in series:
                if c.t <= t + 1e-9:
                    v = c.value
            out.append(v)
        values[n] = out
    return ends, values


def _cycles(trace: TraceData, spans: list[Span]) -> list[_Cycle]:
    ends, values = _totals_at(trace)
    start = spans[0].start_s if spans else 0.0
    out = []
    for i, t in enumerate(ends):

        def delta(name: str, i: int = i) -> float:
            v = values.get(name)
            if v is None:
                return 0.0
            return v[i] - (v[i - 1] if i else 0.0)

        roles = ("standalone", "hybrid")
        c = _Cycle(
            start,
            t,
            delta(TRAINED_SAMPLES),
            delta(TRAINED_TOKENS),
            {r: delta(f"{DECODED_TOKENS}.{r}") for r in roles},
            {r: delta(f"{SERVING_S}.{r}") for r in roles},
        )
        if TRAINED_TOKENS_SQ in values:
            c.tokens_sq = delta(TRAINED_TOKENS_SQ)
        if TRAINED_PROMPT_TOKENS in values:
            c.prompt_tokens = delta(TRAINED_PROMPT_TOKENS)
        covered = 0.0
        for s in spans:
            if s.name == "training" and start - 1e-9 <= s.end_s <= t + 1e-9:
                c.train_s += s.end_s - s.start_s
                c.train_spans += 1
            covered += max(0.0, min(s.end_s, t) - max(s.start_s, start))
        c.untraced_s = max(0.0, (t - start) - covered)
        out.append(c)
        start = t
    return out


def _count(devices: Any) -> int:
    if isinstance(devices, (int, float)) and not isinstance(devices, bool):
        return int(devices)
    return len(devices or ())


class _Fit:
    """Collects the parameters while the scenario's sections are built."""

    def __init__(self) -> None:
        self.params: list[FittedParameter] = []
        self.notes: list[str] = []

    def add(
        self, name: str, value: Any, source: str, values: Sequence[float] = (), observations: int | None = None
    ) -> Any:
        n = len(values) if observations is None else observations
        self.params.append(FittedParameter(name, value, _iqr(values), n, source))
        return value

    def default(self, name: str, value: Any, why: str = "") -> Any:
        self.params.append(FittedParameter(name, value, None, 0, _NOT_MEASURED + (f" ({why})" if why else "")))
        return value


def _occupancy(
    trace: TraceData, kind: str, cap: int, beta: float, window: tuple[float, float]
) -> tuple[float, float] | None:
    """``(mean g(m), mean m)`` over the ``active`` spans of ``kind``'s replicas inside ``window`` (the counted
    cycles: the running totals count from the trainer's first span to the last cycle's end), ``g(m) = m / (1 +
    β(m − 1))`` (the model's throughput over ``tokens_per_s``) and ``m = min(cap, in_flight / active replicas)``; the
    ``in_flight`` counter holds its first value before its first sample (the runtime samples it at cycle ends only).
    None without an ``in_flight`` counter or active time in the window."""
    series = trace.counter_series(IN_FLIGHT)
    if not series:
        return None
    lo, hi = window
    active: list[tuple[str, float, float]] = []
    for track, info in trace.tracks.items():
        if track.startswith("replica/") and info.get("kind") in ("standalone", "hybrid"):
            for s in trace.spans_of(track):
                a, b = max(s.start_s, lo), min(s.end_s, hi)
                if s.name == "active" and b > a:
                    active.append((str(info["kind"]), a, b))
    points = sorted({lo, hi} | {c.t for c in series if lo < c.t < hi} | {t for _, a, b in active for t in (a, b)})
    total = weighted = occupancy = 0.0
    j, value = 0, series[0].value
    for t0, t1 in itertools.pairwise(points):
        while j < len(series) and series[j].t <= t0 + 1e-12:
            value = series[j].value
            j += 1
        mid = 0.5 * (t0 + t1)
        on = [k for k, a, b in active if a <= mid < b]
        mine = sum(1 for k in on if k == kind)
        if not mine:
            continue
        m = min(float(cap), value / len(on))
        g = m / (1.0 + beta * (m - 1.0)) if m > 0 else 0.0
        weighted += mine * g * (t1 - t0)
        occupancy += mine * m * (t1 - t0)
        total += mine * (t1 - t0)
    if total <= 0 or weighted <= 0:
        return None
    return weighted / total, occupancy / total


#: Standard-normal quadrature nodes ``(z, weight)`` on [-6, 6] for the clipped log-normal's moments.
_NODES: list[tuple[float, float]] = []
for _i in range(240):
    _z = -6.0 + 12.0 * (_i + 0.5) / 240
    _NODES.append((_z, math.exp(-0.5 * _z * _z)))
_NODES = [(z, w / sum(w for _, w in _NODES)) for z, w in _NODES]


def _clipped_moments(mean: float, sigma: float, lo: float, hi: float) -> tuple[float, float]:
    """Mean and standard deviation of ``clip(mean·exp(σz − σ²/2), lo, hi)``, ``z`` standard normal (the length
    model's draw, :class:`~lightning_hybrid_rollout.sim.scenario.LengthModel`)."""
    m = m2 = 0.0
    for z, w in _NODES:
        x = min(hi, max(lo, mean * math.exp(sigma * z - 0.5 * sigma * sigma)))
        m += w * x
        m2 += w * x * x
    return m, math.sqrt(max(0.0, m2 - m * m))


def _fit_lognormal(mean: float, sd: float | None, lo: float, hi: float, sigma: float = 0.0) -> tuple[float, float]:
    """``(unclipped mean, sigma)`` of the length model whose clipped draws have ``mean`` (and ``sd``, when given;
    else ``sigma`` is kept): bisection on each (the clipped mean rises with the unclipped one, the spread with σ)."""
    if not lo < mean < hi:
        return mean, sigma if sd is None else 0.0

    def unclipped(sig: float) -> float:
        a, b = math.log(lo) - 10.0, math.log(hi) + 10.0
        for _ in range(50):
            mid = 0.5 * (a + b)
            if _clipped_moments(math.exp(mid), sig, lo, hi)[0] < mean:
                a = mid
            else:
                b = mid
        return math.exp(0.5 * (a + b))

    if sd is None:
        return unclipped(sigma), sigma
    a, b = 0.0, 3.0
    for _ in range(40):
        mid = 0.5 * (a + b)
        if _clipped_moments(unclipped(mid), mid, lo, hi)[1] < sd:
            a = mid
        else:
            b = mid
    sig = 0.5 * (a + b)
    return unclipped(sig), sig


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b·x``: ``(a, b)``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def calibrate(
    trace: TraceData,
    metrics_rows: Sequence[Mapping[str, float]] | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    name: str = "run",
    defaults: Scenario | None = None,
    config_name: str = "config",
    hybrid_speed_ratio: float | None = None,
) -> Calibration:
    """Fit a scenario to one run (pure: the loaded trace, metrics rows and config document; see the module doc).

    Args:
        trace: The run's trace (:func:`~lightning_hybrid_rollout.trace.load_trace`).
        metrics_rows: ``metrics.csv``'s rows (numbers only), or None.
        config: The run's saved config document (its ``async_training`` / ``rollout`` sections are found anywhere
            in it), or None.
        name: The fitted run's name.
        defaults: A scenario whose numbers stand in for what the run did not measure (default: the classes').
        config_name: How the report names the config (its file).
        hybrid_speed_ratio: When the hybrid replicas never served (a static run): their ``tokens_per_s`` over the
            standalone replicas' (default :data:`HYBRID_SPEED_RATIO`); ignored when the run measured it.

    Raises:
        CalibrationError: The trace has no trainer span, no cycle totals (``trained_samples``, ...) or no replica
            track, or the config's sections are not valid.
    """
    fit = _Fit()
    base = defaults or Scenario(name="defaults")
    hybrid_speed_ratio = HYBRID_SPEED_RATIO if hybrid_speed_ratio is None else float(hybrid_speed_ratio)
    if not hybrid_speed_ratio > 0:
        raise CalibrationError(f"hybrid_speed_ratio must be > 0, got {hybrid_speed_ratio}")
    spans = trace.spans_of(TRAINER_TRACK)
    if not any(s.name == "training" for s in spans):
        raise CalibrationError(f"the trace has no {TRAINER_TRACK} training span: nothing to fit the trainer to")
    cycles = _cycles(trace, spans)
    if not cycles:
        raise CalibrationError(
            f"the trace has no {TRAINED_SAMPLES} counter: it predates the runtime's per-cycle totals "
            "(lightning_hybrid_rollout.trace), so the rates cannot be fitted"
        )
    # the running totals count from the trainer's first span (training began) to the last cycle's end
    window = (min(s.start_s for s in spans), cycles[-1].end)
    hybrid_assumed: float | None = None
    sections: dict[str, Mapping[str, Any]] = {}
    if config is not None:
        _sections(config, sections)
        if not sections:
            fit.notes.append(f"{config_name} has no async_training or rollout section: settings not read back")
    meta = trace.metadata

    # ------------------------------------------------------------------------------ split, replicas, devices
    kinds: dict[str, list[dict[str, Any]]] = {"standalone": [], "hybrid": []}
    for track, info in sorted(trace.tracks.items()):
        if track.startswith("replica/") and info.get("kind") in kinds:
            kinds[str(info["kind"])].append(info)
    if not kinds["standalone"] and not kinds["hybrid"]:
        raise CalibrationError("the trace describes no replica track (replica/<kind>_<i> with kind and devices)")
    trainer_devices = _count(trace.tracks.get(TRAINER_TRACK, {}).get("devices"))
    hybrid_devices = sum(_count(i.get("devices")) for i in kinds["hybrid"])
    T = trainer_devices or hybrid_devices
    if not T:
        raise CalibrationError(f"the trace describes neither the {TRAINER_TRACK} track's devices nor hybrid replicas'")
    S = sum(_count(i.get("devices")) for i in kinds["standalone"])
    fit.add("runs[0].train_devices", T, "trace: the trainer track's devices", observations=1)
    fit.add("runs[0].rollout_devices", S, "trace: the standalone replica tracks' devices", observations=1)
    rollout = dict(sections.get("rollout") or {})

    cap_from_tracks = [int(i["concurrency"]) for infos in kinds.values() for i in infos if i.get("concurrency")]
    if cap_from_tracks:
        cap = fit.add(
            "concurrent_samples_per_replica",
            cap_from_tracks[0],
            "trace: the replica tracks' concurrency",
            observations=len(cap_from_tracks),
        )
    elif "concurrent_samples_per_replica" in rollout:
        cap = fit.add(
            "concurrent_samples_per_replica",
            int(rollout["concurrent_samples_per_replica"]),
            f"{config_name}: rollout.concurrent_samples_per_replica",
            observations=1,
        )
    else:
        cap = fit.default("concurrent_samples_per_replica", base.concurrent_samples_per_replica, "no saved config")

    models: dict[str, ReplicaModel] = {}
    for kind, template in (("standalone", base.replica), ("hybrid", base.hybrid_model)):
        infos = kinds[kind]
        if not infos:
            continue
        section = "replica" if kind == "standalone" else "hybrid_replica"
        devices = _count(infos[0].get("devices")) or template.devices
        if len({_count(i.get("devices")) for i in infos}) > 1:
            fit.notes.append(
                f"the {kind} replicas have different device counts; the model uses the first's ({devices})"
            )
        fit.add(f"{section}.devices", devices, f"trace: replica/{kind}_* tracks' devices", observations=len(infos))
        per_cycle = [
            c.decoded[kind] / c.serving[kind] / len(infos)
            for c in cycles
            if c.serving[kind] > 0 and c.decoded[kind] > 0
        ]
        tokens = sum(c.decoded[kind] for c in cycles)
        serving = sum(c.serving[kind] for c in cycles)
        beta = fit.default(f"{section}.batch_slowdown", template.batch_slowdown)
        if per_cycle and serving > 0:
            x = tokens / serving / len(infos)
            fit.add(
                f"info.{kind}_tokens_per_s_per_replica",
                x,
                f"trace: {DECODED_TOKENS}.{kind} / {SERVING_S}.{kind} / {len(infos)} replica(s), per cycle",
                per_cycle,
            )
            occupied = _occupancy(trace, kind, cap, beta, window)
            if occupied is not None:
                mean_g, mean_m = occupied
                weighted_s = serving * len(infos) * mean_g  # the replicas' serving seconds x g at their load
                fit.add(
                    f"info.{kind}_mean_concurrency",
                    mean_m,
                    f"trace: {IN_FLIGHT} / active replicas, at most cap {cap}",
                    observations=1,
                )
                v = fit.add(
                    f"{section}.tokens_per_s",
                    tokens / weighted_s,
                    f"trace: {DECODED_TOKENS}.{kind} / ({SERVING_S}.{kind} x replicas x the mean m/(1+b(m-1)) over "
                    f"their active spans), m from {IN_FLIGHT} (batch_slowdown {beta:g})",
                    [p * tokens / weighted_s / x for p in per_cycle],
                )
            else:
                scale = cap / (1.0 + beta * (cap - 1))  # X(cap) / tokens_per_s
                v = fit.add(
                    f"{section}.tokens_per_s",
                    x / scale,
                    f"trace: that throughput / {scale:.4g} (the model's X(cap)/v at cap {cap}, "
                    f"batch_slowdown {beta:g}; "
                    f"no {IN_FLIGHT} counter: replicas assumed full)",
                    [p / scale for p in per_cycle],
                )
        elif kind == "hybrid" and "standalone" in models:
            v = hybrid_speed_ratio * models["standalone"].tokens_per_s
            hybrid_assumed = hybrid_speed_ratio
            fit.default(
                f"{section}.tokens_per_s",
                v,
                f"the hybrid replicas never served: hybrid_speed_ratio {hybrid_speed_ratio:g} x replica.tokens_per_s, "
                "assumed (calibrate(hybrid_speed_ratio=...) overrides)",
            )
        else:
            v = fit.default(f"{section}.tokens_per_s", template.tokens_per_s, f"the {kind} replicas never served")
        fit.default(f"{section}.kv_cache_tokens", template.kv_cache_tokens)
        models[kind] = ReplicaModel(
            devices=devices,
            tokens_per_s=v,
            batch_slowdown=beta,
            concurrency=None,
            kv_cache_tokens=template.kv_cache_tokens,
        )
    standalone_model = models.get("standalone") or models["hybrid"]
    hybrid_model = models.get("hybrid")

    # ------------------------------------------------------------------------------------ workload and options
    cycles_done = len(cycles)
    steps_per_cycle = [c.train_spans for c in cycles if c.train_spans > 0]
    per_step = [c.samples / c.train_spans for c in cycles if c.train_spans > 0 and c.samples > 0]
    at_section = dict(sections.get("async_training") or {})
    try:
        config_at = AsyncTrainingConfig.from_dict(at_section) if at_section else None
    except ConfigError as err:
        raise CalibrationError(f"{config_name}: {err}") from None
    workload: dict[str, Any] = {}
    if config_at is not None:
        for key in _WORKLOAD_KEYS:
            workload[key] = fit.add(
                f"async_training.{key}", getattr(config_at, key), f"{config_name}: async_training.{key}", observations=1
            )
        measured_required = statistics.median(per_step) if per_step else None
        if measured_required is not None and not math.isclose(
            measured_required, config_at.required_samples, rel_tol=1e-6
        ):
            fit.notes.append(
                f"the trace's samples per training step ({measured_required:g}) differ from the config's "
                f"required_samples "
                f"({config_at.required_samples}): is {config_name} this run's?"
            )
    else:
        trigger = round(statistics.median(steps_per_cycle)) if steps_per_cycle else base.trigger_parameter_sync_step
        if steps_per_cycle:
            fit.add(
                "async_training.trigger_parameter_sync_step",
                trigger,
                "trace: training spans per sync cycle (median)",
                [float(x) for x in steps_per_cycle],
            )
        else:
            fit.default("async_training.trigger_parameter_sync_step", trigger, "no saved config")
        required = round(statistics.median(per_step)) if per_step else base.required_samples
        if per_step:
            fit.add(
                "async_training.mini_batch_size",
                required,
                "trace: trained_samples per training span (median; require_batches 1)",
                per_step,
            )
        else:
            fit.default("async_training.mini_batch_size", required, "no saved config")
        staleness = fit.default("async_training.staleness_threshold", base.staleness_threshold, "no saved config")
        workload = {
            "mini_batch_size": required,
            "trigger_parameter_sync_step": trigger,
            "staleness_threshold": staleness,
        }
    run_changes: dict[str, Any] = {}
    if config_at is not None:
        for key in RUN_KEYS:
            value = getattr(config_at, key)
            run_changes[key] = fit.add(
                f"runs[0].async_training.{key}", value, f"{config_name}: async_training.{key}", observations=1
            )
    elif meta.get("source") == "simulator":
        from_meta = {
            "dynamic_schedule_policy": meta.get("policy"),
            "dynamic_schedule_enable_rebalance": meta.get("enable_rebalance"),
            "overlap_sync": meta.get("sequencing") == "overlap_sync" if "sequencing" in meta else None,
            "early_first_sync": meta.get("early_first_sync"),
            "staged_standalone_sync": meta.get("staged_standalone_sync"),
            "standalone_sync_mode": meta.get("standalone_sync_mode"),
        }
        for key, value in from_meta.items():
            if value is not None:
                run_changes[key] = fit.add(
                    f"runs[0].async_training.{key}", value, "trace metadata (simulator)", observations=1
                )
    else:
        fit.notes.append("no saved config: the run's policy and options are the config's defaults")
    hybrid = bool(kinds["hybrid"])

    group_size = 1
    if "n" in rollout:
        group_size = fit.add(
            "group_size", int(rollout["n"]), f"{config_name}: rollout.n (samples per prompt)", observations=1
        )
    else:
        fit.default("group_size", base.group_size, "no rollout.n in a saved config")
        group_size = base.group_size
    fit.add("steps", cycles_done, f"trace: sync cycles ({TRAINED_SAMPLES} samples)", observations=1)

    # ---------------------------------------------------------------------------------------------- lengths
    lengths = dataclasses.replace(base.lengths)
    with_prompts = [c for c in cycles if c.prompt_tokens is not None and c.samples > 0]
    if with_prompts:
        prompt = fit.add(
            "lengths.prompt_tokens",
            max(0, round(sum(c.prompt_tokens or 0.0 for c in with_prompts) / sum(c.samples for c in with_prompts))),
            f"trace: {TRAINED_PROMPT_TOKENS} / {TRAINED_SAMPLES}",
            [(c.prompt_tokens or 0.0) / c.samples for c in with_prompts],
        )
    else:
        prompt = fit.default(
            "lengths.prompt_tokens", lengths.prompt_tokens, f"the trace has no {TRAINED_PROMPT_TOKENS} counter"
        )
    lengths.prompt_tokens = prompt
    means = [(i, c.tokens / c.samples) for i, c in enumerate(cycles) if c.samples > 0]
    points: list[tuple[float, float]] = []
    source = ""
    if len(means) >= 3:
        # a cycle trains what was admitted during it and the version before: half a version earlier on average
        points = [(i - 0.5, m) for i, m in means[1:]]
        source = (
            f"trace: {TRAINED_TOKENS} / {TRAINED_SAMPLES} per cycle (first left out; admitted half a version earlier), "
            "a line over the cycles"
        )
    elif metrics_rows:
        trigger = int(workload["trigger_parameter_sync_step"])
        for row in metrics_rows:
            if "train/response_length_mean" in row and "step" in row:
                points.append((float(int(row["step"]) // trigger), row["train/response_length_mean"]))
        source = "metrics.csv: train/response_length_mean per step, a line over the versions"
    elif means:
        points = [(float(i), m) for i, m in means]
        source = f"trace: {TRAINED_TOKENS} / {TRAINED_SAMPLES} per cycle"
    if "response_length" in rollout:
        lengths.max_tokens = fit.add(
            "lengths.max_tokens",
            int(rollout["response_length"]),
            f"{config_name}: rollout.response_length",
            observations=1,
        )
    else:
        fit.default("lengths.max_tokens", lengths.max_tokens)
    # a fitted model clips only where the run did: at one token and at the response limit
    lengths.min_tokens = fit.default("lengths.min_tokens", 1, "a response has at least one token")
    # the lengths' spread: the within-cycle variance from the squared lengths, pooled over the cycles
    with_sq = [c for c in cycles if c.tokens_sq is not None and c.samples > 1 and c.tokens > 0]
    spread_cv: float | None = None
    if with_sq:
        variance = sum(max(0.0, (c.tokens_sq or 0.0) - c.tokens**2 / c.samples) for c in with_sq)
        spread_cv = math.sqrt(variance / sum(c.samples for c in with_sq)) / (
            sum(c.tokens for c in with_sq) / sum(c.samples for c in with_sq)
        )
        per_cycle_cv = [
            math.sqrt(max(0.0, (c.tokens_sq or 0.0) / c.samples - (c.tokens / c.samples) ** 2)) / (c.tokens / c.samples)
            for c in with_sq
        ]
    if points:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        a, b = _line(xs, ys) if len(set(xs)) >= 2 else (statistics.fmean(ys), 0.0)
        a = max(a, 1.0)
        if len(set(xs)) >= 2:
            residuals = [y - (a + b * x) for x, y in points]
            drift = fit.add(
                "lengths.drift_per_step", b / a, source + " (slope / intercept)", [r / a for r in residuals]
            )
        else:
            drift = fit.default("lengths.drift_per_step", lengths.drift_per_step, "one version only")
        # the model's mean is before its clip: choose it (and sigma, when measured) so that the clipped log-normal
        # has the measured mean (and coefficient of variation)
        lo, hi = float(lengths.min_tokens), float(lengths.max_tokens)
        if spread_cv is not None:
            unclipped, sigma = _fit_lognormal(a, spread_cv * a, lo, hi)
            lengths.sigma = fit.add(
                "lengths.sigma",
                sigma,
                f"trace: {TRAINED_TOKENS_SQ}: the lengths' coefficient of variation within a cycle "
                f"({spread_cv:.3g}, pooled), as a log-normal clipped at [{lo:g}, {hi:g}]",
                per_cycle_cv,
            )
        else:
            unclipped = _fit_lognormal(a, None, lo, hi, sigma=lengths.sigma)[0]
            fit.default("lengths.sigma", lengths.sigma, f"the trace has no {TRAINED_TOKENS_SQ} counter: no spread")
        clip_note = "" if math.isclose(unclipped, a, rel_tol=1e-3) else f"; {unclipped:.4g} before the clip"
        lengths.mean_tokens = fit.add(
            "lengths.mean_tokens", unclipped, source + f" (intercept at version 0: {a:.4g}{clip_note})", ys
        )
        lengths.drift_per_step = max(drift, -1.0)
    else:
        fit.default("lengths.mean_tokens", lengths.mean_tokens, "no trained samples counted")
        fit.default("lengths.drift_per_step", lengths.drift_per_step)
        fit.default("lengths.sigma", lengths.sigma, "no trained samples counted")
    lengths.mean_schedule = []

    # ---------------------------------------------------------------------------------------------- trainer
    per_cycle_dspt = [
        c.train_s * T / (c.tokens + c.samples * prompt)
        for c in cycles
        if c.train_s > 0 and c.tokens + c.samples * prompt > 0
    ]
    work = sum(c.tokens + c.samples * prompt for c in cycles if c.train_s > 0)
    train_s = sum(c.train_s for c in cycles)
    per_sample = [c.train_s * T / c.samples for c in cycles if c.train_s > 0 and c.samples > 0]
    if per_sample:
        fit.add(
            "info.train_device_s_per_sample",
            train_s * T / sum(c.samples for c in cycles if c.train_s > 0),
            "trace: training spans x devices / trained_samples",
            per_sample,
        )
    if work > 0 and train_s > 0:
        dspt = fit.add(
            "trainer.device_s_per_token",
            train_s * T / work,
            f"trace: training spans x {T} device(s) / (trained_tokens + trained_samples x prompt_tokens {prompt})",
            per_cycle_dspt,
        )
    else:
        dspt = fit.default("trainer.device_s_per_token", base.trainer.device_s_per_token, "no training counted")
    steps_trained = sum(c.train_spans for c in cycles)
    if steps_trained:
        # the trainer's time outside its traced phases (Lightning's loop, logging, the cycle's bookkeeping): the
        # simulator has no such phase, so it is charged per micro fit-step, where it happens
        overhead = fit.add(
            "trainer.step_overhead_s",
            sum(c.untraced_s for c in cycles) / steps_trained,
            f"trace: the {TRAINER_TRACK} track's time outside its spans / training spans",
            [c.untraced_s / c.train_spans for c in cycles if c.train_spans > 0],
        )
    else:
        overhead = fit.default("trainer.step_overhead_s", base.trainer.step_overhead_s)
    trainer = TrainerModel(device_s_per_token=dspt, step_overhead_s=overhead)

    # ----------------------------------------------------------------------------------------- switch costs
    switch = _fit_switch(trace, spans, kinds, base.switch, fit, run_changes.get("staged_standalone_sync", False))

    for metric, label in (("dynamic_resource/offload_s", "offload_s"), ("dynamic_resource/onload_s", "onload_s")):
        _, values = trace.step_series(metric)
        if not values and metrics_rows:
            values = [r[metric] for r in metrics_rows if metric in r]
        values = [v for v in values if v > 0]
        if values:
            fit.add(f"info.{label}", statistics.fmean(values), f"{metric} per cycle (inside wake_s / sleep_s)", values)

    # ------------------------------------------------------------------------------------------- the scenario
    run: dict[str, Any] = {
        "name": name,
        "train_devices": T,
        "rollout_devices": S,
        "hybrid": hybrid,
        "async_training": {k: v for k, v in run_changes.items() if v is not None},
    }
    if group_size < 1 or int(workload["mini_batch_size"]) * int(workload.get("require_batches", 1)) % group_size:
        fit.notes.append(f"group_size {group_size} does not divide the samples per step: 1 used")
        group_size = 1
    data: dict[str, Any] = {
        "name": f"fitted_{name}",
        "description": f"fitted by lhr simulate --from-run from run {name}",
        "steps": max(1, cycles_done),
        "async_training": workload,
        "concurrent_samples_per_replica": cap,
        "group_size": group_size,
        "seed": base.seed,
        "lengths": dataclasses.asdict(lengths),
        "replica": dataclasses.asdict(standalone_model),
        "hybrid_replica": dataclasses.asdict(hybrid_model) if hybrid_model is not None else None,
        "trainer": dataclasses.asdict(trainer),
        "switch": dataclasses.asdict(switch),
        "runs": [run],
    }
    try:
        scenario = Scenario.from_dict(data)
    except ScenarioError as err:
        raise CalibrationError(f"the fitted scenario is not valid: {err}") from None
    missing = sorted({p.name for p in fit.params if not p.measured})
    if missing:
        fit.notes.append(f"not measured by this run (defaults kept): {', '.join(missing)}")
    hybrid_served = sum(c.decoded["hybrid"] for c in cycles) > 0
    return Calibration(scenario, fit.params, fit.notes, hybrid_served, hybrid_assumed if hybrid_model else None)


def _fit_switch(
    trace: TraceData,
    spans: list[Span],
    kinds: Mapping[str, list[dict[str, Any]]],
    base: SwitchCosts,
    fit: _Fit,
    staged: bool,
) -> SwitchCosts:
    """The switch costs from the trainer's spans (by op), or the runtime's activate/deactivate split by the hybrid
    replica's spans; see the module doc."""
    seen: dict[str, list[float]] = {f.name: [] for f in dataclasses.fields(SwitchCosts)}
    where: dict[str, str] = {}
    for s in spans:
        seconds = s.end_s - s.start_s
        if s.name == "weight_sync":
            key = "hybrid_sync_s" if s.args.get("target") == "hybrid" else "standalone_sync_s"
            seen[key].append(seconds)
            where[key] = f"trace: {TRAINER_TRACK} weight_sync spans (target {s.args.get('target', 'standalone')})"
        elif s.name == "switching" and s.args.get("op") in _OP_COSTS:
            key = _OP_COSTS[str(s.args["op"])]
            seen[key].append(seconds)
            where[key] = f"trace: {TRAINER_TRACK} switching spans (op {s.args['op']})"
    hybrid_tracks = [t for t, info in trace.tracks.items() if t.startswith("replica/") and info.get("kind") == "hybrid"]
    replica_spans = trace.spans_of(hybrid_tracks[0]) if hybrid_tracks else []
    for s in spans:
        if s.name != "switching" or s.args.get("op") not in ("activate", "deactivate"):
            continue
        inside = [r for r in replica_spans if s.start_s - 1e-6 <= r.start_s and r.end_s <= s.end_s + 1e-6]
        if s.args["op"] == "activate":
            sync = next((r for r in inside if r.name == "syncing"), None)
            if sync is None:
                continue
            seen["wake_s"].append(sync.start_s - s.start_s)
            seen["hybrid_sync_s"].append(sync.end_s - sync.start_s)
            half = (s.end_s - sync.end_s) / 2
            seen["add_s"].append(half)
            seen["resume_s"].append(half)
            split = "trace: activate spans split at the hybrid replica's syncing span"
            for key in ("wake_s", "hybrid_sync_s"):
                where[key] = split
            for key in ("add_s", "resume_s"):
                where[key] = split + " (after it, halved between add and resume)"
        else:
            sleep = next((r for r in inside if r.name == "switching"), None)
            if sleep is None:
                continue
            seen["sleep_s"].append(s.end_s - sleep.start_s)
            half = (sleep.start_s - s.start_s) / 2
            seen["remove_s"].append(half)
            seen["abort_s"].append(half)
            split = "trace: deactivate spans split at the hybrid replica's switching span"
            where["sleep_s"] = split
            for key in ("remove_s", "abort_s"):
                where[key] = split + " (before it, halved between remove and abort)"
    if staged:
        for t, info in trace.tracks.items():
            if t.startswith("replica/") and info.get("kind") == "standalone":
                commits = [r.end_s - r.start_s for r in trace.spans_of(t) if r.name == "syncing"]
                seen["standalone_commit_s"] += commits
                where["standalone_commit_s"] = "trace: the standalone replicas' syncing spans (staged sync's commit)"
    values = {}
    # what the run never did costs the default scaled by the one sync it did measure (the standalone weight sync):
    # the defaults' proportions, at this run's speed
    sync = seen["standalone_sync_s"]
    scale = statistics.fmean(sync) / base.standalone_sync_s if sync and base.standalone_sync_s > 0 else None
    for f in dataclasses.fields(SwitchCosts):
        obs = seen[f.name]
        if obs:
            values[f.name] = fit.add(f"switch.{f.name}", statistics.fmean(obs), where[f.name] + ", mean", obs)
        elif scale is not None and f.name != "resume_prefill_ratio":
            values[f.name] = fit.default(
                f"switch.{f.name}",
                getattr(base, f.name) * scale,
                f"{getattr(base, f.name):g} s x {scale:.4g}: the default scaled as the measured standalone_sync_s is",
            )
        else:
            values[f.name] = fit.default(f"switch.{f.name}", getattr(base, f.name))
    values["standalone_commit_s"] = (
        min(values["standalone_commit_s"], values["standalone_sync_s"]) if staged else values["standalone_commit_s"]
    )
    return SwitchCosts(**values)
