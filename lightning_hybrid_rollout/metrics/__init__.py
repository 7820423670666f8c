"""The seed's ``dynamic_resource/*`` metrics (design/scheduling.md §4): pure formulas shared by the runtime and the
simulator (importing this module does not import torch), plus torchmetrics classes, loaded on first attribute access,
that reduce every ratio sum-then-divide across ranks (docs/metrics.md).

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
