"""Verifiable toy tasks, their reward functions, and a tiny local model/tokenizer builder for CPU runs.

``tiny_model`` imports torch/transformers lazily (only when you call it), so the tasks themselves stay pure Python.
"""

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


def build_tiny_model(*args: Any, **kwargs: Any) -> Any:
    """Lazy re-export of :func:`lightning_hybrid_rollout.tasks.tiny_model.build_tiny_model`."""
    from lightning_hybrid_rollout.tasks.tiny_model import build_tiny_model as _build

    return _build(*args, **kwargs)


def warm_up_format(*args: Any, **kwargs: Any) -> Any:
    """Lazy re-export of :func:`lightning_hybrid_rollout.tasks.tiny_model.warm_up_format`."""
    from lightning_hybrid_rollout.tasks.tiny_model import warm_up_format as _warm

    return _warm(*args, **kwargs)


__all__ = [
    "EOS_TOKEN",
    "SPECIAL_TOKENS",
    "TASKS",
    "ArithmeticTask",
    "CopyTask",
    "StringReverseTask",
    "Task",
    "TaskPrompt",
    "build_tiny_model",
    "clean_response",
    "get_task",
    "warm_up_format",
]
