"""A Gymnasium-style text environment where the environment's feedback helps: guess a secret number from 1 to 8 in
at most a few tries; after each wrong guess the environment says whether the secret is higher or lower than that guess.
Reward 1.0 for a correct guess (first try or later), 0 otherwise, so an episode that reads the feedback and guesses
again can still earn it. The prompt shows the answer's form (a small model otherwise chats instead of guessing) and
the feedback repeats the guess, so the model need not recall its own earlier turn to use it."""

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
            f"Let's play a game. I picked a whole number from {self.low} to {self.high}. Guess it! "
            f"Reply with one number only, for example: {(self.low + self.high) // 2}"
        )
        return prompt, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        found = re.search(r"-?\d+", action)
        if found is None:
            return "That is not a number. Reply with one number only.", 0.0, False, False, {}
        guess = int(found.group())
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        hint = "higher" if guess < self.secret else "lower"
        return f"No, my number is {hint} than {guess}. Guess again: one number only.", 0.0, False, False, {}
