"""The ``dataset`` section (:class:`DatasetConfig`): where the prompts come from and how they are drawn and rendered
(docs/workloads.md); bad values are collected into one :class:`ConfigError`, one line each.

Example::

    >>> cfg = DatasetConfig.from_dict({"path": "data/train.jsonl", "val_split": 0.1})
    >>> cfg.prompt_column, cfg.shuffle
    ('prompt', True)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ConfigError

__all__ = ["DatasetConfig", "suggest"]


#: The package's one "did you mean" (:func:`~lightning_hybrid_rollout.did_you_mean.did_you_mean`).
suggest = did_you_mean


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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


@dataclass
class DatasetConfig:
    """The ``dataset`` section: a prompt data set (local or on the hub), how it is drawn (shuffle, epochs) and held
    out."""

    SECTION: ClassVar[str] = "dataset"

    path: str | list[str]
    """A local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file, a list of files of one format (read in order,
    as one data set), a directory written by ``datasets.Dataset.save_to_disk`` (of a ``DatasetDict`` too: its
    ``train_split`` is used), or a hub data set id such as ``openai/gsm8k`` (fetched into the Hugging Face cache once,
    read from it offline with ``HF_HUB_OFFLINE=1``)."""

    name: str | None = None
    """The configuration (subset) of a hub data set, as ``load_dataset(path, name)``, e.g. ``main`` for
    ``openai/gsm8k``; ``null``: its default one."""

    revision: str | None = None
    """Branch, tag or commit of a hub data set (``null``: its default branch); ignored for local files."""

    train_split: str = "train"
    """The split of a hub data set (or of a saved ``DatasetDict``) the training rows come from."""

    test_split: str = "test"
    """The split of a hub data set given as ``val_path`` that validation reads."""

    prompt_column: str = "prompt"
    """The column holding each row's prompt: a string, or a list of chat messages ``{"role", "content"}``. Every
    other column reaches the reward functions as a keyword argument of the same name."""

    system_prompt: str | None = None
    """A system message prepended to every prompt that goes through the chat template, unless the row's messages
    already start with one (the row's own wins). Plain prompts only get it with ``chat_template: true``."""

    chat_template: bool | None = None
    """``null``: apply the tokenizer's chat template to message-list prompts only (plain strings are tokenized as
    they are); ``true``: also wrap plain strings as one user message; ``false``: never (message lists are then an
    error)."""

    shuffle: bool = True
    """Visit the rows in a new random order every epoch (a permutation seeded by ``(seed, epoch)``, so a resumed
    run draws the same order); ``false``: file order every epoch."""

    seed: int | None = None
    """Seed of the shuffles and of the ``val_split`` hold-out; ``null``: the run's seed."""

    val_path: str | list[str] | None = None
    """Held-out prompts for validation, in the same forms as ``path``. Exclusive with ``val_split``."""

    val_split: float | int | None = None
    """Hold out rows of ``path`` for validation: a fraction in (0, 1) or a number of rows, drawn by ``seed`` (never
    also drawn for training). Exclusive with ``val_path``."""

    num_epochs: int | None = None
    """Passes over the training rows before the source ends; ``null``: endless (training stops on ``max_steps``)."""

    def __post_init__(self) -> None:
        self.path = _as_path(self.path)
        self.val_path = _as_path(self.val_path)
        problems: list[str] = []

        def bad(key: str, requirement: str, value: Any, fix: str) -> None:
            problems.append(f"{self.SECTION}.{key} must be {requirement}, got {value!r}. {fix}")

        if not _paths_ok(self.path):
            bad("path", "a file or directory path, or a non-empty list of files", self.path, "E.g. 'data/train.jsonl'.")
        if not isinstance(self.prompt_column, str) or not self.prompt_column:
            bad("prompt_column", "a column name", self.prompt_column, "E.g. 'prompt' (the default).")
        for key in ("name", "revision"):
            if getattr(self, key) is not None and (not isinstance(getattr(self, key), str) or not getattr(self, key)):
                bad(key, "null or a non-empty string", getattr(self, key), "E.g. 'main'.")
        for key in ("train_split", "test_split"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                bad(key, "a split name", getattr(self, key), "E.g. 'train' or 'test'.")
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            bad("system_prompt", "null or a string", self.system_prompt, "E.g. 'You are a careful solver.'")
        if not isinstance(self.chat_template, (bool, type(None))):
            bad("chat_template", "null, true or false", self.chat_template, "Use null to template chat prompts only.")
        elif self.chat_template is False and self.system_prompt is not None:
            bad(
                "system_prompt",
                "null when chat_template is false",
                self.system_prompt,
                "A system prompt needs the chat template: set chat_template to null or true, or drop system_prompt.",
            )
        if not isinstance(self.shuffle, bool):
            bad("shuffle", "a bool", self.shuffle, "Write `shuffle: true` or `shuffle: false` (no quotes).")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            bad("seed", "null or an integer >= 0", self.seed, "Use null to follow the run's seed.")
        if self.val_path is not None and not _paths_ok(self.val_path):
            bad("val_path", "null, a path or a non-empty list of files", self.val_path, "E.g. 'data/val.jsonl'.")
        if self.val_split is not None:
            fraction_ok = isinstance(self.val_split, float) and 0.0 < self.val_split < 1.0
            count_ok = _is_int(self.val_split) and self.val_split >= 1
            if not (fraction_ok or count_ok):
                bad(
                    "val_split",
                    "null, a fraction in (0, 1) or a row count >= 1",
                    self.val_split,
                    "E.g. 0.05 (5% of the rows) or 200 (rows).",
                )
            elif self.val_path is not None:
                bad(
                    "val_split",
                    "null when val_path is set",
                    self.val_split,
                    "Hold out rows either from a file (val_path) or from path (val_split), not both.",
                )
        if self.num_epochs is not None and (not _is_int(self.num_epochs) or self.num_epochs < 1):
            bad("num_epochs", "null or an integer >= 1", self.num_epochs, "Use null for an endless stream.")
        if problems:
            raise ConfigError(problems)

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys this section accepts, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DatasetConfig:
        """Build from a mapping (e.g. a YAML section); unknown keys are refused with the closest valid one.

        Args:
            data: ``{field: value}``; ``path`` is required.

        Raises:
            ConfigError: an unknown or missing key, or an invalid value.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{cls.SECTION} must be a mapping of keys to values, got {data!r}.")
        valid = cls.field_names()
        unknown = [k for k in data if k not in valid]
        if unknown:
            raise ConfigError(
                [f"{cls.SECTION} has no key {k!r}.{suggest(k, valid)} Valid keys: {', '.join(valid)}." for k in unknown]
            )
        if "path" not in data:
            raise ConfigError(f"{cls.SECTION}.path is missing. Give the prompt file, e.g. path: data/train.jsonl.")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """A plain ``dict`` that :meth:`from_dict` accepts back."""
        return dataclasses.asdict(self)
