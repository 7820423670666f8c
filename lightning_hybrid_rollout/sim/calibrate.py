"""A scenario fitted to a real run (``lhr simulate --from-run RUN_DIR``): :func:`calibrate` returns a
:class:`Calibration` of :class:`FittedParameter` values with their spread and source; what is read from where is in
docs/simulator.md, "Calibrating from a real run".

Example::

    from lightning_hybrid_rollout.sim.calibrate import calibrate_run

    fit = calibrate_run("tests/data/cpu_miniature_default_8_steps")
    print("\n".join(fit.lines()))
    fit.write_yaml("fitted.yaml")  # edit, then: lhr simulate fitted.yaml
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.errors import CalibrationError as CalibrationError  # re-exported
from lightning_hybrid_rollout.sim.calibration import (
    HYBRID_SPEED_RATIO,
    STANDALONE_SPEED_WITH_HYBRID,
    Calibration,
    FitLog,
    FittedParameter,
    HostPreset,
    get_host_preset,
)
from lightning_hybrid_rollout.sim.length_fit import clipped_moments, fit_lengths, fit_lognormal
from lightning_hybrid_rollout.sim.rate_fit import DecodeRates, fit_decode_rates
from lightning_hybrid_rollout.sim.run_reading import (
    Cycle,
    config_sections,
    device_count,
    find_config,
    read_metrics,
    trace_cycles,
)
from lightning_hybrid_rollout.sim.scenario import LengthModel, Scenario, ScenarioError, SwitchCosts, TrainerModel
from lightning_hybrid_rollout.sim.switch_fit import fit_offload_info, fit_switch
from lightning_hybrid_rollout.sim.workload_fit import (
    fit_group_size,
    fit_run_options,
    fit_workload,
    parse_async_training,
)
from lightning_hybrid_rollout.trace import TRAINED_SAMPLES, TRAINER_TRACK, TraceData, load_trace

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

# the length fit's helpers under the names they had here (tests import them)
_clipped_moments = clipped_moments
_fit_lognormal = fit_lognormal

# ------------------------------------------------------------------------------------------------------ inputs


def calibrate_run(
    run_dir: str | os.PathLike[str],
    *,
    config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    defaults: Scenario | None = None,
    require_metrics: bool = False,
    hybrid_speed_ratio: float | None = None,
    host: HostPreset | str | None = None,
) -> Calibration:
    """:func:`calibrate` the run in ``run_dir`` (``trace.json``, ``metrics.csv`` if there, ``config.yaml`` if there).

    Args:
        run_dir: The run's folder.
        config: The run's saved config (a YAML file or its loaded mapping) when it is not ``RUN_DIR/config.yaml``.
        defaults: A scenario whose numbers stand in for what the run did not measure (default: the classes').
        require_metrics: Refuse a folder without ``metrics.csv``.
        hybrid_speed_ratio: ``ρ`` assumed when the hybrid replicas never served (:func:`calibrate`).
        host: The host the run ran on (:func:`calibrate`).

    Raises:
        CalibrationError: No such folder, no ``trace.json`` (or ``metrics.csv`` when required), an unreadable trace
            or config, or a trace without what every fit needs.
    """
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
    rows = read_metrics(metrics_path) if metrics_path.is_file() else None
    doc, config_name = _load_config(path, config)
    name = str(trace.metadata.get("run") or path.name)
    fit = calibrate(
        trace,
        rows,
        doc,
        name=name,
        defaults=defaults,
        config_name=config_name,
        hybrid_speed_ratio=hybrid_speed_ratio,
        host=host,
    )
    if rows is None:
        fit.notes.append(f"no metrics.csv in {path}: lengths come from the trace's counters only")
    return fit


def _load_config(path: Path, config: str | os.PathLike[str] | Mapping[str, Any] | None) -> tuple[Any, str]:
    """The run's config document (``config``, else the one saved in ``path``; None without one) and its name."""
    import yaml

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
    return doc, config_name


# ------------------------------------------------------------------------------------------------------ the fit


def calibrate(
    trace: TraceData,
    metrics_rows: Sequence[Mapping[str, float]] | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    name: str = "run",
    defaults: Scenario | None = None,
    config_name: str = "config",
    hybrid_speed_ratio: float | None = None,
    host: HostPreset | str | None = None,
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
            standalone replicas' (default: the host's, else :data:`HYBRID_SPEED_RATIO`); ignored when the run
            measured it.
        host: The host the run ran on: a :class:`~lightning_hybrid_rollout.sim.calibration.HostPreset` or its name
            (``"shared_2vcpu"``), whose figures stand in for ``hybrid_speed_ratio`` and the conversion factor of
            :meth:`Calibration.scenario_for` where none is given (None: 1.0 each, no slowdown assumed).

    Raises:
        CalibrationError: The trace has no trainer span, no cycle totals (``trained_samples``, ...) or no replica
            track, or the config's sections are not valid.
    """
    fit = FitLog()
    base = defaults or Scenario(name="defaults")
    host = get_host_preset(host) if isinstance(host, str) else host
    if hybrid_speed_ratio is None:
        hybrid_speed_ratio = HYBRID_SPEED_RATIO if host is None else host.hybrid_speed_ratio
    hybrid_speed_ratio = float(hybrid_speed_ratio)
    if not hybrid_speed_ratio > 0:
        raise CalibrationError(f"hybrid_speed_ratio must be > 0, got {hybrid_speed_ratio}")
    spans = trace.spans_of(TRAINER_TRACK)
    if not any(s.name == "training" for s in spans):
        raise CalibrationError(f"the trace has no {TRAINER_TRACK} training span: nothing to fit the trainer to")
    cycles = trace_cycles(trace, spans)
    if not cycles:
        raise CalibrationError(
            f"the trace has no {TRAINED_SAMPLES} counter: it predates the runtime's per-cycle totals "
            "(lightning_hybrid_rollout.trace), so the rates cannot be fitted"
        )
    # the running totals count from the trainer's first span (training began) to the last cycle's end
    window = (min(s.start_s for s in spans), cycles[-1].end)
    sections: dict[str, Mapping[str, Any]] = {}
    if config is not None:
        config_sections(config, sections)
        if not sections:
            fit.notes.append(f"{config_name} has no async_training or rollout section: settings not read back")
    rollout = dict(sections.get("rollout") or {})
    split = _fit_split(trace, rollout, base, config_name, fit)
    rates = fit_decode_rates(
        trace, cycles, split.kinds, split.cap, base.replica, base.hybrid_model, window, hybrid_speed_ratio, fit
    )
    config_at = parse_async_training(dict(sections.get("async_training") or {}), config_name)
    workload = fit_workload(cycles, config_at, base, config_name, fit)
    run_changes = fit_run_options(config_at, trace.metadata, config_name, fit)
    group_size = fit_group_size(rollout, base, config_name, fit)
    fit.add("steps", len(cycles), f"trace: sync cycles ({TRAINED_SAMPLES} samples)", observations=1)
    lengths = fit_lengths(cycles, metrics_rows, workload, rollout, base.lengths, config_name, fit)
    trainer = _fit_trainer(cycles, split.train_devices, lengths.prompt_tokens, base.trainer, fit)
    switch = fit_switch(trace, spans, base.switch, fit, run_changes.get("staged_standalone_sync", False))
    fit_offload_info(trace, metrics_rows, fit)
    parts = _Parts(split, rates, workload, run_changes, group_size, lengths, trainer, switch)
    scenario = _scenario(name, base, cycles, parts, fit)
    missing = sorted({p.name for p in fit.params if not p.measured})
    if missing:
        fit.notes.append(f"not measured by this run (defaults kept): {', '.join(missing)}")
    hybrid_served = sum(c.decoded["hybrid"] for c in cycles) > 0
    hybrid_ratio = rates.hybrid_assumed if rates.hybrid else None
    return Calibration(scenario, fit.params, fit.notes, hybrid_served, hybrid_ratio, host=host)


# ------------------------------------------------------------------------------ split, replicas, devices


@dataclass(frozen=True)
class _Split:
    """The run's devices as its trace describes them."""

    kinds: dict[str, list[dict[str, Any]]]  # the replica tracks' descriptions by kind ("standalone", "hybrid")
    train_devices: int
    rollout_devices: int
    cap: int  # concurrent_samples_per_replica


def _fit_split(trace: TraceData, rollout: Mapping[str, Any], base: Scenario, config_name: str, fit: FitLog) -> _Split:
    """The split (the trainer's and the replica tracks' devices) and the replicas' concurrency cap."""
    kinds: dict[str, list[dict[str, Any]]] = {"standalone": [], "hybrid": []}
    for track, info in sorted(trace.tracks.items()):
        if track.startswith("replica/") and info.get("kind") in kinds:
            kinds[str(info["kind"])].append(info)
    if not kinds["standalone"] and not kinds["hybrid"]:
        raise CalibrationError("the trace describes no replica track (replica/<kind>_<i> with kind and devices)")
    trainer_devices = device_count(trace.tracks.get(TRAINER_TRACK, {}).get("devices"))
    hybrid_devices = sum(device_count(i.get("devices")) for i in kinds["hybrid"])
    T = trainer_devices or hybrid_devices
    if not T:
        raise CalibrationError(f"the trace describes neither the {TRAINER_TRACK} track's devices nor hybrid replicas'")
    S = sum(device_count(i.get("devices")) for i in kinds["standalone"])
    fit.add("runs[0].train_devices", T, "trace: the trainer track's devices", observations=1)
    fit.add("runs[0].rollout_devices", S, "trace: the standalone replica tracks' devices", observations=1)
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
    return _Split(kinds, T, S, cap)


# ---------------------------------------------------------------------------------------------- trainer


def _fit_trainer(cycles: Sequence[Cycle], T: int, prompt: Any, base: TrainerModel, fit: FitLog) -> TrainerModel:
    """The trainer's cost per trained token (prompt included) and its time outside its spans per training span."""
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
        dspt = fit.default("trainer.device_s_per_token", base.device_s_per_token, "no training counted")
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
        overhead = fit.default("trainer.step_overhead_s", base.step_overhead_s)
    return TrainerModel(device_s_per_token=dspt, step_overhead_s=overhead)


# ------------------------------------------------------------------------------------------- the scenario


@dataclass(frozen=True)
class _Parts:
    """The fitted sections the scenario is put together from."""

    split: _Split
    rates: DecodeRates
    workload: dict[str, Any]
    run_changes: dict[str, Any]
    group_size: int
    lengths: LengthModel
    trainer: TrainerModel
    switch: SwitchCosts


def _scenario(name: str, base: Scenario, cycles: Sequence[Cycle], parts: _Parts, fit: FitLog) -> Scenario:
    """The fitted scenario: one run, the measured run's split and options."""
    split, workload, group_size = parts.split, parts.workload, parts.group_size
    run: dict[str, Any] = {
        "name": name,
        "train_devices": split.train_devices,
        "rollout_devices": split.rollout_devices,
        "hybrid": bool(split.kinds["hybrid"]),
        "async_training": {k: v for k, v in parts.run_changes.items() if v is not None},
    }
    if group_size < 1 or int(workload["mini_batch_size"]) * int(workload.get("require_batches", 1)) % group_size:
        fit.notes.append(f"group_size {group_size} does not divide the samples per step: 1 used")
        group_size = 1
    hybrid_model = parts.rates.hybrid
    data: dict[str, Any] = {
        "name": f"fitted_{name}",
        "description": f"fitted by lhr simulate --from-run from run {name}",
        "steps": max(1, len(cycles)),
        "async_training": workload,
        "concurrent_samples_per_replica": split.cap,
        "group_size": group_size,
        "seed": base.seed,
        "lengths": dataclasses.asdict(parts.lengths),
        "replica": dataclasses.asdict(parts.rates.standalone),
        "hybrid_replica": dataclasses.asdict(hybrid_model) if hybrid_model is not None else None,
        "trainer": dataclasses.asdict(parts.trainer),
        "switch": dataclasses.asdict(parts.switch),
        "runs": [run],
    }
    try:
        return Scenario.from_dict(data)
    except ScenarioError as err:
        raise CalibrationError(f"the fitted scenario is not valid: {err}") from None
