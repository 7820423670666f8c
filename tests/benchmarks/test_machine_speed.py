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
