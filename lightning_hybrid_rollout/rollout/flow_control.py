"""Flow control (design/notes.md §3, design/scheduling.md §4.2): the in-flight cap and the admission of prompt groups
under the staleness budget (docs/rollout.md, "Flow control and staleness").
"""

from __future__ import annotations


def in_flight_cap(active_servers: int, concurrent_samples_per_replica: int, max_required_samples: int) -> int:
    """``min(active_servers * concurrent_samples_per_replica, max_required_samples)``."""
    return min(active_servers * concurrent_samples_per_replica, max_required_samples)


def admits_group(
    group_size: int,
    *,
    in_flight: int,
    cap: int,
    queue_size: int,
    queue_maxsize: int,
    staleness_samples: int,
    max_required_samples: int,
) -> bool:
    """Whether a prompt group of ``group_size`` samples may be admitted now."""
    return in_flight < cap and queue_size < queue_maxsize and staleness_samples + group_size <= max_required_samples


def staleness_after_reset(outstanding_samples: int, queue_size: int) -> int:
    """The staleness counter a new parameter version starts with: samples admitted and not yet consumed."""
    return outstanding_samples + queue_size
