"""Readable validation of an ``lhr`` YAML file before LightningCLI parses it.

jsonargparse reports a bad value deep inside a callback's nested dataclass as a page of union-type diagnostics.
This module checks the parts users edit most (the ``HybridRolloutCallback`` section, its ``rollout`` and
``async_training`` blocks, the strategy name) with the config classes' own validation, so each mistake produces one
line naming the key, the value seen and the fix.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from lightning_hybrid_rollout.config import AsyncTrainingConfig, ConfigError, RolloutConfig, validate_run_config

_CALLBACK_NAMES = ("HybridRolloutCallback",)


def _suggest(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _callback_entries(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    trainer = config.get("trainer") or {}
    callbacks = trainer.get("callbacks") if isinstance(trainer, Mapping) else None
    if callbacks is None:
        return []
    if isinstance(callbacks, Mapping):
        callbacks = [callbacks]
    out = []
    for i, cb in enumerate(callbacks):
        if isinstance(cb, Mapping) and str(cb.get("class_path", "")).split(".")[-1] in _CALLBACK_NAMES:
            init_args = cb.get("init_args") or {}
            out.append((f"trainer.callbacks[{i}].init_args", init_args))
    return out


def check_callback_args(where: str, init_args: Any) -> list[str]:
    """Problems in one ``HybridRolloutCallback`` ``init_args`` mapping (empty when valid).

    Args:
        where: Key path of the mapping, used in messages.
        init_args: The mapping from the YAML file.
    """
    from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
    from lightning_hybrid_rollout.tasks import TASKS

    if not isinstance(init_args, Mapping):
        return [f"{where} must be a mapping of HybridRolloutCallback arguments, got {init_args!r}."]
    valid = [p for p in inspect.signature(HybridRolloutCallback.__init__).parameters if p != "self"]
    problems = [
        f"{where}.{k} is not an argument of HybridRolloutCallback.{_suggest(str(k), valid)} "
        f"Valid arguments: {', '.join(valid)}."
        for k in init_args
        if k not in valid
    ]
    if "rollout" not in init_args:
        problems.append(f"{where}.rollout is missing: add a `rollout:` block with at least `model_path:`.")
    rollout = async_cfg = None
    for key, cls in (("rollout", RolloutConfig), ("async_training", AsyncTrainingConfig)):
        if key not in init_args:
            continue
        try:
            value = cls.from_dict(init_args[key] or {})
        except ConfigError as err:
            problems.extend(f"{where}.{p}" if not p.startswith(where) else p for p in err.problems)
            continue
        if key == "rollout":
            rollout = value
        else:
            async_cfg = value
    if rollout is not None:
        if not rollout.model_path:
            problems.append(
                f"{where}.rollout.model_path must be set, got ''. Point it at a Hugging Face causal LM directory "
                "(or set build_model: true to build the tiny CPU model there)."
            )
        try:
            validate_run_config(async_cfg or AsyncTrainingConfig(), rollout)
        except ConfigError as err:
            problems.extend(f"{where}.{p}" for p in err.problems)
    task = init_args.get("task", "arithmetic")
    if task not in TASKS:
        problems.append(f"{where}.task must be one of {sorted(TASKS)}, got {task!r}.{_suggest(str(task), list(TASKS))}")
    steps = init_args.get("format_warmup_steps", 0)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        problems.append(f"{where}.format_warmup_steps must be an integer >= 0, got {steps!r}. Use 0 to disable it.")
    return problems


def _check_strategy(config: Mapping[str, Any]) -> list[str]:
    trainer = config.get("trainer") or {}
    strategy = trainer.get("strategy") if isinstance(trainer, Mapping) else None
    if not isinstance(strategy, str):
        return []
    from lightning.pytorch.strategies import StrategyRegistry

    import lightning_hybrid_rollout.lightning  # noqa: F401  (registers hybrid_* names)

    names = [*StrategyRegistry.available_strategies(), "auto", "ddp", "ddp_spawn", "fsdp", "deepspeed"]
    if strategy in names or "." in strategy:
        return []
    hybrid = sorted(n for n in names if n.startswith("hybrid_"))
    return [
        f"trainer.strategy {strategy!r} is not a registered strategy.{_suggest(strategy, names)} "
        f"Hybrid strategies: {', '.join(hybrid)}."
    ]


def precheck_config_file(path: str | Path) -> None:
    """Validate the parts of an ``lhr`` YAML file that jsonargparse reports poorly.

    Args:
        path: The YAML file given with ``--config``.

    Raises:
        ConfigError: With one message per problem (key, value seen, fix).
    """
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--config {str(p)!r}: no such file.")
    try:
        config = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {str(p)!r} is not valid YAML: {err}") from None
    if config is None:
        return
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"--config {str(p)!r} must hold a mapping (trainer:, model:, data:), got {type(config).__name__}."
        )
    problems: list[str] = []
    for where, init_args in _callback_entries(config):
        problems.extend(check_callback_args(where, init_args))
    problems.extend(_check_strategy(config))
    if problems:
        raise ConfigError(problems)


def config_paths(args: list[str]) -> list[str]:
    """The files given with ``--config``/``-c`` in ``args``."""
    out = []
    for i, a in enumerate(args):
        if a in ("--config", "-c") and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith("--config="):
            out.append(a.split("=", 1)[1])
    return out
