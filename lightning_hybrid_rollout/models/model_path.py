"""The one model of a run (a directory or a hub id, see ``hub.py``): checked before anything starts.

The trainer's module and the rollout engines must start from the same weights, so a run names its model directory
once, in ``rollout.model_path`` (the module takes it from there when its own ``model_path`` is left out), and a
second, different name is refused. Every problem is one line naming the key(s) and the fix, raised before Ray or an
engine starts, and before anything is written:

- ``build_model: false``: the directory must exist and hold a ``config.json``;
- ``build_model: true``: the tiny model is only built inside the run's directory (``trainer.default_root_dir`` or the
  callback's ``run_dir``), or into a directory that exists and is empty (created by the user on purpose); a
  directory that already holds a model is used as it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.hub import is_hub_id

ROLLOUT_KEY = "rollout.model_path"
MODULE_KEY = "model.init_args.model_path"


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def same_model_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two spellings name the same directory (``runs/x`` and ``./runs/x/`` do)."""
    return _resolved(a) == _resolved(b)


def model_path_problems(
    rollout_path: str,
    module_path: str | None,
    build_model: bool,
    run_dir: str | os.PathLike[str] | None,
    rollout_key: str = ROLLOUT_KEY,
    module_key: str = MODULE_KEY,
    check_disk: bool = True,
) -> list[str]:
    """Problems with a run's model directory (empty when it is fine); nothing is touched on disk.

    Args:
        rollout_path: ``rollout.model_path`` (the engines' model).
        module_path: The module's own ``model_path`` (None when left out: it takes ``rollout_path``).
        build_model: Whether the tiny CPU model may be built at ``rollout_path``.
        run_dir: The run's directory (``trainer.default_root_dir`` or the callback's ``run_dir``; None: the working
            directory, Lightning's default).
        rollout_key: Key path of ``rollout_path`` in messages.
        module_key: Key path of ``module_path`` in messages.
        check_disk: Also check the directory itself (False: only that both names agree).
    """
    if not rollout_path:
        return []  # reported by the config's own validation
    if module_path is not None and str(module_path) and not same_model_path(module_path, rollout_path):
        return [
            f"{module_key} {str(module_path)!r} and {rollout_key} {rollout_path!r} name different models, but the "
            f"trainer and the engines must start from the same weights: drop {module_key} (the module then takes "
            f"{rollout_key}) or make them equal."
        ]
    path = _resolved(rollout_path)
    if not check_disk or (path / "config.json").is_file():
        return []
    if not build_model and is_hub_id(rollout_path):
        return []  # a hub id: resolved, and any problem with it reported, by the callback's setup on each node
    if not build_model:
        what = "does not exist" if not path.exists() else "has no config.json"
        return [
            f"{rollout_key} {rollout_path!r} {what}: point it at a Hugging Face model directory (config.json, "
            "weights, tokenizer) or a hub id (org/name), or set build_model: true to build the tiny CPU model there."
        ]
    if path.exists() and not path.is_dir():
        return [f"{rollout_key} {rollout_path!r} is a file, not a directory: point it at a directory to build into."]
    root = _resolved(run_dir if run_dir is not None else os.getcwd())
    inside = path == root or root in path.parents
    empty_dir = path.is_dir() and not any(path.iterdir())
    if not inside and not empty_dir:
        return [
            f"{rollout_key} {rollout_path!r} is outside the run's directory {str(root)!r}, so build_model: true "
            "will not write there: use a path inside the run's directory (e.g. "
            f"{str(root / 'model')!r}), or create {rollout_path!r} as an empty directory first."
        ]
    return []


def take_model_path(
    module: Any,
    rollout_path: str,
    build_model: bool,
    run_dir: str | os.PathLike[str] | None,
    check_disk: bool = True,
) -> None:
    """One model directory for the module and the engines, checked before anything starts (the callback's ``setup``).

    A module with a ``model_path`` hyperparameter left as None (and no ``model`` of its own) takes ``rollout_path``;
    a different one is refused, as is (``check_disk``, for ``fit``) a directory without a model or a build outside
    the run's directory: one :class:`~lightning_hybrid_rollout.errors.ConfigError` with
    :func:`model_path_problems`' lines, the module's key named ``ClassName(model_path=...)``.

    Args:
        module: The LightningModule (its ``hparams``, if it has any, may get ``model_path`` set).
        rollout_path: ``rollout.model_path``.
        build_model: Whether the tiny CPU model may be built at ``rollout_path``.
        run_dir: The run's directory (the callback's ``run_dir`` or ``trainer.default_root_dir``).
        check_disk: Also check the directory itself (False: only that both names agree).
    """
    hparams = getattr(module, "hparams", None)
    has_path = hparams is not None and "model_path" in hparams
    module_path = hparams["model_path"] if has_path else None
    if has_path and module_path is None and getattr(module, "model", None) is None:
        hparams["model_path"] = rollout_path
    problems = model_path_problems(
        rollout_path,
        module_path,
        build_model=build_model,
        run_dir=run_dir,
        module_key=f"{type(module).__name__}(model_path=...)",
        check_disk=check_disk,
    )
    if problems:
        raise ConfigError(problems)
