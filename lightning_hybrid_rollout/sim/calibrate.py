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
  (each replica's throughput at its concurrency); ``tokens_per_s`` is that throughput divided by
  ``X(cap) / tokens_per_s = cap / (1 + batch_slowdown·(cap − 1))`` (the model's throughput at its cap: the rate is
  measured while serving, where replicas run full), with ``batch_slowdown`` not measured;
* the trainer: ``training`` spans × devices over the trained tokens (``trained_tokens`` + ``trained_samples`` ×
  ``prompt_tokens``) per cycle;
* lengths: the mean trained response length per cycle (``trained_tokens`` / ``trained_samples``), a line over the
  cycles (``mean_tokens``, ``drift_per_step``; the first cycle, biased to the responses that finish first, is left
  out when there are three or more), or the per-step ``train/response_length_mean`` of ``metrics.csv`` when the
  trace has fewer than three cycles;
* switch costs: the trainer's ``weight_sync`` spans (``standalone_sync_s``; ``hybrid_sync_s`` when it has its own),
  its ``switching`` spans by ``args.op`` (the simulator's one per pool method), or, for the runtime's one
  ``activate`` / ``deactivate`` span, split by the hybrid replica's own spans inside it (wake until its ``syncing``
  span, the hybrid sync, ``add`` + ``resume`` after; remove + abort until its ``switching`` span, sleep after);
  ``standalone_commit_s``: the standalone replicas' ``syncing`` spans of a staged sync;
* the workload and the run's options: the saved config's ``async_training`` and ``rollout`` sections (found
  anywhere in ``config.yaml``, e.g. in the Lightning CLI's layout), else the trace (samples per training span,
  training spans per cycle, the simulator's run metadata).

Values are the totals' ratios (token-weighted), spreads the interquartile range of the per-cycle values.

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
    Scenario,
    ScenarioError,
    SwitchCosts,
    TrainerModel,
)
from lightning_hybrid_rollout.trace import (
    DECODED_TOKENS,
    IN_FLIGHT,
    SERVING_S,
    TRAINED_SAMPLES,
    TRAINED_TOKENS,
    TRAINER_TRACK,
    Span,
    TraceData,
    load_trace,
)

__all__ = ["Calibration", "CalibrationError", "FittedParameter", "calibrate", "calibrate_run", "find_config"]

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
) -> Calibration:
    """:func:`calibrate` the run in ``run_dir`` (``trace.json``, ``metrics.csv`` if there, ``config.yaml`` if there).

    Args:
        run_dir: The run's folder.
        config: The run's saved config (a YAML file or its loaded mapping) when it is not ``RUN_DIR/config.yaml``.
        defaults: A scenario whose numbers stand in for what the run did not measure (default: the classes').
        require_metrics: Refuse a folder without ``metrics.csv``.

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
    fit = calibrate(trace, rows, doc, name=name, defaults=defaults, config_name=config_name)
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


def _totals_at(trace: TraceData) -> tuple[list[float], dict[str, list[float]]]:
    """Cycle-end times (the ``trained_samples`` samples) and each running total's value at each."""
    ends = [c.t for c in trace.counter_series(TRAINED_SAMPLES)]
    names = {c.name for c in trace.counters}
    names = {
        n
        for n in names
        if n in (TRAINED_SAMPLES, TRAINED_TOKENS) or n.startswith((f"{DECODED_TOKENS}.", f"{SERVING_S}."))
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
        for s in spans:
            if s.name == "training" and start - 1e-9 <= s.end_s <= t + 1e-9:
                c.train_s += s.end_s - s.start_s
                c.train_spans += 1
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


def _occupancy(trace: TraceData, kind: str, cap: int, beta: float) -> tuple[float, float] | None:
    """``(∫ Σ g(m) dt, mean m)`` over the ``active`` spans of ``kind``'s replicas, ``g(m) = m / (1 + β(m − 1))`` (the
    model's throughput over ``tokens_per_s``) and ``m = min(cap, in_flight / active replicas)``; None without an
    ``in_flight`` counter."""
    series = trace.counter_series(IN_FLIGHT)
    if not series:
        return None
    active: list[tuple[str, float, float]] = []
    for track, info in trace.tracks.items():
        if track.startswith("replica/") and info.get("kind") in ("standalone", "hybrid"):
            active += [(str(info["kind"]), s.start_s, s.end_s) for s in trace.spans_of(track) if s.name == "active"]
    points = sorted({c.t for c in series} | {t for _, a, b in active for t in (a, b)})
    total = weighted = occupancy = 0.0
    j, value = 0, 0.0
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
    if total <= 0:
        return None
    return weighted, occupancy / total


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

    Raises:
        CalibrationError: The trace has no trainer span, no cycle totals (``trained_samples``, ...) or no replica
            track, or the config's sections are not valid.
    """
    fit = _Fit()
    base = defaults or Scenario(name="defaults")
    spans = trace.spans_of(TRAINER_TRACK)
    if not any(s.name == "training" for s in spans):
        raise CalibrationError(f"the trace has no {TRAINER_TRACK} training span: nothing to fit the trainer to")
    cycles = _cycles(trace, spans)
    if not cycles:
        raise CalibrationError(
            f"the trace has no {TRAINED_SAMPLES} counter: it predates the runtime's per-cycle totals "
            "(lightning_hybrid_rollout.trace), so the rates cannot be fitted"
        )
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
            occupied = _occupancy(trace, kind, cap, beta)
            if occupied is not None and occupied[0] > 0:
                weighted_s, mean_m = occupied
                fit.add(
                    f"info.{kind}_mean_concurrency",
                    mean_m,
                    f"trace: {IN_FLIGHT} / active replicas, at most cap {cap}",
                    observations=1,
                )
                v = fit.add(
                    f"{section}.tokens_per_s",
                    tokens / weighted_s,
                    f"trace: {DECODED_TOKENS}.{kind} / the active replicas' seconds x m/(1+b(m-1)), m from {IN_FLIGHT} "
                    f"(batch_slowdown {beta:g})",
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
    prompt = fit.default("lengths.prompt_tokens", lengths.prompt_tokens, "the trace counts response tokens only")
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
    if points:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        a, b = _line(xs, ys) if len(set(xs)) >= 2 else (statistics.fmean(ys), 0.0)
        a = max(a, 1.0)
        fit.add("lengths.mean_tokens", a, source + " (intercept at version 0)", ys)
        if len(set(xs)) >= 2:
            residuals = [y - (a + b * x) for x, y in points]
            fit.add("lengths.drift_per_step", b / a, source + " (slope / intercept)", [r / a for r in residuals])
            drift = b / a
        else:
            drift = fit.default("lengths.drift_per_step", lengths.drift_per_step, "one version only")
        lengths.mean_tokens, lengths.drift_per_step = a, max(drift, -1.0)
    else:
        fit.default("lengths.mean_tokens", lengths.mean_tokens, "no trained samples counted")
        fit.default("lengths.drift_per_step", lengths.drift_per_step)
    fit.default("lengths.sigma", lengths.sigma, "the trace has per-cycle means only, no spread of lengths")
    if "response_length" in rollout:
        lengths.max_tokens = fit.add(
            "lengths.max_tokens",
            int(rollout["response_length"]),
            f"{config_name}: rollout.response_length",
            observations=1,
        )
    else:
        fit.default("lengths.max_tokens", lengths.max_tokens)
    lengths.min_tokens = min(lengths.min_tokens, lengths.max_tokens)
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
    return Calibration(scenario, fit.params, fit.notes)


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
    for f in dataclasses.fields(SwitchCosts):
        obs = seen[f.name]
        if obs:
            values[f.name] = fit.add(f"switch.{f.name}", statistics.fmean(obs), where[f.name] + ", mean", obs)
        else:
            values[f.name] = fit.default(f"switch.{f.name}", getattr(base, f.name))
    values["standalone_commit_s"] = (
        min(values["standalone_commit_s"], values["standalone_sync_s"]) if staged else values["standalone_commit_s"]
    )
    return SwitchCosts(**values)
