"""Environments loaded by path in tests/agentic/test_environments.py: TRL's convention and Gymnasium's."""

from __future__ import annotations

from typing import Any


class CounterEnv:
    """TRL's convention: reset(**row), public methods are tools, get_reward()."""

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.counter = start

    def reset(self, target: int, **kwargs: Any) -> str:
        self.counter, self.target = self.start, target
        return f"Reach {target}."

    def increment(self, by: int) -> int:
        """Increment the counter.

        Args:
            by: How much to add.
        """
        self.counter += by
        return self.counter

    def step(self, message: str) -> str:
        """Echo a message (in TRL's convention a public step() is just a tool).

        Args:
            message: The message.
        """
        return message

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def _private(self) -> None:
        raise AssertionError("never a tool")


class GuessEnv:
    """Gymnasium's text convention, as GEM's environments write it."""

    def __init__(self, secret: int = 3, max_steps: int = 4) -> None:
        self.secret, self.max_steps = secret, max_steps
        self.seen_seed: int | None = None
        self.seen_options: dict[str, Any] | None = None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.seen_seed, self.seen_options, self.steps = seed, options, 0
        return "Guess a number from 1 to 5.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        if action.strip() == str(self.secret):
            return "Correct!", 1.0, True, False, {"steps": self.steps}
        return "Wrong, try again.", -0.1, False, self.steps >= self.max_steps, {}


class SeedOnlyEnv(GuessEnv):
    """reset takes a seed but no options."""

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:  # type: ignore[override]
        self.seen_seed, self.steps = seed, 0
        return "Go.", {}


class FourTupleEnv(GuessEnv):
    """The old Gym API: step returns 4 values."""

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:  # type: ignore[override]
        return "obs", 0.0, False, {}


class NoReset:
    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return "", 0.0, True, False, {}


ENVS = {"guess": GuessEnv, "counter": CounterEnv}


def make(env_id: str, **kwargs: Any) -> Any:
    """A factory function in GEM's style: ``make("guess", secret=2)``."""
    return ENVS[env_id](**kwargs)
