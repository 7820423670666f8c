"""The rollout utilization history (design/scheduling.md §4.2, §4.5): ``(t, active, cap)`` points, one window per
parameter version, returned in a :class:`RolloutStepStats` by ``Rollouter.reset_staleness``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_hybrid_rollout.rollout.group_filter import FilterWindow

HistoryPoint = tuple[float, int, int]


@dataclass
class RolloutStepStats:
    """One parameter version's rollout window, returned by :meth:`Rollouter.reset_staleness`.

    Args:
        history: ``(t, active, cap)`` points from the window's start to its end (both included); the input of
            ``metrics.rollout_resource_utilization``.
        step_generated_samples: Samples fully generated in the window (design/scheduling.md §4.5).
        admitted_samples: Samples admitted (staleness budget spent) in the window.
        staleness_samples: The staleness counter after the reset (outstanding + queue size).
        param_version: Weight version current when the window closed.
        filtering: The group filter's counts in the window (all 0 without a filter).
    """

    history: list[HistoryPoint]
    step_generated_samples: int
    admitted_samples: int
    staleness_samples: int
    param_version: int
    filtering: FilterWindow = field(default_factory=FilterWindow)


class UtilizationHistory:
    """The current window's ``(t, active, cap)`` points and the last cap recorded.

    Args:
        cap: The in-flight cap before the first point (so a cap change can be told from the first point on).
    """

    def __init__(self, cap: int) -> None:
        self.points: list[HistoryPoint] = []
        self.last_cap = cap

    def append(self, t: float, active: int, cap: int) -> None:
        """Record one point."""
        self.last_cap = cap
        self.points.append((t, active, cap))

    def close_window(self) -> list[HistoryPoint]:
        """The window's points; the next window starts at the last of them."""
        points = self.points
        self.points = [points[-1]]
        return points
