"""``benchmarks/cpu_miniature.py``'s pure parts: the run order, the static side each dynamic run is measured against,
and the report's last lines (its real runs are exercised by ``planner_fidelity`` and the docs; its per-run bound by
``tests/test_run_bound.py``); and, with a real worker, that terminating the benchmark takes the worker down."""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import pytest

from tests.benchmarks import load_benchmark


def _fake_main(monkeypatch: pytest.MonkeyPatch, slow: Collection[str] = ()) -> tuple[Any, list[str]]:
    """cpu_miniature with its runs faked: static walls 50 s, dynamic 40 s, probe 1.0; a run in ``slow`` 1.3x on both
    (the machine 30% slower while it ran). Returns the module and the run tags in the order they ran."""
    cm = load_benchmark("cpu_miniature")
    ran: list[str] = []

    def fake_run(pol: str, tag: str, *args: Any) -> tuple[dict[str, Any], float]:
        ran.append(tag)
        factor = 1.3 if tag in slow else 1.0
        wall = 50.0 if pol == "static_fully_async" else 40.0
        return _result(wall * factor, 0.9, probe_ms=factor), 1.0

    monkeypatch.setattr(cm, "_build_model", lambda *a: 0.0)
    monkeypatch.setattr(cm, "_run_one", fake_run)
    monkeypatch.setattr(cm, "_line", lambda tag, s, t: tag)
    return cm, ran


def test_the_bracket_order_puts_every_round_between_two_static_runs(monkeypatch, capsys):
    cm, ran = _fake_main(monkeypatch)
    cm.main(["--policies", "static_fully_async,default,rate_matched", "--repeats", "2"])
    assert ran == [
        "static_fully_async_r1",
        "default_r1",
        "rate_matched_r1",
        "static_fully_async_r2",
        "default_r2",
        "rate_matched_r2",
        "static_fully_async_r3",
    ]
    with pytest.raises(SystemExit):
        cm.main(["--order", "random"])
    capsys.readouterr()


def test_the_alternate_order_reverses_every_second_round():
    order = load_benchmark("cpu_miniature").alternate_order(["static_fully_async", "rate_matched"], 3)
    assert order == [
        ("static_fully_async", 1),
        ("rate_matched", 1),
        ("rate_matched", 2),
        ("static_fully_async", 2),
        ("static_fully_async", 3),
        ("rate_matched", 3),
    ]


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


def test_the_report_splits_each_speedup_into_the_scheduling_and_the_machine_factor(capsys):
    cm = load_benchmark("cpu_miniature")

    def run(wall: float, bound: float | None) -> dict[str, Any]:
        return {**_result(wall, None if bound is None else bound / wall), "bound_s": bound, "traced_wall_s": wall}

    # the first dynamic run's static reference: bound (30 + 28) / 2 = 29 s over wall 45 s (efficiency 0.644); it
    # reaches 0.9 of a bound of 33 s (the machine took 12% back): 1.397 x 0.879 = its traced-wall speedup, 45 / 36.67
    static = [run(50.0, 30.0), run(40.0, 28.0), run(40.0, 32.0)]
    dynamic = [run(33.0 / 0.9, 33.0), run(30.0, 30.0)]  # the second: efficiency 1, bound 30 against 30 (1.333 x 1)
    factors = cm.speedup_factors(static, dynamic)
    assert factors is not None
    for (a, b), d, w in zip(factors, dynamic, (45.0, 40.0), strict=True):
        assert a * b == pytest.approx(w / d["traced_wall_s"])
    assert factors[0] == pytest.approx((0.9 / (29.0 / 45.0), 29.0 / 33.0))
    assert factors[1] == pytest.approx((1.0 / (30.0 / 40.0), 1.0))
    cm._report(
        ["static_fully_async", "rate_matched"], {"static_fully_async": static, "rate_matched": dynamic}, "rate_matched"
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if "as two factors" in x)
    assert "scheduling 1.36 " in line and "machine 0.94 " in line  # medians of (1.397, 1.333) and (0.879, 1.0)
    assert line.endswith("per repeat: 1.40 x 0.88 = 1.23, 1.33 x 1.00 = 1.33")
    assert "rho 0." not in line and "rho 1." not in line  # no bound at rho = 1 given: no rho part
    # the part of the machine's factor that is the hybrid replica's rho: its bound at rho = 1 over its own
    dynamic[0]["bound_rho1_s"], dynamic[1]["bound_rho1_s"] = 33.0 * 0.9, 30.0 * 0.8
    cm._report(
        ["static_fully_async", "rate_matched"], {"static_fully_async": static, "rate_matched": dynamic}, "rate_matched"
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if "as two factors" in x)
    assert "the hybrid replica's rho 0.85 (its bound at rho = 1 over its own)" in line
    # over the counted rounds only: with the first round not steady, the second round's alone
    cm._report(
        ["static_fully_async", "rate_matched"],
        {"static_fully_async": static, "rate_matched": dynamic},
        "rate_matched",
        spreads=[0.5, 0.01],
        repeats=1,
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if "as two factors" in x)
    assert "scheduling 1.33 " in line and "machine 1.00 " in line and "rho 0.80 " in line
    # a run whose trace lacks the bound's terms: no split
    assert cm.speedup_factors(static, [run(30.0, None), run(30.0, 30.0)]) is None


