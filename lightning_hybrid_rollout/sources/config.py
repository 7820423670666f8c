"""The ``dataset`` section (:class:`DatasetConfig`): where the prompts come from and how they are drawn and rendered
(docs/workloads.md); bad values are collected into one :class:`ConfigError`, one line each.

Example::

    >>> cfg = DatasetConfig.from_dict({"path": "data/train.jsonl", "val_split": 0.1})
    >>> cfg.prompt_column, cfg.shuffle
    ('prompt', True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_hybrid_rollout.config.base import Checker, ConfigBase
from lightning_hybrid_rollout.config.fields import boolean, custom, integer, is_int, text
from lightning_hybrid_rollout.did_you_mean import did_you_mean

__all__ = ["DatasetConfig", "suggest"]


#: The package's one "did you mean" (:func:`~lightning_hybrid_rollout.did_you_mean.did_you_mean`).
suggest = did_you_mean


def _paths_ok(v: Any) -> bool:
    if isinstance(v, str):
        return bool(v)
    return isinstance(v, list) and bool(v) and all(isinstance(p, str) and p for p in v)


def _as_path(v: Any) -> Any:
    """``os.PathLike`` -> ``str`` (also inside a list or tuple); anything else unchanged (checked later)."""
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, (list, tuple)):
        return [os.fspath(p) if isinstance(p, os.PathLike) else p for p in v]
    return v


_PATHS = "a file or directory path, or a non-empty list of files"


@dataclass
class DatasetConfig(ConfigBase):
    """The ``dataset`` section: a prompt data set (local or on the hub), how it is drawn (shuffle, epochs) and held
    out."""

    SECTION: ClassVar[str] = "dataset"

    path: str | list[str] = custom(
        requirement=_PATHS,
        check=lambda cfg, key, value: _paths_problems(
            key, value, "a file or directory path, or a non-empty list of files"
        ),
        fix="Give the prompt file, e.g. path: data/train.jsonl.",
    )
    """A local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file, a list of files of one format (read in order,
    as one data set), a directory written by ``datasets.Dataset.save_to_disk`` (of a ``DatasetDict`` too: its
    ``train_split`` is used), or a hub data set id such as ``openai/gsm8k`` (fetched into the Hugging Face cache once,
    read from it offline with ``HF_HUB_OFFLINE=1``)."""

    name: str | None = text(None, nullable=True, fix="E.g. 'main'.")
    """The configuration (subset) of a hub data set, as ``load_dataset(path, name)``, e.g. ``main`` for
    ``openai/gsm8k``; ``null``: its default one."""

    revision: str | None = text(None, nullable=True, fix="E.g. 'main'.")
    """Branch, tag or commit of a hub data set (``null``: its default branch); ignored for local files."""

    train_split: str = text("train", fix="E.g. 'train' or 'test'.")
    """The split of a hub data set (or of a saved ``DatasetDict``) the training rows come from."""

    test_split: str = text("test", fix="E.g. 'train' or 'test'.")
    """The split of a hub data set given as ``val_path`` that validation reads."""

    prompt_column: str = text("prompt", fix="E.g. 'prompt' (the default).")
    """The column holding each row's prompt: a string, or a list of chat messages ``{"role", "content"}``. Every
    other column reaches the reward functions as a keyword argument of the same name."""

    system_prompt: str | None = text(None, nullable=True, empty_ok=True, fix="E.g. 'You are a careful solver.'")
    """A system message prepended to every prompt that goes through the chat template, unless the row's messages
    already start with one (the row's own wins). Plain prompts only get it with ``chat_template: true``."""

    chat_template: bool | None = boolean(None, nullable=True, fix="Use null to template chat prompts only.")
    """``null``: apply the tokenizer's chat template to message-list prompts only (plain strings are tokenized as
    they are); ``true``: also wrap plain strings as one user message; ``false``: never (message lists are then an
    error)."""

    shuffle: bool = boolean(True)
    """Visit the rows in a new random order every epoch (a permutation seeded by ``(seed, epoch)``, so a resumed
    run draws the same order); ``false``: file order every epoch."""

    seed: int | None = integer(None, at_least=0, nullable=True, fix="Use null to follow the run's seed.")
    """Seed of the shuffles and of the ``val_split`` hold-out; ``null``: the run's seed."""

    val_path: str | list[str] | None = custom(
        None,
        nullable=True,
        requirement="a path or a non-empty list of files",
        check=lambda cfg, key, value: _paths_problems(key, value, "null, a path or a non-empty list of files"),
        fix="E.g. 'data/val.jsonl'.",
    )
    """Held-out prompts for validation, in the same forms as ``path``. Exclusive with ``val_split``."""

    val_split: float | int | None = custom(
        None,
        nullable=True,
        requirement="a fraction in (0, 1) or a row count >= 1",
        check=lambda cfg, key, value: _val_split_problems(key, value),
    )
    """Hold out rows of ``path`` for validation: a fraction in (0, 1) or a number of rows, drawn by ``seed`` (never
    also drawn for training). Exclusive with ``val_path``."""

    num_epochs: int | None = integer(None, at_least=1, nullable=True, fix="Use null for an endless stream.")
    """Passes over the training rows before the source ends; ``null``: endless (training stops on ``max_steps``)."""

    def prepare(self) -> None:
        self.path = _as_path(self.path)
        self.val_path = _as_path(self.val_path)

    def check(self, c: Checker) -> None:
        if self.chat_template is False and self.system_prompt is not None:
            c.add(
                "system_prompt",
                "null when chat_template is false",
                self.system_prompt,
                "A system prompt needs the chat template: set chat_template to null or true, or drop system_prompt.",
            )
        if self.val_split is not None and self.val_path is not None:
            c.add(
                "val_split",
                "null when val_path is set",
                self.val_split,
                "Hold out rows either from a file (val_path) or from path (val_split), not both.",
            )


def _paths_problems(key: str, value: Any, requirement: str) -> list[str]:
    if _paths_ok(value):
        return []
    example = "data/val.jsonl" if key.endswith("val_path") else "data/train.jsonl"
    return [f"{key} must be {requirement}, got {value!r}. E.g. '{example}'."]


def _val_split_problems(key: str, value: Any) -> list[str]:
    if (isinstance(value, float) and 0.0 < value < 1.0) or (is_int(value) and value >= 1):
        return []
    return [
        f"{key} must be null, a fraction in (0, 1) or a row count >= 1, got {value!r}. "
        "E.g. 0.05 (5% of the rows) or 200 (rows)."
    ]
