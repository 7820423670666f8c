"""A Gymnasium-style text environment where the environment's feedback helps: guess a secret number from 1 to 8 in
at most a few tries; after each wrong guess the environment says "higher" or "lower". Reward 1.0 for a correct guess
(first try or later), 0 otherwise, so an episode that reads the feedback and guesses again can still earn it."""

from __future__ import annotations

import random
import re
from typing import Any


class GuessNumber:
    """``reset(seed=, options=)`` draws the secret from the seed; ``step(text)`` reads the first integer in it.

    Args:
        low: The smallest secret.
        high: The largest secret.
    """

    def __init__(self, low: int = 1, high: int = 8) -> None:
        self.low, self.high = low, high
        self.secret = low

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.secret = random.Random(seed).randint(self.low, self.high)
        prompt = (
            f"I picked a whole number from {self.low} to {self.high}. Guess it: answer with the number only. "
            "After a wrong guess I will say higher or lower."
        )
        return prompt, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        found = re.search(r"-?\d+", action)
        if found is None:
            return "Answer with a number only.", 0.0, False, False, {}
        guess = int(found.group())
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        return ("Higher." if guess < self.secret else "Lower."), 0.0, False, False, {}
