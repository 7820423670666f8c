"""The verifiable-task interface: deterministic prompt streams and reward functions.

A task turns a seed into an endless, reproducible stream of :class:`TaskPrompt` (the prompt text plus whatever the
reward function needs, e.g. the expected answer) and scores a decoded response with :meth:`Task.reward`.
Tasks are pure Python (no torch, no tokenizer): tokenization happens in the rollouter.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Special tokens of the tiny char-level tokenizer (:mod:`lightning_hybrid_rollout.models.tiny_model`); stripped
#: from responses before scoring.
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")
EOS_TOKEN = "</s>"


@dataclass(frozen=True)
class TaskPrompt:
    """One problem drawn from a task.

    Args:
        prompt: The prompt text given to the model (already formatted).
        metadata: What :meth:`Task.reward` needs to score a response (e.g. ``{"answer": "7"}``).
        index: Position of this prompt in its seeded stream (stable across runs with the same seed).
    """

    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int = 0


def clean_response(sample_text: str, eos_token: str = EOS_TOKEN) -> tuple[str, bool]:
    """Cut a decoded response at the first end token and drop special tokens.

    Args:
        sample_text: The decoded response (decoded with or without ``skip_special_tokens``).
        eos_token: The end-of-sequence token text.

    Returns:
        ``(text, ended)``: the response text before the end token, and whether an end token was present.
    """
    text = sample_text
    ended = False
    cut = text.find(eos_token)
    if cut >= 0:
        text, ended = text[:cut], True
    for tok in SPECIAL_TOKENS:
        text = text.replace(tok, "")
    return text, ended


class Task(ABC):
    """A verifiable toy task: seeded prompt stream + reward in ``[0, 1]``.

    Subclasses implement :meth:`sample_problem`, :meth:`format_prompt` and :meth:`expected_answer`; the default
    :meth:`reward` is exact match of the cleaned response against the expected answer.

    Args:
        max_response_tokens: A response length (in tokens of the char-level tokenizer) long enough for every answer
            plus the end token; rollouts use it as ``max_tokens``.
    """

    name: str = "task"

    def __init__(self, max_response_tokens: int = 8) -> None:
        if max_response_tokens < 1:
            raise ValueError(f"{type(self).__name__}: max_response_tokens must be >= 1, got {max_response_tokens}")
        self.max_response_tokens = max_response_tokens

    # ---- to implement -------------------------------------------------------------------------------------------
    @abstractmethod
    def sample_problem(self, rng: random.Random) -> dict[str, Any]:
        """Draw the parameters of one problem (e.g. ``{"a": 3, "b": 4}``) from ``rng``."""

    @abstractmethod
    def format_prompt(self, problem: Mapping[str, Any]) -> str:
        """The prompt text for a problem (e.g. ``"3+4="``)."""

    @abstractmethod
    def expected_answer(self, problem: Mapping[str, Any]) -> str:
        """The exact expected response text (without the end token)."""

    @abstractmethod
    def random_response(self, rng: random.Random) -> str:
        """A well-formed but random answer (for the format warm-up: teaches the shape, not the answer)."""

    # ---- provided -------------------------------------------------------------------------------------------------
    def make_prompt(self, problem: Mapping[str, Any], index: int = 0) -> TaskPrompt:
        """Build the :class:`TaskPrompt` of one problem (metadata holds the problem and its ``answer``)."""
        meta = dict(problem)
        meta["answer"] = self.expected_answer(problem)
        meta["task"] = self.name
        return TaskPrompt(prompt=self.format_prompt(problem), metadata=meta, index=index)

    def prompts(self, seed: int = 0, limit: int | None = None) -> Iterator[TaskPrompt]:
        """Deterministic stream of prompts.

        Args:
            seed: Seed of the stream; the same seed always yields the same sequence.
            limit: Stop after this many prompts (``None``: endless).

        Yields:
            :class:`TaskPrompt` items with increasing ``index``.
        """
        rng = random.Random(seed)
        i = 0
        while limit is None or i < limit:
            yield self.make_prompt(self.sample_problem(rng), index=i)
            i += 1

    def sample_prompts(self, n: int, seed: int = 0) -> list[TaskPrompt]:
        """The first ``n`` prompts of the stream for ``seed``."""
        return list(self.prompts(seed=seed, limit=n))

    def reward(self, sample_text: str, metadata: Mapping[str, Any]) -> float:
        """Score a decoded response: 1.0 if it equals the expected answer exactly, else 0.0.

        Args:
            sample_text: The decoded response; anything from the first end token on is ignored, special tokens are
                dropped. A response that reached the length limit without an end token is scored on its text.
            metadata: The prompt's metadata (must hold ``"answer"``).

        Returns:
            A float in ``[0, 1]``.
        """
        if "answer" not in metadata:
            raise KeyError(f"{type(self).__name__}.reward: metadata has no 'answer' (got keys {sorted(metadata)})")
        text, _ = clean_response(sample_text)
        return 1.0 if text == str(metadata["answer"]) else 0.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_response_tokens={self.max_response_tokens})"
