"""String transforms: reverse (``"rev:abc="`` → ``"cba"``) and copy (``"copy:abc="`` → ``"abc"``)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from lightning_hybrid_rollout.tasks.base import Task, clean_response


class StringReverseTask(Task):
    """Reverse a short lowercase string.

    Args:
        alphabet: Characters the strings are made of (must be in the tokenizer's vocabulary).
        min_len: Shortest string.
        max_len: Longest string.
        partial_credit: If True, the reward is ``(matching positions + [length correct]) / (len + 1)`` instead of
            exact match (a denser signal; design/notes.md §7 notes pure exact-match RL on copy plateaus).
        max_response_tokens: ``max_tokens`` for rollouts (default: ``max_len + 2``).
    """

    name = "reverse"
    prefix = "rev"

    def __init__(
        self,
        alphabet: str = "abcde",
        min_len: int = 2,
        max_len: int = 4,
        partial_credit: bool = False,
        max_response_tokens: int | None = None,
    ) -> None:
        super().__init__(max_response_tokens=max_response_tokens if max_response_tokens is not None else max_len + 2)
        if not alphabet:
            raise ValueError(f"{type(self).__name__}: alphabet must not be empty")
        if not 1 <= min_len <= max_len:
            raise ValueError(f"{type(self).__name__}: need 1 <= min_len <= max_len, got {min_len}, {max_len}")
        if self.max_response_tokens < max_len + 1:
            raise ValueError(
                f"{type(self).__name__}: max_response_tokens={self.max_response_tokens} cannot hold a "
                f"{max_len}-char answer plus the end token; use >= {max_len + 1}"
            )
        self.alphabet = alphabet
        self.min_len = min_len
        self.max_len = max_len
        self.partial_credit = partial_credit

    def transform(self, s: str) -> str:
        """The string operation this task asks for."""
        return s[::-1]

    def sample_problem(self, rng: random.Random) -> dict[str, Any]:
        n = rng.randint(self.min_len, self.max_len)
        return {"s": "".join(rng.choice(self.alphabet) for _ in range(n))}

    def format_prompt(self, problem: Mapping[str, Any]) -> str:
        return f"{self.prefix}:{problem['s']}="

    def expected_answer(self, problem: Mapping[str, Any]) -> str:
        return self.transform(str(problem["s"]))

    def random_response(self, rng: random.Random) -> str:
        n = rng.randint(self.min_len, self.max_len)
        return "".join(rng.choice(self.alphabet) for _ in range(n))

    def reward(self, sample_text: str, metadata: Mapping[str, Any]) -> float:
        """Exact match (default) or per-position partial credit; see the class docstring."""
        if not self.partial_credit:
            return super().reward(sample_text, metadata)
        if "answer" not in metadata:
            raise KeyError(f"{type(self).__name__}.reward: metadata has no 'answer' (got keys {sorted(metadata)})")
        text, _ = clean_response(sample_text)
        target = str(metadata["answer"])
        hits = sum(1 for i, c in enumerate(target) if i < len(text) and text[i] == c)
        return (hits + (1 if len(text) == len(target) else 0)) / (len(target) + 1)


class CopyTask(StringReverseTask):
    """Copy a short lowercase string (same knobs as :class:`StringReverseTask`)."""

    name = "copy"
    prefix = "copy"

    def transform(self, s: str) -> str:
        return s
