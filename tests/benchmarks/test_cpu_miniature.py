"""``benchmarks/cpu_miniature.py``'s pure parts: the run order, the static side each dynamic run is measured against,
and the report's last lines (its real runs are exercised by ``planner_fidelity`` and the docs; its per-run bound by
``tests/test_run_bound.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.benchmarks import load_benchmark


def test_the_bracket_order_puts_every_round_between_two_static_runs():
    order = load_benchmark("cpu_miniature").run_order(["static_fully_async", "default", "rate_matched"], 2, "bracket")
    assert order == [
        ("static_fully_async", 1),
        ("default", 1),
        ("rate_matched", 1),
        ("static_fully_async", 2),
        ("default", 2),
        ("rate_matched", 2),
        ("static_fully_async", 3),
    ]


def test_the_alternate_order_reverses_every_second_round():
    order = load_benchmark("cpu_miniature").run_order(["static_fully_async", "rate_matched"], 3, "alternate")
    assert order == [
        ("static_fully_async", 1),
        ("rate_matched", 1),
        ("rate_matched", 2),
        ("static_fully_async", 2),
        ("static_fully_async", 3),
        ("rate_matched", 3),
    ]
    with pytest.raises(ValueError, match="order must be one of"):
        load_benchmark("cpu_miniature").run_order(["static_fully_async", "rate_matched"], 1, "random")


def test_a_bracketed_dynamic_run_is_measured_against_the_mean_of_the_static_runs_around_it():
    cm = load_benchmark("cpu_miniature")
    # a machine slowing down linearly: static 40, 50, 60 s around dynamic runs that each took 1/1.25 of their time
    assert cm.static_reference([40.0, 50.0, 60.0], 2) == [45.0, 55.0]
    assert cm.static_reference([40.0, 50.0], 2) == [40.0, 50.0]  # alternate: its own pair
    with pytest.raises(ValueError, match="3 static runs for 1 dynamic"):
        cm.static_reference([40.0, 50.0, 60.0], 1)


def _result(wall: float, efficiency: float | None, probe_ms: float | None = None) -> dict[str, Any]:
    """One run's summary as ``_report`` reads it (``probe_ms``: the machine-speed probe's mean unit, if any)."""
    return {
        "train_wall_s": wall,
        "reward_tail": [0.7, 0.72],
        "reward_final": 0.71,
        "wait_share": 0.5,
        "activations": 4,
        "cycles": 4,
        "efficiency": efficiency,
        "probe_ms_mean": probe_ms,
    }


def test_the_cpu_miniature_ends_with_the_best_efficiency_then_the_speedup(capsys):
    bench = load_benchmark("cpu_miniature")
    assert bench.DEFAULT_POLICIES == ("static_fully_async", "default", "rate_matched", "hysteresis_ratio")
    args = SimpleNamespace(deactivate_ratio=0.3, hysteresis_start_ratio=0.4)
    assert [bench._start_ratio(p, args) for p in bench.DEFAULT_POLICIES[1:]] == [0.3, 0.3, 0.4]
    policies = list(bench.DEFAULT_POLICIES)
    results = {
        "static_fully_async": [_result(60.0, 0.81)],
        "default": [_result(50.0, 0.93)],
        "rate_matched": [_result(49.0, None)],  # a trace without the terms
        "hysteresis_ratio": [_result(52.0, 0.9)],
    }
    bench._report(policies, results, "default")
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == ["best efficiency: 0.93 (default)", "speedup: 1.20"]


def test_the_report_prints_the_bracketed_speedups_last(capsys):
    cm = load_benchmark("cpu_miniature")
    static = [_result(40.0, 0.9, 1.0), _result(50.0, 0.9, 1.25), _result(60.0, 0.9, 1.5)]
    # each dynamic run exactly 1.25x faster than the machine's speed at its time (a linear slowdown)
    dynamic = [_result(36.0, 0.9, 1.125), _result(44.0, 0.9, 1.375)]
    cm._report(
        ["static_fully_async", "rate_matched"], {"static_fully_async": static, "rate_matched": dynamic}, "rate_matched"
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "speedup: 1.25"
    assert any("per repeat: 1.25, 1.25" in line for line in lines)
    equal = next(line for line in lines if "at equal machine speed" in line)
    assert "1.25 (per repeat: 1.25, 1.25; probe dynamic / static: 1.00, 1.00)" in equal
