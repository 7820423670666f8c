"""A built-in toy task as a prompt source: :class:`TaskSource`, and its reward in TRL's convention.

The stream is exactly ``task.prompts(seed)`` (the same ``random.Random(seed)`` draws, record ``i`` = the stream's
prompt ``i``), so runs keep the prompts they had before sources existed. The state is the next index plus the
generator's ``random.Random`` state, so a resume continues exactly, in O(1), however far the stream went. The
prompts are plain strings (the tiny char-level model has no chat template); the record's ``columns`` are the task's
metadata (``answer``, ``task``, the problem's parameters).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.rewards.builtin import completion_text
from lightning_hybrid_rollout.sources.base import PromptRecord, PromptSource, RewardFunc
from lightning_hybrid_rollout.sources.config import suggest
from lightning_hybrid_rollout.tasks import TASKS, Task, get_task

__all__ = ["TaskReward", "TaskSource"]


class TaskReward:
    """A task's :meth:`~lightning_hybrid_rollout.tasks.Task.reward` as a TRL-convention reward function.

    Picklable (a plain object, not a closure), named ``<task>_reward``. Each completion is scored with
    ``task.reward(text, metadata)``, the metadata being that sample's value of every per-sample column (a list as
    long as ``completions``); other keyword arguments (e.g. TRL's ``trainer_state``) are ignored.

    Args:
        task: The toy task.

    Example::

        >>> from lightning_hybrid_rollout.tasks import get_task
        >>> fn = TaskReward(get_task("arithmetic"))
        >>> fn(["1+2=", "1+2="], ["3</s>", "4</s>"], None, answer=["3", "3"])
        [1.0, 0.0]
    """

    def __init__(self, task: Task) -> None:
        self.task = task
        self.__name__ = f"{task.name}_reward"

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None, **columns: Any
    ) -> list[float | None]:
        """Score each completion: 1.0 for the exact expected answer, else 0.0."""
        n = len(completions)
        per_sample = {k: v for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == n}
        return [
            self.task.reward(completion_text(c), {k: v[i] for k, v in per_sample.items()})
            for i, c in enumerate(completions)
        ]

    def __repr__(self) -> str:
        return f"TaskReward({self.task!r})"


class TaskSource(PromptSource):
    """An endless, seeded stream of a toy task's prompts (see the module docstring).

    Args:
        task: A task name (``"arithmetic"``, ``"copy"``, ``"reverse"``) or a
            :class:`~lightning_hybrid_rollout.tasks.Task`.
        seed: Seed of the training stream.
        task_kwargs: Constructor arguments of the task (with a name only), e.g. ``{"max_response_tokens": 8}``.
        val_size: Number of held-out prompts :meth:`validation_records` returns.
        val_seed: Seed of the held-out stream (10 000, like ``RolloutDataModule``'s).

    Example::

        >>> source = TaskSource("arithmetic", seed=0)
        >>> rec = next(iter(source))
        >>> rec.index, rec.columns["task"], source.state_dict()["index"]
        (0, 'arithmetic', 1)
    """

    def __init__(
        self,
        task: str | Task,
        *,
        seed: int = 0,
        task_kwargs: Mapping[str, Any] | None = None,
        val_size: int = 64,
        val_seed: int = 10_000,
    ) -> None:
        if isinstance(task, str):
            if task not in TASKS:
                raise ConfigError(
                    f"unknown toy task {task!r}.{suggest(task, TASKS)} Use one of {', '.join(sorted(TASKS))}."
                )
            try:
                task = get_task(task, **dict(task_kwargs or {}))
            except (TypeError, ValueError) as err:
                raise ConfigError(
                    f"task {task!r} does not accept task_kwargs {dict(task_kwargs or {})}: {err}"
                ) from err
        if val_size < 0:
            raise ConfigError(f"TaskSource val_size must be >= 0, got {val_size}. Use e.g. 64 held-out prompts.")
        self.task = task
        self.name = task.name
        self.seed = seed
        self.val_size = val_size
        self.val_seed = val_seed
        self._rng = random.Random(seed)
        self._index = 0

    def _record(self, index: int, rng: random.Random) -> PromptRecord:
        tp = self.task.make_prompt(self.task.sample_problem(rng), index=index)
        return PromptRecord(index=tp.index, prompt=tp.prompt, columns=dict(tp.metadata), epoch=0)

    def __iter__(self) -> Iterator[PromptRecord]:
        """Yield the task's prompts from the current index on, forever."""
        while True:
            index, self._index = self._index, self._index + 1
            yield self._record(index, self._rng)

    @property
    def epoch(self) -> int:
        """Always 0: a task stream has no epochs."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        """``{"task", "index", "rng_state"}``: the next record's index and the generator's state (plain lists)."""
        version, internal, gauss = self._rng.getstate()
        return {"task": self.task.name, "index": self._index, "rng_state": [version, list(internal), gauss]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`).

        Args:
            state: ``{"task", "index", "rng_state"}``.

        Raises:
            DatasetError: the state is malformed or belongs to another task.
        """
        if not {"index", "rng_state"} <= set(state):
            raise DatasetError(f"task source state needs 'index' and 'rng_state', got keys {sorted(state)}")
        if state.get("task", self.task.name) != self.task.name:
            raise DatasetError(
                f"the checkpoint's prompt source is task {state['task']!r}, this run's is {self.task.name!r}; "
                f"resume with the same task, or without the prompt source state"
            )
        version, internal, gauss = state["rng_state"]
        self._rng.setstate((int(version), tuple(int(x) for x in internal), gauss))
        self._index = int(state["index"])

    def validation_records(self) -> list[PromptRecord]:
        """The first ``val_size`` prompts of the stream seeded with ``val_seed``."""
        rng = random.Random(self.val_seed)
        return [self._record(i, rng) for i in range(self.val_size)]

    def default_reward_funcs(self) -> list[RewardFunc]:
        """``[<task>_reward]``: the task's exact-match reward (a :class:`TaskReward`)."""
        return [TaskReward(self.task)]

    def __repr__(self) -> str:
        return f"TaskSource(task={self.task.name!r}, seed={self.seed}, index={self._index})"
