"""The prompt-source interface: a checkpointable, endless stream of :class:`PromptRecord` that the rollouter draws
prompts from; its contract (one shared position, exact resume, TRL-style reward functions) is in docs/workloads.md.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: A chat prompt: messages ``{"role": ..., "content": ...}``, in order.
Messages = list[dict[str, str]]

#: A reward function in TRL's convention: ``fn(prompts, completions, completion_ids, **columns)``.
RewardFunc = Callable[..., list[float | None]]


@dataclass(frozen=True)
class PromptRecord:
    """One prompt drawn from a source.

    Args:
        index: The row's position in its data set (a stable id); for toy tasks, the position in its seeded stream.
        prompt: Plain text, or chat messages ``[{"role": ..., "content": ...}, ...]``.
        columns: Every other column of the row; they reach reward functions as keyword arguments.
        epoch: The pass over the data set this record was drawn in (0 for endless streams).

    Example::

        >>> rec = PromptRecord(index=3, prompt=[{"role": "user", "content": "2+2?"}], columns={"answer": "4"})
        >>> rec.is_chat
        True
    """

    index: int
    prompt: str | Messages
    columns: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0

    @property
    def is_chat(self) -> bool:
        """True if :attr:`prompt` is a list of chat messages (False for plain text)."""
        return not isinstance(self.prompt, str)


class PromptSource(ABC):
    """A checkpointable stream of :class:`PromptRecord`, continuing epoch after epoch (see the module docstring).

    Subclasses implement :meth:`__iter__`, :meth:`state_dict`, :meth:`load_state_dict` and :attr:`epoch`; they may
    override :meth:`validation_records`, :meth:`default_reward_funcs`, :attr:`num_rows` and :meth:`preview`.

    Example::

        class Fixed(PromptSource):
            name = "fixed"

            def __init__(self, prompts: list[str]) -> None:
                self.prompts, self.next = prompts, 0

            def __iter__(self):
                while True:
                    i, self.next = self.next, self.next + 1
                    yield PromptRecord(index=i % len(self.prompts), prompt=self.prompts[i % len(self.prompts)])

            def state_dict(self):
                return {"next": self.next}

            def load_state_dict(self, state):
                self.next = state["next"]

            @property
            def epoch(self):
                return self.next // len(self.prompts)
    """

    #: A short name for logs and metrics (e.g. the task name, or the data file's stem).
    name: str = "prompts"

    @abstractmethod
    def __iter__(self) -> Iterator[PromptRecord]:
        """Yield records from the current position on; the position advances as each record is yielded."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The position of the next record to be yielded (plain Python values, fit for a checkpoint)."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Move to the position ``state`` (from :meth:`state_dict`) describes.

        Args:
            state: A dict returned by :meth:`state_dict` of a source built the same way.
        """

    @property
    @abstractmethod
    def epoch(self) -> int:
        """The epoch the next record comes from (= the number of completed passes over the data)."""

    @property
    def num_rows(self) -> int | None:
        """Training records per epoch, or ``None`` for an endless stream without epochs."""
        return None

    def validation_records(self) -> list[PromptRecord]:
        """Held-out prompts (never drawn by :meth:`__iter__`); empty by default."""
        return []

    def default_reward_funcs(self) -> list[RewardFunc]:
        """Reward functions that score this source's prompts when the user names none; empty by default."""
        return []

    def preview(self, limit: int) -> list[PromptRecord]:
        """Up to ``limit`` training records for start-up checks, without moving the stream.

        The default draws them and restores the position with :meth:`state_dict` / :meth:`load_state_dict`;
        sources with random access override it.

        Args:
            limit: The most records to return.
        """
        state = self.state_dict()
        try:
            return list(itertools.islice(iter(self), limit))
        finally:
            self.load_state_dict(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, epoch={self.epoch})"
