"""A real run's balance bound, efficiency and time breakdown, from its own trace (``lhr report``, the CPU miniature), by
the simulator's own bound function; what each term is read from is in docs/simulator.md, "The balance bound and
efficiency".

Example::

    from lightning_hybrid_rollout.analysis.run_bound import read_run

    report = read_run("runs/cpu_miniature/default_r1")
    print(report.efficiency, report.breakdown_s["waiting_idle"])
    print("\\n".join(report.lines()))
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.sim.bound import bound_from_terms
from lightning_hybrid_rollout.sim.results import BREAKDOWN_KEYS as SIM_BREAKDOWN_KEYS
from lightning_hybrid_rollout.trace import (
    DECODED_TOKENS,
    SERVING_S,
    TRAINED_SAMPLES,
    TRAINED_TOKENS,
    TRAINER_TRACK,
    TraceData,
    load_trace,
)

__all__ = [
    "BREAKDOWN_KEYS",
    "BREAKDOWN_LABELS",
    "RunMeasurements",
    "RunReport",
    "read_run",
    "report_from_trace",
    "run_balance_bound",
    "trainer_breakdown",
]

#: A real run's trainer-timeline buckets: the simulator's (but ``waiting_staleness_bound``) plus ``untraced``.
BREAKDOWN_KEYS: tuple[str, ...] = (
    *(k for k in SIM_BREAKDOWN_KEYS if k != "waiting_staleness_bound"),
    "untraced",
)
#: How the buckets are printed.
BREAKDOWN_LABELS: dict[str, str] = {
    "training_compute": "training",
    "startup_fill": "start-up",
    "waiting_hybrid_generating": "waiting with hybrid generating",
    "waiting_idle": "waiting idle",
    "hybrid_switching": "switching",
    "weight_sync_standalone": "standalone sync",
    "weight_sync_hybrid": "hybrid sync",
    "untraced": "untraced",
}


def run_balance_bound(
    train_devices: float,
    rollout_devices: float,
    train_compute_s: float,
    trained_tokens: float,
    standalone_tokens_per_device_s: float,
    hybrid_tokens_per_device_s: float | None = None,
) -> float:
    """A real run's balance bound from its measurements (seconds): the simulator's formula, ``bound_from_terms``.

    Args:
        train_devices: ``T``, the trainer's devices.
        rollout_devices: ``S``, the standalone replicas' devices.
        train_compute_s: Wall seconds the trainer computed (``W = train_compute_s × T``).
        trained_tokens: Response tokens of the samples trained.
        standalone_tokens_per_device_s: The standalone replicas' decode rate per device while alone on their devices
            (``G = trained_tokens / rate``).
        hybrid_tokens_per_device_s: The hybrid replicas' rate per device while alone on the trainer's devices
            (``ρ`` = hybrid / standalone); None: never measured, ``ρ = 1``.

    Example::

        >>> run_balance_bound(1, 1, 27.8, 265_000, 3_125.0)  # (265000 / 3125 + 27.8) / 2 = (84.8 + 27.8) / 2
        56.3
    """
    measured = RunMeasurements(
        train_devices,
        rollout_devices,
        train_compute_s,
        trained_tokens,
        standalone_tokens_per_device_s,
        hybrid_tokens_per_device_s,
    )
    return measured.bound_s


@dataclass(frozen=True)
class RunMeasurements:
    """What a real run measured that its balance bound needs (see :func:`run_balance_bound` for the fields)."""

    train_devices: float
    rollout_devices: float
    train_compute_s: float
    trained_tokens: float
    standalone_tokens_per_device_s: float
    hybrid_tokens_per_device_s: float | None = None

    def __post_init__(self) -> None:
        if not self.standalone_tokens_per_device_s > 0:
            raise ValueError(f"the standalone decode rate must be > 0, got {self.standalone_tokens_per_device_s}")

    @property
    def train_device_s(self) -> float:
        """``W``: training compute in device-seconds."""
        return self.train_compute_s * self.train_devices

    @property
    def generation_device_s(self) -> float:
        """``G``: the trained tokens in standalone device-seconds."""
        return self.trained_tokens / self.standalone_tokens_per_device_s

    @property
    def rho(self) -> float:
        """``ρ``: hybrid / standalone decode rate per device (1.0 when the hybrid rate was not measured)."""
        if self.hybrid_tokens_per_device_s is None:
            return 1.0
        return self.hybrid_tokens_per_device_s / self.standalone_tokens_per_device_s

    @property
    def bound_s(self) -> float:
        """The balance bound, seconds."""
        return bound_from_terms(
            self.train_devices, self.rollout_devices, self.train_device_s, self.generation_device_s, self.rho
        )


@dataclass(frozen=True)
class RunReport:
    """A real run's bound, efficiency and breakdown (:func:`report_from_trace`).

    Args:
        name: The run's name.
        start_s, end_s: The trainer's traced time (seconds on the trace's clock).
        breakdown_s: :data:`BREAKDOWN_KEYS` → seconds; they sum to :attr:`wall_s`.
        measurements: The bound's terms; None when the trace lacks one (see ``missing``).
        missing: What the trace lacks for the bound (empty when it has everything).
        totals: The trace's running totals at their last value (``trained_tokens``, ``decoded_tokens.standalone``, ...).
    """

    name: str
    start_s: float
    end_s: float
    breakdown_s: dict[str, float]
    measurements: RunMeasurements | None = None
    missing: tuple[str, ...] = ()
    totals: dict[str, float] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        """The trainer's traced time: its first span's start to its last span's end."""
        return self.end_s - self.start_s

    @property
    def bound_s(self) -> float | None:
        """The run's balance bound (None when not measurable)."""
        return None if self.measurements is None else self.measurements.bound_s

    @property
    def efficiency(self) -> float | None:
        """``bound_s / wall_s`` (None when the bound is not measurable)."""
        bound = self.bound_s
        return None if bound is None or self.wall_s <= 0 else bound / self.wall_s

    def lines(self) -> list[str]:
        """Three lines: the bound and the efficiency, the bound's terms, where the trainer's time went."""
        m = self.measurements
        wall_text = f"traced wall {self.wall_s:.1f} s"
        if m is None:
            head = f"balance bound: not measurable, the trace lacks {', '.join(self.missing)} ({wall_text})"
            terms = "terms: the runtime writes them at each sync cycle's end (lightning_hybrid_rollout.trace)"
        else:
            head = f"balance bound {m.bound_s:.1f} s, efficiency {self.efficiency:.3f} ({wall_text})"
            source = "measured" if m.hybrid_tokens_per_device_s is not None else "assumed: hybrid never served"
            terms = (
                f"terms: training {m.train_compute_s:.1f} s x T {m.train_devices:g}; "
                f"G {m.generation_device_s:.1f} device-s = {m.trained_tokens / 1000:.1f}k tokens trained / "
                f"{m.standalone_tokens_per_device_s:.0f} tok/s per standalone device while serving (S "
                f"{m.rollout_devices:g}); rho {m.rho:.2f} ({source})"
            )
        wall = self.wall_s if self.wall_s > 0 else 1.0
        parts = [
            f"{BREAKDOWN_LABELS[k]} {v:.1f} s ({100 * v / wall:.0f}%)"
            for k, v in self.breakdown_s.items()
            if v > 0.05 or k == "training_compute"
        ]
        return [head, terms, "time: " + ", ".join(parts)]


