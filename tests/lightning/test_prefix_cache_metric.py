"""``rollout/prefix_cache_hit_rate``: the cycle's cached prompt tokens over its prompt tokens, logged once per cycle."""

from __future__ import annotations

from types import SimpleNamespace

from lightning_hybrid_rollout.lightning.cycle_report import PREFIX_CACHE_HIT_RATE
from lightning_hybrid_rollout.rollout.role_window import RoleWindow
from lightning_hybrid_rollout.run.runtime import RuntimeQueries
from tests.lightning._cycle_report_harness import cycle_report, recording_trainer


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
    trainer = recording_trainer(logged)
    report = cycle_report(runtime)
    for cycle in (1, 2):
        runtime.take_role_window()  # the callback takes the cycle's window at its sync decision
        report.emit(trainer, None, cycle, 0, 0)  # type: ignore[arg-type]
    assert [v[PREFIX_CACHE_HIT_RATE] for v in logged] == [0.75, 0.0]
    assert runtime.traced[0][PREFIX_CACHE_HIT_RATE] == 0.75