def test_a_round_over_which_the_machine_moved_is_replaced_and_left_out_of_the_speedup(monkeypatch, capsys, tmp_path):
    """The bracketed loop, its runs faked: round r2's dynamic run ran while the probe read the machine 30% slower
    (and its wall 30% longer); another round follows it, and the speedup is over r1, r3 and r4."""
    cm, ran = _fake_main(monkeypatch, slow={"rate_matched_r2"})
    cm.main(["--policies", "static_fully_async,rate_matched", "--repeats", "3", "--out", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    s, d = "static_fully_async", "rate_matched"
    assert ran == [f"{s}_r1", f"{d}_r1", f"{s}_r2", f"{d}_r2", f"{s}_r3", f"{d}_r3", f"{s}_r4", f"{d}_r4", f"{s}_r5"]
    assert "round r2: the machine-speed probe moved 30.0% over its runs, NOT steady (> 10%)" in lines
    counted = next(line for line in lines if line.startswith("speedups over rounds"))
    assert counted.startswith("speedups over rounds r1, r3, r4; not counted") and counted.endswith(": r2 (30.0%)")
    assert lines[-1] == "speedup: 1.25"  # 50 / 40 in every counted round; r2 alone would give 50 / 52
    assert "(per repeat: 1.25, 1.25, 1.25)" in next(line for line in lines if line.startswith("rate_matched: speedup"))
    assert "probe dynamic / static: 1.00, 1.00, 1.00)" in next(line for line in lines if "equal machine speed" in line)

    ran.clear()  # --extra-rounds 0: the repeats only, every round counted
    cm.main(["--policies", "static_fully_async,rate_matched", "--repeats", "3", "--extra-rounds", "0"])
    lines = capsys.readouterr().out.splitlines()
    assert len(ran) == 7 and not any(line.startswith("speedups over rounds") for line in lines)
    assert "per repeat: 1.25, 0.96, 1.25" in next(line for line in lines if line.startswith("rate_matched: speedup"))


@pytest.mark.slow
def test_terminating_the_benchmark_takes_its_running_worker_down(tmp_path):
    """SIGTERM to cpu_miniature while a run's worker (its own session: Ray, vLLM) trains: the worker goes too."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_miniature.py"
    bench = subprocess.Popen(
        [sys.executable, str(script), "--repeats", "1", "--steps", "64", "--out", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    spec = str(tmp_path / "static_fully_async_r1" / "spec.json")
    worker = None
    try:
        deadline = time.monotonic() + 300
        while worker is None and time.monotonic() < deadline and bench.poll() is None:
            worker = next((p for p in psutil.process_iter(["cmdline"]) if spec in (p.info["cmdline"] or [])), None)
            time.sleep(0.5)
        assert worker is not None, "the first run's worker never started"
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=30) == 128 + signal.SIGTERM
        worker.wait(timeout=30)  # psutil.TimeoutExpired: the worker outlived the benchmark
    finally:
        for p in [bench.pid] + ([worker.pid] if worker is not None else []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p, signal.SIGKILL) if p != bench.pid else os.kill(p, signal.SIGKILL)
