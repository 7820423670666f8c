"""The seed's §4 metric names and formulas: pure Python, shared by the runtime and the simulator (no torch).

See :mod:`lightning_hybrid_rollout.metrics` for the formulas in words.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

# The torchmetrics classes (TrainResourceUtilization, RolloutResourceUtilization, ClusterResourceUtilization,
# LastValueMetric, CounterMetric) are public too but stay out of __all__ so that a star import does not load torch.
__all__ = [
    "ACTIVATE_DURATION_S",
    "DEACTIVATE_DURATION_S",
    "HYBRID_ACTIVE",
    "HYBRID_SYNC_SKIPPED",
    "HYBRID_SYNC_SKIPPED_TOTAL",
    "METRIC_NAMES",
    "MQ_SIZE",
    "REPLICA_RESTARTS",
    "RESOURCE_UTILIZATION",
    "ROLLOUT_RESOURCE_UTILIZATION",
    "SEED_METRIC_NAMES",
    "STEP_GENERATED_SAMPLES",
    "TRAIN_ALLOCATED_TIME_S",
    "TRAIN_COMPUTE_TIME_S",
    "TRAIN_COMPUTE_TIMING_KEYS",
    "TRAIN_RESOURCE_UTILIZATION",
    "WEIGHT_SYNC_TIME_S",
    "LastValue",
    "StepCounter",
    "UtilizationPoint",
    "as_total",
    "cluster_resource_utilization",
    "correct_seed_capacity",
    "cycle_metrics",
    "hybrid_rollout_fraction",
    "last_value",
    "rollout_capacity",
    "rollout_resource_utilization",
    "rollout_utilization_terms",
    "safe_ratio",
    "train_compute_time",
    "train_resource_utilization",
]

# --------------------------------------------------------------------------------------------------------------
# Metric names. The first seven are verl's (design/scheduling.md §4) verbatim; the rest are ours.
# --------------------------------------------------------------------------------------------------------------

TRAIN_RESOURCE_UTILIZATION = "dynamic_resource/train_resource_utilization"
"""design/scheduling.md §4.1: Σcompute / Σallocated over the sync cycle."""
ROLLOUT_RESOURCE_UTILIZATION = "dynamic_resource/rollout_resource_utilization"
"""design/scheduling.md §4.2: capacity-time weighted concurrency use over the rollouter's step window."""
RESOURCE_UTILIZATION = "dynamic_resource/resource_utilization"
"""design/scheduling.md §4.3: cluster-wide utilization combining hybrid and standalone devices."""
TRAIN_COMPUTE_TIME_S = "dynamic_resource/train_compute_time_s"
"""design/scheduling.md §4.1 raw numerator: summed training-compute seconds of the cycle."""
TRAIN_ALLOCATED_TIME_S = "dynamic_resource/train_allocated_time_s"
"""design/scheduling.md §4.1 raw denominator: summed wall-clock seconds of the trainer's turn in the cycle."""
MQ_SIZE = "dynamic_resource/mq_size"
"""design/scheduling.md §4.4: samples left in the MessageQueue right after a fit step (last value of the cycle)."""
STEP_GENERATED_SAMPLES = "fully_async/rollouter/step_generated_samples"
"""design/scheduling.md §4.5: samples fully generated during the current param version (reset at each
``reset_staleness``)."""

ACTIVATE_DURATION_S = "dynamic_resource/activate_duration_s"
"""Ours: wall-clock seconds of the last hybrid activation (wake → sync → add → resume)."""
DEACTIVATE_DURATION_S = "dynamic_resource/deactivate_duration_s"
"""Ours: wall-clock seconds of the last hybrid deactivation (remove → abort → sleep)."""
WEIGHT_SYNC_TIME_S = "dynamic_resource/weight_sync_time_s"
"""Ours: wall-clock seconds of the last weight sync (standalone, plus hybrid when activated)."""
HYBRID_SYNC_SKIPPED = "dynamic_resource/hybrid_sync_skipped"
HYBRID_SYNC_SKIPPED_TOTAL = "dynamic_resource/hybrid_sync_skipped_total"
"""Ours: 1 when the policy kept hybrid replicas asleep so their weight sync was skipped, else 0."""
HYBRID_ACTIVE = "dynamic_resource/hybrid_active"
"""Ours: 1 while hybrid replicas serve rollout (HYBRID_ACTIVE state), 0 in STANDALONE_ONLY."""
REPLICA_RESTARTS = "dynamic_resource/replica_restarts"
"""Ours: replicas replaced since the run began (a replacement counts once it holds the current weights)."""

