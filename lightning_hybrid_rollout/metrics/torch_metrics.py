"""The torchmetrics classes of the ``dynamic_resource/*`` metrics (sum-then-divide across ranks).

Defined at module level here; :mod:`lightning_hybrid_rollout.metrics` exposes them lazily (importing the metrics
package does not import torch). Every ratio keeps its numerator and denominator as separate
``dist_reduce_fx="sum"`` states and divides once on the pooled totals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torchmetrics import Metric

from lightning_hybrid_rollout.metrics.formulas import (
    as_total,
    cluster_resource_utilization,
    rollout_utilization_terms,
    safe_ratio,
    train_resource_utilization,
)

__all__ = [
    "ClusterResourceUtilization",
    "CounterMetric",
    "LastValueMetric",
    "RolloutResourceUtilization",
    "TrainResourceUtilization",
]


f64 = torch.float64


def _zero() -> torch.Tensor:
    return torch.tensor(0.0, dtype=f64)


class TrainResourceUtilization(Metric):
    """``dynamic_resource/train_resource_utilization`` (design/scheduling.md §4.1) as a sum-then-divide metric.

    States ``compute_s`` and ``allocated_s`` are summed over updates and across ranks (``dist_reduce_fx="sum"``);
    ``compute()`` returns ``Σcompute / Σallocated`` (0 when nothing allocated), the pooled ratio, never the mean
    of per-rank ratios.

    Example::

        >>> m = TrainResourceUtilization()
        >>> m.update(3.0, 4.0); m.update([1.0, 1.0], [3.0, 3.0])
        >>> float(m.compute())  # (3+2)/(4+6)
        0.5
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("compute_s", default=_zero(), dist_reduce_fx="sum")
        self.add_state("allocated_s", default=_zero(), dist_reduce_fx="sum")

    def update(self, compute_s: Any, allocated_s: Any) -> None:
        """Add training-compute and allocated seconds (floats, sequences or tensors; summed)."""
        self.compute_s += as_total(compute_s, "compute_s")
        self.allocated_s += as_total(allocated_s, "allocated_s")

    def compute(self) -> torch.Tensor:
        return torch.tensor(
            train_resource_utilization(float(self.compute_s), float(self.allocated_s)),
            dtype=f64,
        )


class RolloutResourceUtilization(Metric):
    """``dynamic_resource/rollout_resource_utilization`` (design/scheduling.md §4.2) as a sum-then-divide metric.

    Each ``update(history)`` adds the window's :func:`rollout_utilization_terms` to the states ``busy``
    (Σ dt·min(cap, active)) and ``capacity`` (Σ dt·cap), summed across ranks; ``compute()`` is
    ``busy / capacity`` (0 if 0).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("busy", default=_zero(), dist_reduce_fx="sum")
        self.add_state("capacity", default=_zero(), dist_reduce_fx="sum")

    def update(self, history: Iterable[Sequence[float]]) -> None:
        """Add one utilization window: ``(t, active, cap)`` points, the last one closing the window."""
        busy, capacity = rollout_utilization_terms(history)
        self.busy += busy
        self.capacity += capacity

    def compute(self) -> torch.Tensor:
        return torch.tensor(safe_ratio(float(self.busy), float(self.capacity)), dtype=f64)


class ClusterResourceUtilization(Metric):
    """``dynamic_resource/resource_utilization`` (design/scheduling.md §4.3) with every input pooled across ranks.

    Reduction: all six states are sums (``dist_reduce_fx="sum"``): train compute/allocated seconds, rollout
    busy/capacity weights, and hybrid wait/step seconds. ``compute()`` then takes ``U_train`` and ``U_rollout`` as
    ratios of pooled sums, ``x = clip(Σwait / Σstep, 0, 1)`` on the pooled sums, and applies verl's formula with
    the constructor's device counts (cluster constants, not reduced). A rank passes only what it measures: trainer
    ranks their timings, the rank hosting the rollouter its history; missing inputs count as 0.

    Args:
        hybrid_devices: ``a``, devices shared by training and hybrid replicas.
        standalone_devices: ``b``, devices of the standalone replicas.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, hybrid_devices: int, standalone_devices: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if hybrid_devices < 0 or standalone_devices < 0:
            raise ValueError(
                f"device counts must be >= 0, got hybrid_devices={hybrid_devices}, "
                f"standalone_devices={standalone_devices}"
            )
        self.hybrid_devices = hybrid_devices
        self.standalone_devices = standalone_devices
        for state in ("compute_s", "allocated_s", "busy", "capacity", "wait_s", "step_s"):
            self.add_state(state, default=_zero(), dist_reduce_fx="sum")

    def update(
        self,
        compute_s: Any = 0.0,
        allocated_s: Any = 0.0,
        history: Iterable[Sequence[float]] | None = None,
        wait_s: Any = 0.0,
        step_s: Any = 0.0,
    ) -> None:
        """Add any subset of the cycle's inputs (floats, sequences or tensors; summed)."""
        self.compute_s += as_total(compute_s, "compute_s")
        self.allocated_s += as_total(allocated_s, "allocated_s")
        if history is not None:
            busy, capacity = rollout_utilization_terms(history)
            self.busy += busy
            self.capacity += capacity
        self.wait_s += as_total(wait_s, "wait_s")
        self.step_s += as_total(step_s, "step_s")

    def compute(self) -> torch.Tensor:
        value = cluster_resource_utilization(
            safe_ratio(float(self.compute_s), float(self.allocated_s)),
            safe_ratio(float(self.busy), float(self.capacity)),
            float(self.wait_s),
            float(self.step_s),
            self.hybrid_devices,
            self.standalone_devices,
        )
        return torch.tensor(value, dtype=f64)


class LastValueMetric(Metric):
    """Last value observed (``dynamic_resource/mq_size``, design/scheduling.md §4.4): a snapshot, never an average.

    Reduction across ranks: ``max``. The queue is one global object, so ranks that read it see the same size
    (max = that value) and a rank that never updates holds the default 0, which cannot win over a real size
    (sizes are >= 0): logging from rank 0 only still reports rank 0's value on every rank.

    ``full_state_update = True``: ``forward()`` must not merge the batch value into the running state with the
    ``max`` reduction (that would report the largest value of the cycle, not the last one).
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("value", default=_zero(), dist_reduce_fx="max")

    def update(self, value: Any) -> None:
        """Replace the stored value with ``value`` (>= 0)."""
        v = float(value.item() if hasattr(value, "item") else value)
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"LastValueMetric needs a finite value >= 0, got {value!r}")
        self.value = torch.tensor(v, dtype=f64, device=self.value.device)

    def compute(self) -> torch.Tensor:
        return self.value.clone()


class CounterMetric(Metric):
    """A counter (``fully_async/rollouter/step_generated_samples``, design/scheduling.md §4.5), summed across ranks.

    ``update(n)`` adds ``n`` (default 1); ``reset()`` (Lightning calls it at the end of the logging period, or call
    it at each ``reset_staleness``) starts from 0 again.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("count", default=_zero(), dist_reduce_fx="sum")

    def update(self, n: Any = 1) -> None:
        """Add ``n`` (>= 0) to the count."""
        self.count += as_total(n, "n")

    def compute(self) -> torch.Tensor:
        return self.count.clone()
