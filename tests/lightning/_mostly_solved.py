"""For the dynamic-sampling fit: a reward that is constant for about three prompts of four (their groups are all
"correct" at once) and a group filter, by file path, that drops zero-variance groups and records their prompts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Prompt index of every group :func:`keep_varied` dropped in this process, in order.
DROPPED: list[int] = []


def solved(prompt: str) -> bool:
    """About three prompts of four, by a stable hash of the prompt text."""
    return sum(map(ord, prompt)) % 4 != 0


def mostly_solved(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 for every completion of a solved prompt; for the others the parity of the completion's characters."""
    return [1.0 if solved(str(p)) else float(sum(map(ord, str(c))) % 2) for p, c in zip(prompts, completions)]


def keep_varied(samples: Sequence[Any]) -> bool:
    """Keep a group whose rewards differ (the rule of ``filter_groups: true``), recording the prompts dropped."""
    keep = len({float(s.reward) for s in samples}) > 1
    if not keep:
        DROPPED.append(int(samples[0].metadata["lhr_prompt"]["index"]))
    return keep