SEED_METRIC_NAMES: tuple[str, ...] = (
    TRAIN_RESOURCE_UTILIZATION,
    ROLLOUT_RESOURCE_UTILIZATION,
    RESOURCE_UTILIZATION,
    TRAIN_COMPUTE_TIME_S,
    TRAIN_ALLOCATED_TIME_S,
    MQ_SIZE,
    STEP_GENERATED_SAMPLES,
)
"""The seed's metric names, in seed order."""

METRIC_NAMES: tuple[str, ...] = (
    *SEED_METRIC_NAMES,
    ACTIVATE_DURATION_S,
    DEACTIVATE_DURATION_S,
    WEIGHT_SYNC_TIME_S,
    HYBRID_SYNC_SKIPPED,
    HYBRID_SYNC_SKIPPED_TOTAL,
    HYBRID_ACTIVE,
    REPLICA_RESTARTS,
)
"""Every metric name this package emits (``REPLICA_RESTARTS`` by the runtime only: the simulator's replicas never
fail)."""

TRAIN_COMPUTE_TIMING_KEYS: tuple[str, ...] = (
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
)
"""design/scheduling.md §4.1: the ``timing_raw`` keys whose sum is a micro-step's training compute (missing keys count
as 0)."""


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


def as_total(value: Any, name: str) -> float:
    """Sum a float or a sequence of floats (tensors and arrays accepted); reject negative or non-finite parts."""
    if hasattr(value, "tolist"):  # torch.Tensor / numpy array / numpy scalar
        value = value.tolist()
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{name} must be a number or a sequence of numbers, got {value!r}")
    parts: Iterable[Any] = value if isinstance(value, Iterable) else (value,)
    total = 0.0
    for part in parts:
        if isinstance(part, (bool, str, bytes, Iterable)):
            raise TypeError(f"{name} must be a number or a flat sequence of numbers, got element {part!r}")
        f = float(part)
        if not math.isfinite(f) or f < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {part!r}")
        total += f
    return total


def safe_ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


# --------------------------------------------------------------------------------------------------------------
# Pure formulas (design/scheduling.md §4)
# --------------------------------------------------------------------------------------------------------------


def train_compute_time(timing_raw: dict[str, float]) -> float:
    """Training-compute seconds of one micro fit-step: the sum of verl's compute keys (design/scheduling.md §4.1).

    Args:
        timing_raw: per-step timings keyed like verl's ``timing_raw``; keys outside
            :data:`TRAIN_COMPUTE_TIMING_KEYS` are ignored, missing ones count as 0.

    Example::

        >>> train_compute_time({"reward": 0.5, "update_actor": 2.0, "gen": 9.0})
        2.5
    """
    return as_total([timing_raw.get(k, 0.0) for k in TRAIN_COMPUTE_TIMING_KEYS], "timing_raw")


def train_resource_utilization(compute_s: float | Sequence[float], allocated_s: float | Sequence[float]) -> float:
    """``U_train = Σ compute_i / Σ alloc_i`` (design/scheduling.md §4.1): sums first, one ratio; 0.0 when nothing was
    allocated.

    Not clipped: a value above 1 means compute timers ran outside the allocated window (a measurement bug).

    Args:
        compute_s: training-compute seconds, one float for the whole cycle or one per micro fit-step.
        allocated_s: wall-clock seconds of the trainer's turn (includes param sync and activation), same shape.
    """
    return safe_ratio(as_total(compute_s, "compute_s"), as_total(allocated_s, "allocated_s"))


class UtilizationPoint(NamedTuple):
    """One event of the rollouter's utilization history: from ``t`` on, ``active`` tasks under capacity ``cap``."""

    t: float
    """Timestamp (seconds, any monotonic clock)."""
    active: int
    """``len(active_tasks)`` from ``t`` until the next point."""
    cap: int
    """``max_concurrent_samples`` (see :func:`rollout_capacity`) from ``t`` until the next point."""


def _points(history: Iterable[Sequence[float]]) -> list[tuple[float, float, float]]:
    points: list[tuple[float, float, float]] = []
    for i, point in enumerate(history):
        if len(point) != 3:
            raise ValueError(f"history[{i}] must be (t, active, cap), got {point!r}")
        t, active, cap = (float(v) for v in point)
        if not (math.isfinite(t) and math.isfinite(active) and math.isfinite(cap)):
            raise ValueError(f"history[{i}] must hold finite numbers, got {point!r}")
        if active < 0 or cap < 0:
            raise ValueError(f"history[{i}] needs active >= 0 and cap >= 0, got {point!r}")
        if points and t < points[-1][0]:
            raise ValueError(f"history timestamps must not decrease: history[{i}].t={t} < {points[-1][0]}")
        points.append((t, active, cap))
    return points


