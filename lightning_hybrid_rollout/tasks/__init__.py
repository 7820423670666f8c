"""Verifiable toy tasks and their reward functions, pure Python (the tiny model they train is
:mod:`lightning_hybrid_rollout.models.tiny_model`)."""

from __future__ import annotations

from typing import Any

from lightning_hybrid_rollout.tasks.arithmetic import ArithmeticTask
from lightning_hybrid_rollout.tasks.base import EOS_TOKEN, SPECIAL_TOKENS, Task, TaskPrompt, clean_response
from lightning_hybrid_rollout.tasks.string_ops import CopyTask, StringReverseTask

#: Task name -> class (the names used in configs / the CLI).
TASKS: dict[str, type[Task]] = {
    ArithmeticTask.name: ArithmeticTask,
    StringReverseTask.name: StringReverseTask,
    CopyTask.name: CopyTask,
}


def get_task(name: str, **kwargs: Any) -> Task:
    """Instantiate a task by name.

    Args:
        name: One of :data:`TASKS` (``"arithmetic"``, ``"reverse"``, ``"copy"``).
        **kwargs: Passed to the task's constructor.
    """
    try:
        cls = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; available: {sorted(TASKS)}") from None
    return cls(**kwargs)


__all__ = [
    "EOS_TOKEN",
    "SPECIAL_TOKENS",
    "TASKS",
    "ArithmeticTask",
    "CopyTask",
    "StringReverseTask",
    "Task",
    "TaskPrompt",
    "clean_response",
    "get_task",
]
