"""``rollout/prefix_cache_hit_rate``: the cycle's cached prompt tokens over its prompt tokens, logged once per cycle."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lightning_hybrid_rollout import metrics as M
from lightning_hybrid_rollout.lightning.cycle_report import PREFIX_CACHE_HIT_RATE, CycleReport
from lightning_hybrid_rollout.lightning.runtime import RuntimeQueries
from lightning_hybrid_rollout.rollout.role_window import RoleWindow


class _Runtime(RuntimeQueries):
    def __init__(self, windows: list[RoleWindow]) -> None:
        self.rollouter = SimpleNamespace(take_role_window=lambda: windows.pop(0))
        self.traced: list[dict[str, float]] = []

    def trace_cycle(self, cycle: int, t: float, values: dict[str, float]) -> None:
        self.traced.append(values)


def test_each_cycle_logs_the_hit_rate_of_the_window_it_took() -> None:
    windows = [
        RoleWindow({}, {}, 0.0, 1.0, prompt_tokens=400, cached_prompt_tokens=300),
        RoleWindow({}, {}, 1.0, 2.0),  # nothing came back
    ]
    runtime = _Runtime(windows)
    logged: list[dict[str, float]] = []
    trainer: Any = SimpleNamespace(
        loggers=[SimpleNamespace(log_metrics=lambda values, step: logged.append(dict(values)))],
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
        callback_metrics={},
    )
    closed = {M.MQ_SIZE: 0.0, M.HYBRID_ACTIVE: 0.0, M.RESOURCE_UTILIZATION: 0.0}
    report = CycleReport(
        ledger=SimpleNamespace(close=lambda end: dict(closed)),  # type: ignore[arg-type]
        runtime=runtime,
        controller=None,
        policy=SimpleNamespace(deactivate_ratio=0.3),  # type: ignore[arg-type]
        workload=None,
        clock=lambda: 0.0,
        summary_every_n_cycles=0,
        has_hybrid=False,
    )
    for cycle in (1, 2):
        runtime.take_role_window()  # the callback takes the cycle's window at its sync decision
        report.emit(trainer, None, cycle, 0, 0)  # type: ignore[arg-type]
    assert [v[PREFIX_CACHE_HIT_RATE] for v in logged] == [0.75, 0.0]
    assert runtime.traced[0][PREFIX_CACHE_HIT_RATE] == 0.75