def rollout_utilization_terms(history: Iterable[Sequence[float]]) -> tuple[float, float]:
    """The two sums of design/scheduling.md §4.2: ``(Σ dt_k·min(cap_k, active_k), Σ dt_k·cap_k)``.

    These are what a distributed reduction must add up (sum-then-divide); :func:`rollout_resource_utilization`
    is their ratio.

    Args:
        history: ``(t_k, active_k, cap_k)`` points with non-decreasing ``t``; the interval ``[t_k, t_{k+1})``
            uses point ``k``'s ``active`` and ``cap``; the last point only closes the window.
    """
    points = _points(history)
    busy = capacity = 0.0
    for (t0, active, cap), (t1, _, _) in itertools.pairwise(points):
        if cap <= 0:  # zero capacity: zero weight, skipped (design/scheduling.md §4.2)
            continue
        dt = t1 - t0
        busy += dt * min(cap, active)
        capacity += dt * cap
    return busy, capacity


def rollout_resource_utilization(history: Iterable[Sequence[float]]) -> float:
    """``U_rollout`` (design/scheduling.md §4.2): capacity-time weighted share of rollout concurrency in use, in [0, 1].

    ``Σ_k (t_{k+1}-t_k)·min(cap_k, active_k) / Σ_k (t_{k+1}-t_k)·cap_k``. Intervals with ``cap_k = 0`` are skipped;
    0.0 when the total weight is 0 (empty history, a single point, or only zero-capacity intervals).

    Args:
        history: see :func:`rollout_utilization_terms`.
    """
    return safe_ratio(*rollout_utilization_terms(history))


def correct_seed_capacity(history: Sequence[Sequence[float]], cap: int) -> list[UtilizationPoint]:
    """Give the leading placeholder-capacity points (cap 0, recorded before the capacity was known) ``cap``.

    design/scheduling.md §4 caveat: the rollouter seeds its history at init with capacity 0, before
    ``max_concurrent_samples`` is
    known. Call this once, when the real capacity first becomes available. Only the leading run of cap-0 points is
    corrected: a zero capacity *after* a known one (every replica asleep) is real and stays.

    Args:
        history: ``(t, active, cap)`` points.
        cap: the real capacity (>= 0).

    Example::

        >>> correct_seed_capacity([(0.0, 0, 0), (1.0, 3, 8)], 8)
        [UtilizationPoint(t=0.0, active=0, cap=8), UtilizationPoint(t=1.0, active=3, cap=8)]
    """
    if isinstance(cap, bool) or int(cap) != cap or cap < 0:
        raise ValueError(f"cap must be an integer >= 0, got {cap!r}")
    out: list[UtilizationPoint] = []
    seeding = True
    for t, active, c in history:
        if seeding and c == 0:
            c = int(cap)
        else:
            seeding = False
        out.append(UtilizationPoint(t, active, c))
    return out


