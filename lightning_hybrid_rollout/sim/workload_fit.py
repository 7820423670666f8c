"""The workload and the run's options fitted to a run (:mod:`~lightning_hybrid_rollout.sim.calibrate`'s
``async_training.*``, ``runs[0].async_training.*``, ``group_size``).

The saved config's ``async_training`` and ``rollout`` sections, read back exactly (:func:`parse_async_training`);
without one, the trace: samples per training span, training spans per cycle (:func:`fit_workload`), the simulator's
run metadata (:func:`fit_run_options`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_hybrid_rollout.config import AsyncTrainingConfig, ConfigError
from lightning_hybrid_rollout.errors import CalibrationError
from lightning_hybrid_rollout.sim.calibration import FitLog
from lightning_hybrid_rollout.sim.renames import SEQUENCING_RENAMES
from lightning_hybrid_rollout.sim.run_reading import Cycle
from lightning_hybrid_rollout.sim.scenario import RUN_KEYS, Scenario

__all__ = ["WORKLOAD_KEYS", "fit_group_size", "fit_run_options", "fit_workload", "parse_async_training"]

#: The workload keys of ``async_training`` a scenario holds once (the rest are a run's own, ``RUN_KEYS``).
WORKLOAD_KEYS: tuple[str, ...] = (
    "mini_batch_size",
    "require_batches",
    "trigger_parameter_sync_step",
    "staleness_threshold",
)


def parse_async_training(section: Mapping[str, Any], config_name: str) -> AsyncTrainingConfig | None:
    """The saved config's ``async_training`` section (None when empty).

    Raises:
        CalibrationError: The section is not valid.
    """
    try:
        return AsyncTrainingConfig.from_dict(section) if section else None
    except ConfigError as err:
        raise CalibrationError(f"{config_name}: {err}") from None


def fit_workload(
    cycles: Sequence[Cycle],
    config_at: AsyncTrainingConfig | None,
    base: Scenario,
    config_name: str,
    fit: FitLog,
) -> dict[str, Any]:
    """The ``async_training`` workload: the saved config's, else samples per training span and spans per cycle."""
    per_step = [c.samples / c.train_spans for c in cycles if c.train_spans > 0 and c.samples > 0]
    if config_at is None:
        return _workload_from_trace(cycles, per_step, base, fit)
    workload: dict[str, Any] = {}
    for key in WORKLOAD_KEYS:
        workload[key] = fit.add(
            f"async_training.{key}", getattr(config_at, key), f"{config_name}: async_training.{key}", observations=1
        )
    measured_required = statistics.median(per_step) if per_step else None
    if measured_required is not None and not math.isclose(measured_required, config_at.required_samples, rel_tol=1e-6):
        fit.notes.append(
            f"the trace's samples per training step ({measured_required:g}) differ from the config's "
            f"required_samples "
            f"({config_at.required_samples}): is {config_name} this run's?"
        )
    return workload


def _workload_from_trace(cycles: Sequence[Cycle], per_step: list[float], base: Scenario, fit: FitLog) -> dict[str, Any]:
    """Without a saved config: training spans per cycle and samples per training span (medians)."""
    steps_per_cycle = [c.train_spans for c in cycles if c.train_spans > 0]
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
    return {
        "mini_batch_size": required,
        "trigger_parameter_sync_step": trigger,
        "staleness_threshold": staleness,
    }


def fit_run_options(
    config_at: AsyncTrainingConfig | None, meta: Mapping[str, Any], config_name: str, fit: FitLog
) -> dict[str, Any]:
    """The run's own ``async_training`` (policy and options): the saved config's, else the simulator's metadata."""
    run_changes: dict[str, Any] = {}
    if config_at is not None:
        for key in RUN_KEYS:
            value = getattr(config_at, key)
            run_changes[key] = fit.add(
                f"runs[0].async_training.{key}", value, f"{config_name}: async_training.{key}", observations=1
            )
    elif meta.get("source") == "simulator":
        sequencing = meta.get("sequencing")
        if isinstance(sequencing, str):  # a trace written before the rename says "seed" for "sequential"
            sequencing = SEQUENCING_RENAMES.get(sequencing, sequencing)
        from_meta = {
            "dynamic_schedule_policy": meta.get("policy"),
            "dynamic_schedule_enable_rebalance": meta.get("enable_rebalance"),
            "overlap_sync": sequencing == "overlap_sync" if "sequencing" in meta else None,
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
    return run_changes


def fit_group_size(rollout: Mapping[str, Any], base: Scenario, config_name: str, fit: FitLog) -> int:
    """Samples per prompt: the saved config's ``rollout.n``."""
    if "n" in rollout:
        return fit.add(
            "group_size", int(rollout["n"]), f"{config_name}: rollout.n (samples per prompt)", observations=1
        )
    fit.default("group_size", base.group_size, "no rollout.n in a saved config")
    return base.group_size
