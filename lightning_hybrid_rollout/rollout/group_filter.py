"""Dynamic sampling (DAPO): which finished, rewarded prompt groups the rollouter drops before the queue, and the
per-cycle cap on the generation spent refilling them (docs/workloads.md, "Dynamic sampling").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_hybrid_rollout.rollout.sample import Sample

log = logging.getLogger(__name__)

#: ``samples -> keep``: called once per finished, rewarded group, on the rollouter's loop.
GroupFilterFn = Callable[[Sequence[Sample]], bool]


def rewards_vary(samples: Sequence[Sample]) -> bool:
    """Keep a group only if two of its rewards differ (DAPO's rule: all-equal rewards give every sample a zero
    advantage, so the group carries no learning signal)."""
    return len({float(s.reward) for s in samples}) > 1


@dataclass
class FilterWindow:
    """One parameter version's filtering, returned with the rollouter's window (``reset_staleness``).

    Args:
        finished_groups: Groups finished and rewarded in the window (dropped or not).
        filtered_groups: Groups dropped in the window.
        finished_tokens: Response tokens of the finished groups.
        filtered_tokens: Response tokens of the dropped groups.
        passed_over_cap: Groups the filter would have dropped but let through, the cap being reached.
    """

    finished_groups: int = 0
    filtered_groups: int = 0
    finished_tokens: int = 0
    filtered_tokens: int = 0
    passed_over_cap: int = 0

    @property
    def filtered_fraction(self) -> float:
        """Dropped groups over finished groups (0.0 when none finished)."""
        return self.filtered_groups / self.finished_groups if self.finished_groups else 0.0

    @property
    def accepted_token_share(self) -> float:
        """Share of the window's finished response tokens that reached the queue (1.0 when none finished)."""
        if self.finished_tokens <= 0:
            return 1.0
        return (self.finished_tokens - self.filtered_tokens) / self.finished_tokens


class GroupFilter:
    """Decides per finished group whether the rollouter drops it, within a cap per parameter version.

    Args:
        keep: ``samples -> keep`` (e.g. :func:`rewards_vary`).
        max_filtered_samples: Most samples dropped per parameter version; once reached, groups pass unfiltered
            (one warning per version) until :meth:`close_window`. ``None``: no cap.
        name: Log prefix.
    """

    def __init__(self, keep: GroupFilterFn, max_filtered_samples: int | None = None, name: str = "rollouter") -> None:
        self.keep = keep
        self.max_filtered_samples = max_filtered_samples
        self.name = name
        self._window = FilterWindow()
        self._window_filtered_samples = 0
        self._warned = False

    def drops(self, samples: Sequence[Sample]) -> bool:
        """Whether to drop this finished, rewarded group (counted in the current window either way)."""
        tokens = sum(s.response_length for s in samples)
        w = self._window
        w.finished_groups += 1
        w.finished_tokens += tokens
        if bool(self.keep(samples)):
            return False
        cap = self.max_filtered_samples
        if cap is not None and self._window_filtered_samples + len(samples) > cap:
            w.passed_over_cap += 1
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s: %d samples dropped by the group filter since the last weight sync reach the refill cap "
                    "(%d, rollout.max_num_gen_batches): groups pass unfiltered until the next sync (raise "
                    "max_num_gen_batches, or make the task harder)",
                    self.name,
                    self._window_filtered_samples,
                    cap,
                )
            return False
        w.filtered_groups += 1
        w.filtered_tokens += tokens
        self._window_filtered_samples += len(samples)
        return True

    def close_window(self) -> FilterWindow:
        """The closing parameter version's counts; a new window (and cap) starts now."""
        window, self._window = self._window, FilterWindow()
        self._window_filtered_samples = 0
        self._warned = False
        return window
