"""Fixtures of the reward tests: the repository root as the current directory, groups, and a release switch."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.rewards import GroupRewardInput, RewardFunction

REPO = Path(__file__).resolve().parents[2]
FIXTURE = "tests/rewards/my_rewards.py"


@pytest.fixture(autouse=True)
def in_repo_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Relative reward paths (``tests/rewards/my_rewards.py:...``) are read from the current directory."""
    monkeypatch.chdir(REPO)
    return REPO


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event a stuck reward function waits on; set at teardown so no test leaves a thread behind."""
    event = threading.Event()
    yield event
    event.set()


def make_group(n: int = 4, *, prompt_index: int = 17, chat: bool = True, **columns: Any) -> GroupRewardInput:
    """A group of ``n`` completions ``"7"``, ``"77"``, ... of the prompt ``3+4=`` with ``columns`` broadcast."""
    prompt: Any = [{"role": "user", "content": "3+4="}] if chat else "3+4="
    texts = ["7" * (i + 1) for i in range(n)]
    return GroupRewardInput.from_prompt(prompt_index, prompt, texts, [[7] * (i + 1) for i in range(n)], columns)


def fn_of(fn: Callable[..., Any], name: str | None = None, weight: float = 1.0) -> RewardFunction:
    """A :class:`RewardFunction` for a test's own callable."""
    label = name or fn.__name__
    return RewardFunction(name=label, fn=fn, weight=weight, spec=f"test:{label}")
