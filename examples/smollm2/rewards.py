"""The SmolLM2 example's reward, in TRL's calling convention (a TRL reward function works here unchanged).

Named in the YAML as ``examples/smollm2/rewards.py:sum_correct``; ``answer`` is a column of the data file.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+")


def _text(completion: Any) -> str:
    # chat prompts: each completion is [{"role": "assistant", "content": text}]; plain prompts: a string
    return completion[0]["content"] if isinstance(completion, list) else str(completion)


def sum_correct(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 if the last number in the completion equals the answer, else 0.0."""
    scores = []
    for completion, truth in zip(completions, answer):
        numbers = _NUMBER.findall(_text(completion).replace(",", ""))
        scores.append(1.0 if numbers and numbers[-1] == str(truth).strip() else 0.0)
    return scores


def brevity(completions: list[Any], **kwargs: Any) -> list[float]:
    """A small bonus for answers of at most 8 characters (the instruction asks for only the number)."""
    return [1.0 if len(_text(c).strip()) <= 8 else 0.0 for c in completions]
