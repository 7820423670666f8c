"""StepTimes: one optimizer step's wall times on the trainer's clock (``docs/metrics.md``: ``alloc_i`` and the step's
whole time), read by the run at the step's boundaries."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["StepTimes"]


class StepTimes:
    """One optimizer step's wall times on the trainer (``docs/metrics.md``).

    A step's times run from the previous step's end inside a cycle (what happens between two steps, e.g. a
    checkpoint or validation, is the trainer's turn too), from the step's hook at a cycle's start (and at the first
    step of a fit, resumed mid-cycle or not). At a cycle's first step, ``allocated_s`` runs from asking for the batch
    and ``step_s`` from the hook, the deactivation included.

    Args:
        clock: The clock every reading comes from (the callback's).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._begin = self._alloc_start = self._last_end = 0.0
        self._fresh = True
        #: When the step's training began (after the deactivation and the onload).
        self.start = 0.0
        #: Seconds the step waited for its batch (set by the batch source).
        self.fetch_s = 0.0

    def begin(self, cycle_start: bool) -> None:
        """At the step's hook, before the deactivation of a cycle's start."""
        self._fresh = cycle_start or not self._last_end
        self._begin = self._clock() if self._fresh else self._last_end

    def start_training(self) -> None:
        """At the end of the step's hook: the batch is asked for from now on."""
        self.start = self._clock()
        self._alloc_start = self.start if self._fresh else self._last_end
        self.fetch_s = 0.0

    def end(self) -> tuple[float, float]:
        """At the step's very end (a cycle's last step: after the sync): ``(allocated_s, step_s)``."""
        now = self._clock()
        self._last_end = now
        return now - self._alloc_start, now - self._begin