def trainer_breakdown(trace: TraceData) -> tuple[dict[str, float], float, float]:
    """Where the trainer's time went, from its track's phase spans: ``(breakdown_s, start_s, end_s)``.

    Raises:
        ValueError: The trace has no trainer span.
    """
    spans = trace.spans_of(TRAINER_TRACK)
    if not spans:
        raise ValueError(f"the trace has no {TRAINER_TRACK} span: nothing to break down")
    first_training = min((s.start_s for s in spans if s.name == "training"), default=math.inf)
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    for s in spans:
        seconds = s.end_s - s.start_s
        if s.name == "training":
            key = "training_compute"
        elif s.name == "waiting":
            if s.start_s < first_training:
                key = "startup_fill"
            else:
                key = "waiting_hybrid_generating" if s.args.get("hybrid") else "waiting_idle"
        elif s.name == "weight_sync":
            key = "weight_sync_hybrid" if s.args.get("target") == "hybrid" else "weight_sync_standalone"
        elif s.name == "switching":
            key = "hybrid_switching"
        else:
            continue
        out[key] += seconds
    start, end = spans[0].start_s, max(s.end_s for s in spans)
    out["untraced"] = max(0.0, (end - start) - sum(out.values()))
    return out, start, end


def _count(devices: Any) -> int:
    """A track's ``devices`` fact: a list of device ids, or a count."""
    if isinstance(devices, (int, float)) and not isinstance(devices, bool):
        return int(devices)
    return len(devices or ())


