"""``benchmarks/machine_speed.py``: the low-duty machine-speed probe cpu_miniature runs around every run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.benchmarks import load_benchmark


def test_the_probe_times_its_work_unit_on_every_core_it_was_given():
    ms = load_benchmark("machine_speed")
    cores = sorted(os.sched_getaffinity(0))
    t0 = time.monotonic()
    with ms.MachineSpeedProbe(period_s=0.05) as probe:
        time.sleep(0.6)
    assert {c for _, c, _ in probe.samples} == set(cores)
    for core in cores:
        unit = probe.unit_ms(core)
        assert unit is not None and 0.05 < unit < 500  # a ~1.5 ms unit, whatever this machine's speed
    assert probe.unit_ms(cores[0], start=time.monotonic() + 10) is None  # no sample in that window
    assert probe.mean_unit_ms(t0) == pytest.approx(sum(probe.unit_ms(c, t0) for c in cores) / len(cores))


def test_the_probe_reads_cpu_time_not_the_time_it_waited_for_a_busy_core(monkeypatch):
    """A unit's reading is the core's time to run it: with another process busy on the same core, the wall time
    around a unit is about twice its reading (the scheduler shares the core), the reading itself is not."""
    ms = load_benchmark("machine_speed")
    monkeypatch.setattr(ms, "UNIT_ITERATIONS", 300_000)  # ~20 ms: several scheduler slices, so waits fall inside
    core = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.3)  # the hog is running
        shares = []
        for _ in range(8):
            t = time.perf_counter()
            reading = ms.work_unit()
            shares.append(reading / (time.perf_counter() - t))
    finally:
        os.sched_setaffinity(0, before)
        hog.kill()
        hog.wait()
    assert sorted(shares)[len(shares) // 2] < 0.75, shares


def test_the_script_prints_the_slowest_over_fastest_window_last(capsys):
    load_benchmark("machine_speed").main(["--seconds", "0.6", "--period", "0.05", "--window", "0.2"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("slowest / fastest window: ")
    assert float(last.rsplit(" ", 1)[1]) >= 1.0


def test_a_round_is_steady_only_when_the_probe_moved_at_most_the_tolerance_over_its_runs():
    ms = load_benchmark("machine_speed")
    assert ms.probe_spread([0.70, 0.77, 0.70]) == pytest.approx(0.10)
    assert ms.probe_spread([0.80, 0.70]) == pytest.approx(0.80 / 0.70 - 1)  # slowest over fastest, either order
    assert ms.probe_spread([0.70, None, 0.70]) is None and ms.probe_spread([]) is None
    assert ms.is_steady(0.10) and not ms.is_steady(0.1001)
    assert ms.is_steady(None)  # no reading: nothing says the machine moved
    assert ms.is_steady(0.15, tolerance=0.2) and not ms.is_steady(0.15, tolerance=0.1)


def test_the_counted_rounds_are_the_steady_ones_or_else_the_steadiest():
    ms = load_benchmark("machine_speed")
    assert ms.counted_rounds([0.02, 0.30, 0.05, 0.04], wanted=3) == [0, 2, 3]
    assert ms.counted_rounds([0.02, 0.30, 0.05, 0.04, 0.01], wanted=3) == [0, 2, 3, 4]  # every steady one
    # too few steady rounds: the wanted number, the steadiest first (an unknown spread before any known one)
    assert ms.counted_rounds([0.40, 0.30, 0.15], wanted=2) == [1, 2]
    assert ms.counted_rounds([0.40, None, 0.15], wanted=2) == [1, 2]
    assert ms.counted_rounds([0.40, 0.30, 0.15], wanted=2, tolerance=0.5) == [0, 1, 2]


def test_another_round_runs_until_enough_rounds_are_steady_or_the_extra_rounds_are_spent():
    ms = load_benchmark("machine_speed")
    more = lambda spreads, extra=2: ms.another_round(spreads, repeats=3, extra_rounds=extra, tolerance=0.1)  # noqa: E731
    assert more([]) and more([0.01, 0.01])  # the repeats first, steady or not
    assert not more([0.01, 0.02, 0.03])  # three steady rounds: done
    assert more([0.01, 0.50, 0.03]) and more([0.01, 0.50, 0.03, 0.40])  # one more per unsteady round ...
    assert not more([0.01, 0.50, 0.03, 0.40, 0.30])  # ... up to repeats + extra_rounds
    assert not more([0.01, 0.50, 0.03], extra=0)  # no extra rounds: the repeats only
    assert not more([0.01, 0.50, 0.03, 0.02])