def rollout_capacity(active_servers: int, concurrent_samples_per_replica: int, max_required_samples: int) -> int:
    """``cap = min(servers · s, maxReq)`` (design/scheduling.md §4.2): the rollouter's concurrency cap for
    ``active_servers``.

    Example::

        >>> rollout_capacity(3, 16, 40)  # min(48, 40)
        40
    """
    for name, v in (
        ("active_servers", active_servers),
        ("concurrent_samples_per_replica", concurrent_samples_per_replica),
        ("max_required_samples", max_required_samples),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    return min(active_servers * concurrent_samples_per_replica, max_required_samples)


def hybrid_rollout_fraction(wait_s: float | Sequence[float], step_s: float | Sequence[float]) -> float:
    """``x = clip(Σwait / Σstep, 0, 1)`` (design/scheduling.md §4.3): share of the cycle hybrid devices spent on
    rollout; 0 if step 0.

    Args:
        wait_s: summed ``timing_s/wait_for_enough_samples`` (float or one per micro-step); 0 when hybrid replicas
            were not in rollout mode this cycle.
        step_s: summed ``timing_s/step`` (float or one per micro-step).
    """
    return min(1.0, max(0.0, safe_ratio(as_total(wait_s, "wait_s"), as_total(step_s, "step_s"))))


def cluster_resource_utilization(
    u_train: float,
    u_rollout: float,
    wait_s: float | Sequence[float],
    step_s: float | Sequence[float],
    hybrid_devices: int,
    standalone_devices: int,
) -> float:
    """``U_cluster = ((1-x)·a·U_train + (x·a + b)·U_rollout) / (a + b)`` (design/scheduling.md §4.3); 0.0 when ``a + b
    == 0``.

    Args:
        u_train: :func:`train_resource_utilization` of the cycle.
        u_rollout: :func:`rollout_resource_utilization` of the cycle.
        wait_s: see :func:`hybrid_rollout_fraction`.
        step_s: see :func:`hybrid_rollout_fraction`.
        hybrid_devices: ``a``, devices shared by training and hybrid rollout replicas.
        standalone_devices: ``b``, devices dedicated to standalone rollout replicas.
    """
    a, b = float(hybrid_devices), float(standalone_devices)
    if a < 0 or b < 0:
        raise ValueError(f"device counts must be >= 0, got hybrid_devices={a}, standalone_devices={b}")
    if a + b == 0:
        return 0.0
    x = hybrid_rollout_fraction(wait_s, step_s)
    return ((1.0 - x) * a * float(u_train) + (x * a + b) * float(u_rollout)) / (a + b)


def last_value(values: Iterable[float], default: float = 0.0) -> float:
    """Last value observed (design/scheduling.md §4.4 ``mq_size`` semantics: a snapshot, never an average); ``default``
    if none."""
    out = default
    for value in values:
        out = value
    return float(out)


class LastValue:
    """Pure-Python last-value tracker for ``mq_size`` (design/scheduling.md §4.4): report the last snapshot of the
    cycle."""

    def __init__(self, default: float = 0.0) -> None:
        self.default = default
        self._value: float | None = None

    def update(self, value: float) -> None:
        """Record a snapshot (e.g. ``get_queue_size_sync()`` right after a fit step)."""
        self._value = float(value)

    @property
    def value(self) -> float:
        """The last snapshot, or ``default`` if none was recorded since the last reset."""
        return self.default if self._value is None else self._value

    def reset(self) -> float:
        """Return :attr:`value` and forget it (call at the end of the cycle)."""
        out = self.value
        self._value = None
        return out


class StepCounter:
    """Pure-Python counter with ``step_generated_samples`` semantics (design/scheduling.md §4.5): reset at each param
    version."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int = 1) -> None:
        """Count ``n`` more fully generated samples."""
        if n < 0:
            raise ValueError(f"StepCounter.add needs n >= 0, got {n}")
        self.value += n

    def reset(self) -> int:
        """Return the count of the closing param version and start again from 0 (call in ``reset_staleness``)."""
        out, self.value = self.value, 0
        return out


def cycle_metrics(
    *,
    compute_s: float | Sequence[float],
    allocated_s: float | Sequence[float],
    rollout_history: Iterable[Sequence[float]],
    wait_s: float | Sequence[float],
    step_s: float | Sequence[float],
    hybrid_devices: int,
    standalone_devices: int,
    mq_sizes: Iterable[float] = (),
    step_generated_samples: int | None = None,
) -> dict[str, float]:
    """All design/scheduling.md §4 metrics of one sync cycle, keyed by their seed names (the simulator and tests use
    this).

    Args:
        compute_s, allocated_s: per-micro-step (or summed) trainer timings, see :func:`train_resource_utilization`.
        rollout_history: the rollouter's window, see :func:`rollout_resource_utilization`.
        wait_s, step_s: see :func:`hybrid_rollout_fraction`.
        hybrid_devices, standalone_devices: see :func:`cluster_resource_utilization`.
        mq_sizes: queue-size snapshots in order; :data:`MQ_SIZE` is the last one (omitted when empty).
        step_generated_samples: the rollouter's counter for the window (omitted when None).
    """
    u_train = train_resource_utilization(compute_s, allocated_s)
    u_rollout = rollout_resource_utilization(rollout_history)
    out = {
        TRAIN_RESOURCE_UTILIZATION: u_train,
        ROLLOUT_RESOURCE_UTILIZATION: u_rollout,
        RESOURCE_UTILIZATION: cluster_resource_utilization(
            u_train, u_rollout, wait_s, step_s, hybrid_devices, standalone_devices
        ),
        TRAIN_COMPUTE_TIME_S: as_total(compute_s, "compute_s"),
        TRAIN_ALLOCATED_TIME_S: as_total(allocated_s, "allocated_s"),
    }
    mq = list(mq_sizes)
    if mq:
        out[MQ_SIZE] = last_value(mq)
    if step_generated_samples is not None:
        out[STEP_GENERATED_SAMPLES] = float(step_generated_samples)
    return out


# --------------------------------------------------------------------------------------------------------------
# torchmetrics classes (built lazily: torch is imported on first access, never by ``import ...metrics``)
# --------------------------------------------------------------------------------------------------------------