def _devices(trace: TraceData, kind: str) -> int:
    return sum(_count(info.get("devices")) for info in trace.tracks.values() if info.get("kind") == kind)


def _rate(totals: dict[str, float], role: str, devices: int) -> float | None:
    tokens, serving = totals.get(f"{DECODED_TOKENS}.{role}", 0.0), totals.get(f"{SERVING_S}.{role}", 0.0)
    if tokens <= 0 or serving <= 0 or devices <= 0:
        return None
    return tokens / serving / devices


def report_from_trace(trace: TraceData, name: str = "run", train_devices: float | None = None) -> RunReport:
    """A run's bound, efficiency and breakdown from its trace.

    Args:
        trace: The run's trace (:func:`~lightning_hybrid_rollout.trace.load_trace`).
        name: The run's name.
        train_devices: ``T`` when the trace does not describe the trainer's devices (a run without hybrid replicas)
            or describes them in other units (CPU cores of a GPU run's replicas).
    """
    breakdown, start, end = trainer_breakdown(trace)
    totals: dict[str, tuple[float, float]] = {}  # running totals: the latest sample of each
    for c in trace.counters:
        ours = c.name in (TRAINED_SAMPLES, TRAINED_TOKENS) or c.name.startswith((f"{DECODED_TOKENS}.", f"{SERVING_S}."))
        if ours and (c.name not in totals or c.t >= totals[c.name][0]):
            totals[c.name] = (c.t, c.value)
    last = {k: v for k, (_, v) in totals.items()}
    T = train_devices
    if T is None:
        T = _count(trace.tracks.get(TRAINER_TRACK, {}).get("devices")) or _devices(trace, "hybrid")
    S = _devices(trace, "standalone")
    missing = []
    if not T:
        missing.append("the trainer's devices (pass train_devices)")
    if TRAINED_TOKENS not in last:
        missing.append(f"the {TRAINED_TOKENS} counter")
    standalone = _rate(last, "standalone", S)
    if standalone is None:
        missing.append(f"the standalone replicas' {DECODED_TOKENS}/{SERVING_S} counters or devices")
    measurements = None
    if not missing:
        assert standalone is not None and T
        measurements = RunMeasurements(
            float(T),
            float(S),
            breakdown["training_compute"],
            last[TRAINED_TOKENS],
            standalone,
            _rate(last, "hybrid", _devices(trace, "hybrid")),
        )
    return RunReport(name, start, end, breakdown, measurements, tuple(missing), last)


def read_run(run_dir: str | os.PathLike[str], train_devices: float | None = None, name: str | None = None) -> RunReport:
    """:func:`report_from_trace` of ``RUN_DIR/trace.json`` (or of that trace file itself).

    Args:
        run_dir: The run's folder, or its trace file.
        train_devices: See :func:`report_from_trace`.
        name: The run's name (default: the trace's ``run`` metadata, else the folder's name).

    Raises:
        FileNotFoundError: No trace there.
        ValueError: The trace is not readable or has no trainer span.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / "trace.json"
    if not path.is_file():
        raise FileNotFoundError(f"no trace at {path}: run training with the trace enabled first")
    trace = load_trace(path)
    name = name or str(trace.metadata.get("run") or path.parent.name)
    return report_from_trace(trace, name, train_devices)
