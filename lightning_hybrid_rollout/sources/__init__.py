"""Prompt sources: where the rollouter's prompts come from (a local data file, a toy task, a class of your own).

* :class:`PromptSource` / :class:`PromptRecord` (:mod:`.base`): the checkpointable stream interface.
* :class:`DatasetSource` + :class:`DatasetConfig` (:mod:`.dataset`, :mod:`.config`): rows of a ``.jsonl`` /
  ``.json`` / ``.parquet`` / ``.csv`` file or a ``save_to_disk`` directory, shuffled per epoch.
* :class:`TaskSource` (:mod:`.task_source`): a built-in toy task, with its reward as a TRL-convention function.
* :class:`PromptRenderer` / :func:`check_prompts_fit` (:mod:`.render`): records to token ids.
* :func:`build_source`: any accepted config form to a source.

Nothing here imports torch, vLLM or Ray; ``datasets`` (and numpy) are imported when a data file is loaded.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.sources.base import Messages, PromptRecord, PromptSource, RewardFunc
from lightning_hybrid_rollout.sources.config import DatasetConfig, suggest
from lightning_hybrid_rollout.sources.dataset import FORMATS, DatasetSource
from lightning_hybrid_rollout.sources.render import (
    PromptFitReport,
    PromptRenderer,
    RenderedPrompt,
    check_prompts_fit,
)
from lightning_hybrid_rollout.sources.task_source import TaskReward, TaskSource
from lightning_hybrid_rollout.tasks import TASKS

__all__ = [
    "DatasetConfig",
    "DatasetSource",
    "Messages",
    "PromptFitReport",
    "PromptRecord",
    "PromptRenderer",
    "PromptSource",
    "RenderedPrompt",
    "RewardFunc",
    "SourceSpec",
    "TaskReward",
    "TaskSource",
    "build_source",
    "check_prompts_fit",
    "load_source_class",
]

#: What :func:`build_source` accepts.
SourceSpec = DatasetConfig | PromptSource | Mapping[str, Any] | str

_CLASS_KEYS = ("class_path", "init_args")


def load_source_class(class_path: str) -> type[PromptSource]:
    """Import ``"pkg.module.Class"`` and check it subclasses :class:`PromptSource`.

    Args:
        class_path: The class's dotted import path.

    Raises:
        ConfigError: it does not import, has no such attribute, or is not a ``PromptSource`` subclass.
    """
    module_name, _, attr = class_path.rpartition(".") if isinstance(class_path, str) else ("", "", "")
    if not module_name or not attr:
        raise ConfigError(f"class_path must be a dotted path like 'my_pkg.sources.MySource', got {class_path!r}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"class_path {class_path!r}: module {module_name!r} does not import ({err}). Install it or put it on "
            f"PYTHONPATH."
        ) from err
    cls = getattr(module, attr, None)
    if cls is None:
        names = [n for n in dir(module) if not n.startswith("_")]
        raise ConfigError(f"class_path {class_path!r}: module {module_name!r} has no {attr!r}.{suggest(attr, names)}")
    if not (inspect.isclass(cls) and issubclass(cls, PromptSource)):
        raise ConfigError(
            f"class_path {class_path!r} is not a PromptSource subclass (got {cls!r}); subclass "
            f"lightning_hybrid_rollout.sources.PromptSource."
        )
    return cls


def _from_class_path(spec: Mapping[str, Any], seed: int) -> PromptSource:
    unknown = [k for k in spec if k not in _CLASS_KEYS]
    if unknown:
        key = unknown[0]
        raise ConfigError(
            f"a class_path source has no key {key!r}.{suggest(key, _CLASS_KEYS)} Valid keys: class_path, init_args."
        )
    cls = load_source_class(spec["class_path"])
    init_args = dict(spec.get("init_args") or {})
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a signature inspect cannot read: pass init_args only
        params = {}
    if "seed" in params and "seed" not in init_args:
        init_args["seed"] = seed
    try:
        return cls(**init_args)
    except TypeError as err:
        raise ConfigError(f"class_path {spec['class_path']!r} refused init_args {init_args}: {err}") from err


def build_source(spec: SourceSpec, *, seed: int, task_kwargs: Mapping[str, Any] | None = None) -> PromptSource:
    """Build the prompt source a config names.

    Accepted forms:

    * a :class:`PromptSource` instance: returned as is;
    * a :class:`DatasetConfig`, or a mapping of its fields (``{"path": "data/train.jsonl", ...}``): a
      :class:`DatasetSource`;
    * ``{"class_path": "pkg.mod.Class", "init_args": {...}}``: that ``PromptSource`` subclass, built with
      ``init_args`` (plus ``seed=seed`` when its constructor takes a ``seed`` that ``init_args`` does not set);
    * a toy task name (``"arithmetic"``, ``"copy"``, ``"reverse"``): a :class:`TaskSource`;
    * any other string ending in a data suffix (``.jsonl``, ``.json``, ``.parquet``, ``.csv``) or naming a
      directory: ``DatasetConfig(path=spec)``.

    Args:
        spec: One of the forms above.
        seed: The run's seed (the stream's seed unless the spec sets its own).
        task_kwargs: Constructor arguments of a toy task (ignored by the other forms).

    Raises:
        ConfigError: an unknown form, key or task name (with the closest valid one), or a bad ``class_path``.
        DatasetError: the data file cannot be used.

    Example::

        >>> build_source("arithmetic", seed=0).name
        'arithmetic'
    """
    if isinstance(spec, PromptSource):
        return spec
    if isinstance(spec, DatasetConfig):
        return DatasetSource(spec, seed=seed)
    if isinstance(spec, Mapping):
        if "class_path" in spec:
            return _from_class_path(spec, seed)
        if "init_args" in spec:
            raise ConfigError("the prompt source has init_args but no class_path; add class_path: pkg.module.Class.")
        return DatasetSource(DatasetConfig.from_dict(spec), seed=seed)
    if isinstance(spec, str):
        if spec in TASKS:
            return TaskSource(spec, seed=seed, task_kwargs=task_kwargs)
        if Path(spec).suffix.lower() in FORMATS or Path(spec).is_dir():
            return DatasetSource(DatasetConfig(path=spec), seed=seed)
        raise ConfigError(
            f"unknown prompt source {spec!r}.{suggest(spec, TASKS)} Give a toy task ({', '.join(sorted(TASKS))}), "
            f"a data file (.jsonl/.json/.parquet/.csv), {{path: ...}} or {{class_path: ..., init_args: ...}}."
        )
    raise ConfigError(
        f"a prompt source must be a task name, a data file path, a dataset mapping, a class_path mapping or a "
        f"PromptSource, got {type(spec).__name__} {spec!r}."
    )
