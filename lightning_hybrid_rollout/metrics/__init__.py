"""The seed's ``dynamic_resource/*`` metrics (design/scheduling.md §4): pure formulas plus torchmetrics classes.

Two layers:

* **Pure functions** (no torch): the seed's formulas, written once and shared by the runtime (callback,
  rollouter) and the simulator. Importing this module does not import torch.
* **torchmetrics classes** built on those functions (:mod:`.torch_metrics`, module-level classes), loaded on
  first attribute access through the package's ``__getattr__`` (so ``from lightning_hybrid_rollout.metrics import
  TrainResourceUtilization`` imports torch and torchmetrics, ``import lightning_hybrid_rollout.metrics`` does not).
  Every ratio is reduced *sum-then-divide*: numerator and denominator are separate ``dist_reduce_fx="sum"``
  states, the ratio is taken once on the pooled totals. ``LightningModule.log(ratio_tensor, sync_dist=True)``
  would average per-rank ratios instead, which is not the seed's formula.

Formulas (design/scheduling.md §4; ``a`` = hybrid devices, ``b`` = standalone devices):

* ``U_train = Σ compute_i / Σ alloc_i`` over the cycle's micro fit-steps (sum first, ratio once).
* ``U_rollout = Σ_k (t_{k+1}-t_k)·min(cap_k, active_k) / Σ_k (t_{k+1}-t_k)·cap_k`` (intervals with cap 0 skipped).
* ``cap_k = min(servers_k · s, maxReq)``.
* ``x = clip(wait / step, 0, 1)``; ``U_cluster = ((1-x)·a·U_train + (x·a + b)·U_rollout) / (a + b)``.
* ``mq_size``: last value observed in the cycle; ``step_generated_samples``: a counter reset at each param version.

Example::

    >>> from lightning_hybrid_rollout.metrics import train_resource_utilization, rollout_resource_utilization
    >>> train_resource_utilization([3.0, 5.0], [4.0, 6.0])  # (3+5)/(4+6)
    0.8
    >>> rollout_resource_utilization([(0.0, 4, 8), (2.0, 8, 8), (4.0, 0, 8)])  # (2·4 + 2·8)/(2·8 + 2·8)
    0.75
"""

from __future__ import annotations

from typing import Any

from lightning_hybrid_rollout.metrics.formulas import *  # noqa: F403  (the public names and formulas)
from lightning_hybrid_rollout.metrics.formulas import __all__ as __all__

_TORCH_METRIC_NAMES = (
    "TrainResourceUtilization",
    "RolloutResourceUtilization",
    "ClusterResourceUtilization",
    "LastValueMetric",
    "CounterMetric",
)


def __getattr__(name: str) -> Any:
    if name in _TORCH_METRIC_NAMES:
        from lightning_hybrid_rollout.metrics import torch_metrics

        value = getattr(torch_metrics, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_TORCH_METRIC_NAMES))
