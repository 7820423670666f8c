"""``benchmarks/cpu_miniature.py``'s run order and the static side each dynamic run is measured against (its real
runs are exercised by ``planner_fidelity`` and the docs; these are the pure parts)."""

from __future__ import annotations

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


def test_the_report_prints_the_bracketed_speedups_last(capsys):
    cm = load_benchmark("cpu_miniature")

    def run(wall: float, probe: float) -> dict[str, Any]:
        return {
            "train_wall_s": wall,
            "reward_tail": [0.7, 0.8],
            "reward_final": 0.75,
            "wait_share": 0.5,
            "activations": 4,
            "cycles": 16,
            "probe_ms_mean": probe,
            "efficiency": 0.9,
        }

    static = [run(40.0, 1.0), run(50.0, 1.25), run(60.0, 1.5)]
    dynamic = [run(36.0, 1.125), run(44.0, 1.375)]  # exactly 1.25x faster than the machine at their time
    cm._report(
        ["static_fully_async", "rate_matched"], {"static_fully_async": static, "rate_matched": dynamic}, "rate_matched"
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "speedup: 1.25"
    assert any("per repeat: 1.25, 1.25" in line for line in lines)
    equal = next(line for line in lines if "at equal machine speed" in line)
    assert "1.25 (per repeat: 1.25, 1.25; probe dynamic / static: 1.00, 1.00)" in equal
