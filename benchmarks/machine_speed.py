"""How fast this machine's cores run right now: a low-duty probe, independent of whatever else runs on them.

Each probed core gets one thread pinned to it that times a fixed unit of pure-Python work (``UNIT_ITERATIONS``
iterations of a small integer loop, ~1-2 ms) every ``period_s`` by its own **thread CPU time**
(``time.thread_time``): waiting for the core while other processes run is not counted, so the reading is how long
the core takes to execute that work, not how busy it is. On this project's shared VM that time moves by up to 2x
within a minute with nothing of ours running (a host-level effect: steal time stays ~0), which is what makes two real
runs minutes apart differ by 10-30% (``docs/cpu_miniature.md``). The probe costs ~0.1-0.2% of each core.

``benchmarks/cpu_miniature.py`` runs one around every run and prints each run's median probe time per core while it
trained; its summary divides each speedup by the pair's machine-speed ratio (information only; its last line stays
the raw speedup). Alone::

    .venv/bin/python benchmarks/machine_speed.py --seconds 60

prints the probe's median and range per 10-s window per core; the last line is
``slowest / fastest window: X.XX`` (1.00 on a machine that holds its speed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Sequence

UNIT_ITERATIONS = 20_000
"""Iterations of the probe's work unit (~1.5 ms of one core at ~75 ns per iteration)."""


def work_unit() -> float:
    """Run the fixed unit of work once; its thread CPU time in seconds."""
    t = time.thread_time()
    x = 0
    for i in range(UNIT_ITERATIONS):
        x += i * i % 7
    return time.thread_time() - t


class MachineSpeedProbe:
    """Times :func:`work_unit` on each of ``cores`` every ``period_s`` in background threads (a context manager).

    Args:
        cores: The cores to probe (default: every core this process may run on).
        period_s: Seconds between two units on one core.
    """

    def __init__(self, cores: Sequence[int] | None = None, period_s: float = 1.0) -> None:
        self.cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self.period_s = period_s
        #: ``(monotonic time, core, unit CPU seconds)`` per probe.
        self.samples: list[tuple[float, int, float]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _loop(self, core: int) -> None:
        os.sched_setaffinity(threading.get_native_id(), {core})
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), core, work_unit()))
            self._stop.wait(self.period_s)

    def __enter__(self) -> MachineSpeedProbe:
        for core in self.cores:
            t = threading.Thread(target=self._loop, args=(core,), name=f"machine-speed-{core}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def readings_ms(self, core: int, start: float | None = None, end: float | None = None) -> list[float]:
        """Milliseconds per unit on ``core`` of the units started in ``[start, end)`` (``time.monotonic()``)."""
        return [
            1000 * s
            for t, c, s in self.samples
            if c == core and (start is None or t >= start) and (end is None or t < end)
        ]

    def unit_ms(self, core: int, start: float | None = None, end: float | None = None) -> float | None:
        """Median milliseconds per unit on ``core`` in ``[start, end)`` (None: no sample)."""
        xs = self.readings_ms(core, start, end)
        return statistics.median(xs) if xs else None

    def mean_unit_ms(self, start: float | None = None, end: float | None = None) -> float | None:
        """The cores' medians averaged (None: no sample)."""
        per_core = [m for m in (self.unit_ms(c, start, end) for c in self.cores) if m is not None]
        return statistics.fmean(per_core) if per_core else None


STEADY_TOLERANCE = 0.10
"""A round of runs is *steady* when its runs' probe readings (each run's median time per unit while it trained)
differ by at most this fraction (slowest / fastest - 1); ``cpu_miniature`` and ``planner_fidelity`` count the steady
rounds. A round figure: a bracketed round cancels a drift linear over its runs, not a machine that ran 15-70% faster or
slower during one of them, which the probe saw in 10 of the 18 rounds of six ``planner_fidelity`` sessions
(docs/cpu_miniature.md has them)."""


def probe_spread(unit_ms: Sequence[float | None]) -> float | None:
    """How far the machine's speed moved over a round: the slowest run's probe time over the fastest's, minus 1
    (``unit_ms``: each run's median milliseconds per unit; None when a run has no reading, then the round's spread
    is unknown).

    Example::

        assert round(probe_spread([0.70, 0.77, 0.70]), 6) == 0.1
        assert probe_spread([0.70, None]) is None
    """
    if not unit_ms or any(x is None or x <= 0 for x in unit_ms):
        return None
    return max(unit_ms) / min(unit_ms) - 1.0  # type: ignore[type-var]


def is_steady(spread: float | None, tolerance: float = STEADY_TOLERANCE) -> bool:
    """Whether a round with this :func:`probe_spread` counts (an unknown spread counts: nothing says it moved)."""
    return spread is None or spread <= tolerance


def counted_rounds(spreads: Sequence[float | None], wanted: int, tolerance: float = STEADY_TOLERANCE) -> list[int]:
    """The indices, in round order, of the rounds whose figures count: every steady round (:func:`is_steady`) when
    there are at least ``wanted`` of them; otherwise the ``wanted`` steadiest (unknown spreads first, then the
    smallest), so a machine that never held its speed still gives figures, from its best rounds.

    Example::

        assert counted_rounds([0.02, 0.30, 0.05, 0.04], wanted=3) == [0, 2, 3]
        assert counted_rounds([0.02, 0.30, 0.15], wanted=2) == [0, 2]
    """
    steady = [i for i, s in enumerate(spreads) if is_steady(s, tolerance)]
    if len(steady) >= wanted:
        return steady
    ranked = sorted(range(len(spreads)), key=lambda i: (spreads[i] is not None, spreads[i] or 0.0, i))
    return sorted(ranked[:wanted])


def another_round(spreads: Sequence[float | None], repeats: int, extra_rounds: int, tolerance: float) -> bool:
    """Whether to run one more round: fewer than ``repeats`` rounds run, or fewer than ``repeats`` of them steady
    and fewer than ``repeats + extra_rounds`` run.

    Example::

        assert another_round([0.02, 0.30, 0.05], repeats=3, extra_rounds=2, tolerance=0.1)
        assert not another_round([0.02, 0.30, 0.05, 0.04], repeats=3, extra_rounds=2, tolerance=0.1)
    """
    steady = sum(is_steady(s, tolerance) for s in spreads)
    return len(spreads) < repeats or (steady < repeats and len(spreads) < repeats + extra_rounds)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--period", type=float, default=0.2, help="seconds between two units on one core")
    p.add_argument("--window", type=float, default=10.0, help="seconds per printed window")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    with MachineSpeedProbe(period_s=args.period) as probe:
        time.sleep(args.seconds)
    medians: list[float] = []
    n_windows = max(1, int(args.seconds // args.window))
    for k in range(n_windows):
        lo, hi = t0 + k * args.window, t0 + (k + 1) * args.window
        cells = []
        for core in probe.cores:
            xs = probe.readings_ms(core, lo, hi)
            if xs:
                medians.append(statistics.median(xs))
                cells.append(f"core {core} {statistics.median(xs):.2f} ms ({min(xs):.2f}-{max(xs):.2f})")
        print(f"{k * args.window:5.0f}-{(k + 1) * args.window:.0f} s: " + ", ".join(cells))
    print(f"slowest / fastest window: {max(medians) / min(medians):.2f}")


if __name__ == "__main__":
    main()
