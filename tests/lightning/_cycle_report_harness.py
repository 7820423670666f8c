"""A :class:`CycleReport` on a minimal trainer that records what it logs (for the per-cycle metric tests)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lightning_hybrid_rollout import metrics as M
from lightning_hybrid_rollout.lightning.cycle_report import CycleReport


def recording_trainer(logged: list[dict[str, float]]) -> Any:
    """A trainer stand-in whose one logger appends every ``log_metrics`` call's values to ``logged``."""
    return SimpleNamespace(
        loggers=[SimpleNamespace(log_metrics=lambda values, step: logged.append(dict(values)))],
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
        callback_metrics={},
    )


def cycle_report(runtime: Any) -> CycleReport:
    """A report on ``runtime`` with a ledger that closes empty cycles, no controller and no hybrid replica."""
    closed = {M.MQ_SIZE: 0.0, M.HYBRID_ACTIVE: 0.0, M.RESOURCE_UTILIZATION: 0.0}
    return CycleReport(
        ledger=SimpleNamespace(close=lambda end: dict(closed)),  # type: ignore[arg-type]
        runtime=runtime,
        controller=None,
        policy=SimpleNamespace(deactivate_ratio=0.3),  # type: ignore[arg-type]
        workload=None,
        clock=lambda: 0.0,
        summary_every_n_cycles=0,
        has_hybrid=False,
    )
