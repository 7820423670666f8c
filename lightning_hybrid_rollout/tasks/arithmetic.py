"""Small addition: ``"3+4="`` → ``"7"`` then the end token (design/notes.md §7: a tiny model learns it in minutes on
CPU)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from lightning_hybrid_rollout.tasks.base import Task


class ArithmeticTask(Task):
    """Addition of two small integers, exact-match reward.

    Args:
        max_operand: Operands are drawn uniformly from ``0..max_operand`` (default 4: 25 distinct prompts, sums 0..8,
            single-digit answers).
        max_response_tokens: ``max_tokens`` for rollouts (answer digits + end token, with slack).
    """

    name = "arithmetic"

    def __init__(self, max_operand: int = 4, max_response_tokens: int = 4) -> None:
        super().__init__(max_response_tokens=max_response_tokens)
        if max_operand < 0:
            raise ValueError(f"ArithmeticTask: max_operand must be >= 0, got {max_operand}")
        self.max_operand = max_operand
        needed = len(str(2 * max_operand)) + 1
        if max_response_tokens < needed:
            raise ValueError(
                f"ArithmeticTask: max_response_tokens={max_response_tokens} cannot hold the longest answer "
                f"({2 * max_operand}) plus the end token; use >= {needed}"
            )

    def sample_problem(self, rng: random.Random) -> dict[str, Any]:
        return {"a": rng.randint(0, self.max_operand), "b": rng.randint(0, self.max_operand)}

    def format_prompt(self, problem: Mapping[str, Any]) -> str:
        return f"{problem['a']}+{problem['b']}="

    def expected_answer(self, problem: Mapping[str, Any]) -> str:
        return str(int(problem["a"]) + int(problem["b"]))

    def random_response(self, rng: random.Random) -> str:
        return str(rng.randint(0, 2 * self.max_operand))

    def __repr__(self) -> str:
        return f"ArithmeticTask(max_operand={self.max_operand}, max_response_tokens={self.max_response_tokens})"
