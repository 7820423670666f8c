"""Reward functions loaded by the tests by file path (``tests/rewards/my_rewards.py:<name>``) and by module path.

Not a test module: it holds good and bad reward functions in TRL's convention.
"""

from __future__ import annotations

from typing import Any

NOT_CALLABLE = 3


def reward_len(completions, **kwargs):
    """Exactly as TRL's docs write it (chat completions): prefer completions of 20 characters."""
    return [-abs(20 - len(completion[0]["content"])) for completion in completions]


def accuracy(completions: list[Any], answer: list[Any], **kwargs: Any) -> list[float]:
    """1.0 where the completion text is the answer."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [1.0 if t.strip() == str(a) else 0.0 for t, a in zip(texts, answer)]


def only_named(prompts: Any, completions: Any, completion_ids: Any) -> list[float]:
    """Names TRL's three arguments and takes no **kwargs (fine only while the data set has no other column)."""
    return [0.0] * len(completions)


def needs_judge(completions: Any, judge_url: str, **kwargs: Any) -> list[float]:
    """Requires an argument nobody passes."""
    return [0.0] * len(completions)


def positional_only(completions: Any, /, **kwargs: Any) -> list[float]:
    """Its completions cannot be passed by keyword."""
    return [0.0] * len(completions)


class LengthPenalty:
    """A callable class for ``class_path``: ``-|len - target|`` per completion."""

    def __init__(self, target: int) -> None:
        self.target = target

    def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
        return [-abs(len(c if isinstance(c, str) else c[0]["content"]) - self.target) for c in completions]


class NotCallable:
    """A class whose instances cannot be called."""

    def __init__(self) -> None:
        self.x = 1
