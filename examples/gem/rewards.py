"""A format reward for the GEM example (TRL's calling convention): the untrained SmolLM2-135M-Instruct almost never
writes its guess as ``\\boxed{N}``, so GEM's own reward is -0.1 for every episode of a group and GRPO sees no
difference to learn from. This small bonus ranks the misses: a bare number above text without one, ``\\boxed{N}``
above both. Added to GEM's reward (``reward_funcs`` beside an environment), it fades once guesses are boxed.

Named in the YAML as ``examples/gem/rewards.py:guess_format``.
"""

from __future__ import annotations

import re
from typing import Any

_BOXED = re.compile(r"\\boxed\{\d+\}")
_NUMBER = re.compile(r"\d+")


def _text(completion: Any) -> str:
    # chat prompts: each completion is [{"role": "assistant", "content": text}]; plain prompts: a string
    return completion[0]["content"] if isinstance(completion, list) else str(completion)


def guess_format(completions: list[Any], **kwargs: Any) -> list[float]:
    """0.1 if the episode's last model turn writes a guess as ``\\boxed{N}``, 0.05 for a bare number, else 0.0."""
    scores = []
    for completion in completions:
        text = _text(completion)
        scores.append(0.1 if _BOXED.search(text) else 0.05 if _NUMBER.search(text) else 0.0)
    return scores
