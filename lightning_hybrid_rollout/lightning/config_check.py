"""Readable validation of an ``lhr`` YAML file before LightningCLI parses it.

Each mistake (callback arguments and config blocks, ``trainer`` keys, every ``class_path`` and its ``init_args``,
the top-level keys) becomes one line naming the full key path, the value and the fix, instead of jsonargparse's usage
text. Conservative: a value is reported only when jsonargparse would reject it too.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from lightning_hybrid_rollout.agentic.config import AgenticConfig
from lightning_hybrid_rollout.config import (
    AsyncTrainingConfig,
    ConfigError,
    RolloutConfig,
    TinyModelConfig,
    validate_run_config,
)
from lightning_hybrid_rollout.did_you_mean import closest, did_you_mean
from lightning_hybrid_rollout.rewards import RewardConfig
from lightning_hybrid_rollout.run.flat_keys import FLAT_KEYS, moved_key_hint
from lightning_hybrid_rollout.sources.config import DatasetConfig

_CALLBACK_NAMES = ("HybridRolloutCallback",)
_SUBCOMMANDS = ("fit", "validate", "test", "predict")
_TOP_LEVEL_KEYS = ("seed_everything", "trainer", "model", "data", "ckpt_path", "weights_only", "config", "print_config")
_MAX_LISTED = 20  # GRPOModule has 18 arguments: listed in one line (~230 characters)
"""List the valid arguments in an unknown-key message only up to this many (the Trainer has ~40)."""
_YAML_BOOLS = {"true", "false", "yes", "no", "on", "off", "y", "n", "1", "0"}


_suggest = did_you_mean


def _yaml_scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).split("\n")[0]


# --------------------------------------------------------------------------------------------------------------
# Scalar type checks (what jsonargparse would reject)
# --------------------------------------------------------------------------------------------------------------


def _members(tp: Any) -> list[Any]:
    """A union flattened into its members (``[tp]`` for anything else)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [tp]


def _parses(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def _type_ok(value: Any, tp: Any) -> bool | None:
    """True: ``value`` fits ``tp``; False: jsonargparse would reject it; None: cannot tell (left to jsonargparse)."""
    if value is None:
        return None  # jsonargparse accepts null for any argument
    members = _members(tp)
    if len(members) > 1:
        results = [_type_ok(value, m) for m in members]
        if any(r is True for r in results):
            return True
        return False if all(r is False for r in results) else None
    if typing.get_origin(tp) is Literal:
        return any(type(value) is type(choice) and value == choice for choice in typing.get_args(tp))
    if tp is type(None):
        return False
    if tp is bool:
        if isinstance(value, str):
            return None if value.lower() in _YAML_BOOLS else False
        return isinstance(value, bool)
    if tp is int:
        if isinstance(value, str):
            return True if _parses(int, value) else (None if _parses(float, value) else False)
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        if isinstance(value, str):
            return _parses(float, value)
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return None


def _describe(tp: Any) -> str:
    literals: list[Any] = []
    parts: list[str] = []
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    for m in _members(tp):
        if typing.get_origin(m) is Literal:
            literals.extend(typing.get_args(m))
        elif m in names and names[m] not in parts:
            parts.append(names[m])
    if literals:
        parts.insert(0, f"one of {literals}")
    return " or ".join(parts) or "a valid value"


def _fix_hint(name: str, tp: Any, value: Any, default: Any) -> str:
    members = _members(tp)
    literal_strings = [
        str(c) for m in members if typing.get_origin(m) is Literal for c in typing.get_args(m) if isinstance(c, str)
    ]
    if literal_strings and isinstance(value, str):
        hint = _suggest(value, literal_strings).strip()
        if hint:
            return hint
    if members == [bool] or set(members) == {bool, type(None)}:
        return f"Write `{name}: true` or `{name}: false` (no quotes)."
    if default is not inspect.Parameter.empty and default is not None and _type_ok(default, tp):
        return f"Write e.g. `{name}: {_yaml_scalar(default)}` (the default)."
    for kind, example in ((int, 1), (float, 1.0)):
        if kind in members:
            return f"Write a number without quotes, e.g. `{name}: {example}`."
    return "See `lhr fit --help` for the accepted values."


def _init_params(cls: type) -> tuple[dict[str, tuple[Any, Any]], bool]:
    """``({argument: (type or None, default)}, accepts **kwargs)`` of ``cls.__init__``."""
    init = cls.__init__  # type: ignore[misc]
    try:
        sig = inspect.signature(init)
    except (TypeError, ValueError):
        return {}, True
    try:
        hints = typing.get_type_hints(init)
    except Exception:  # a forward reference that only exists under TYPE_CHECKING: resolve per argument below
        hints = {}
    params: dict[str, tuple[Any, Any]] = {}
    var_kw = False
    for i, (name, p) in enumerate(sig.parameters.items()):
        if i == 0 and name in ("self", "cls"):
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        tp = hints.get(name, p.annotation)
        if isinstance(tp, str):
            try:
                tp = eval(tp, getattr(init, "__globals__", {}))  # same resolution as get_type_hints, per argument
            except Exception:
                tp = None
        params[name] = (None if tp is inspect.Parameter.empty else tp, p.default)
    return params, var_kw


def check_init_args(
    where: str, cls: type, init_args: Any, *, skip: tuple[str, ...] = (), unknown_keys: bool = True
) -> list[str]:
    """Problems in the ``init_args`` of a ``class_path`` entry: unknown arguments and scalar values of a wrong type.

    Args:
        where: Key path of the mapping (e.g. ``model.init_args``), used in messages.
        cls: The class the arguments are for.
        init_args: The mapping from the YAML file.
        skip: Arguments checked elsewhere.
        unknown_keys: Also report keys that are not arguments of ``cls.__init__`` (skipped if it takes ``**kwargs``).
    """
    if init_args is None:
        return []
    if not isinstance(init_args, Mapping):
        return [f"{where} must be a mapping of {cls.__name__} arguments, got {init_args!r}."]
    params, var_kw = _init_params(cls)
    valid = list(params)
    problems = []
    if unknown_keys and not var_kw:
        listing = (
            f" Valid arguments: {', '.join(valid)}."
            if len(valid) <= _MAX_LISTED
            else " Run `lhr fit --help` to list them."
        )
        problems.extend(
            f"{where}.{k} is not an argument of {cls.__name__}.{_suggest(str(k), valid)}{listing}"
            for k in init_args
            if k not in params
        )
    for k, value in init_args.items():
        if k in skip or k not in params or params[k][0] is None:
            continue
        tp, default = params[k]
        if _type_ok(value, tp) is False:
            problems.append(
                f"{where}.{k} must be {_describe(tp)}, got {value!r}. {_fix_hint(str(k), tp, value, default)}"
            )
    return problems


# --------------------------------------------------------------------------------------------------------------
# class_path entries
# --------------------------------------------------------------------------------------------------------------


def _public_names(obj: Any) -> list[str]:
    names = [n for n in dir(obj) if not n.startswith("_")]
    if inspect.ismodule(obj) and hasattr(obj, "__path__"):
        names += [m.name for m in pkgutil.iter_modules(obj.__path__) if not m.name.startswith("_")]
    return names


def resolve_class_path(where: str, class_path: Any) -> tuple[type | None, str | None]:
    """``(class, None)``, ``(None, problem)``, or ``(None, None)`` for a short name left to jsonargparse."""
    if not isinstance(class_path, str) or not class_path:
        return (
            None,
            f"{where}.class_path must be a dotted class path such as 'package.module.Class', got {class_path!r}.",
        )
    if "." not in class_path:
        return None, None  # a short name: jsonargparse resolves it among the subclasses it knows
    parts = class_path.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
    except ImportError:
        return None, f"{where}.class_path {class_path!r} cannot be imported: no module named {parts[0]!r}."
    for i, part in enumerate(parts[1:], 1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        prefix = ".".join(parts[: i + 1])
        if inspect.ismodule(obj):
            try:
                obj = importlib.import_module(prefix)
                continue
            except ModuleNotFoundError as err:
                if err.name != prefix:
                    return None, f"{where}.class_path {class_path!r} cannot be imported: {err}."
            except Exception as err:
                return None, f"{where}.class_path {class_path!r} cannot be imported: {type(err).__name__}: {err}"[:500]
        match = closest(part, _public_names(obj))
        hint = f" Did you mean {'.'.join([*parts[:i], match, *parts[i + 1 :]])!r}?" if match else ""
        return None, f"{where}.class_path {class_path!r} does not exist: {'.'.join(parts[:i])!r} has no {part!r}.{hint}"
    if not inspect.isclass(obj):
        return None, f"{where}.class_path {class_path!r} is not a class (got a {type(obj).__name__})."
    return obj, None


def _check_class_entry(where: str, entry: Any) -> list[str]:
    """Problems of one ``{class_path:, init_args:}`` mapping (other shapes are left to jsonargparse)."""
    if not isinstance(entry, Mapping) or "class_path" not in entry:
        return []
    cls, problem = resolve_class_path(where, entry["class_path"])
    if problem:
        return [problem]
    if cls is None:
        return []
    return check_init_args(f"{where}.init_args", cls, entry.get("init_args"))


def _is_hybrid_callback(entry: Mapping[str, Any], cls: type | None) -> bool:
    if cls is None:
        return str(entry.get("class_path", "")).split(".")[-1] in _CALLBACK_NAMES
    from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback

    return issubclass(cls, HybridRolloutCallback) and "rollout" in _init_params(cls)[0]


# --------------------------------------------------------------------------------------------------------------
# HybridRolloutCallback
# --------------------------------------------------------------------------------------------------------------


def check_callback_args(where: str, init_args: Any, cls: type | None = None) -> list[str]:
    """Problems in one ``HybridRolloutCallback`` ``init_args`` mapping (empty when valid).

    Args:
        where: Key path of the mapping, used in messages.
        init_args: The mapping from the YAML file.
        cls: The callback class (``HybridRolloutCallback`` or a subclass with the same arguments).
    """
    from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
    from lightning_hybrid_rollout.tasks import TASKS

    cls = cls or HybridRolloutCallback
    if not isinstance(init_args, Mapping):
        return [f"{where} must be a mapping of {cls.__name__} arguments, got {init_args!r}."]
    sections = {
        "rollout": RolloutConfig,
        "async_training": AsyncTrainingConfig,
        "dataset": DatasetConfig,
        "rewards": RewardConfig,
        "agentic": AgenticConfig,
    }
    problems = check_init_args(where, cls, init_args, skip=(*sections, "task", "build_model"), unknown_keys=False)
    problems.extend(_unknown_callback_keys(where, cls, init_args))
    if "rollout" not in init_args:
        problems.append(f"{where}.rollout is missing: add a `rollout:` block with at least `model_path:`.")
    built: dict[str, Any] = {}
    for key, config_cls in sections.items():  # each section checks itself: this only walks the YAML
        if key not in init_args or (init_args[key] is None and key not in ("rollout", "async_training")):
            continue
        try:
            built[key] = config_cls.from_dict(init_args[key] or {})
        except ConfigError as err:
            problems.extend(f"{where}.{p}" for p in err.problems)
    rollout, async_cfg = built.get("rollout"), built.get("async_training")
    if rollout is not None:
        if not rollout.model_path:
            problems.append(
                f"{where}.rollout.model_path must be set, got ''. Point it at a Hugging Face causal LM directory "
                "(or set build_model: true to build the tiny CPU model there)."
            )
        if async_cfg is not None or "async_training" not in init_args:
            try:
                validate_run_config(async_cfg or AsyncTrainingConfig(), rollout)
            except ConfigError as err:
                problems.extend(f"{where}.{p}" for p in err.problems)
    task = init_args.get("task", "arithmetic")
    if task not in TASKS:
        problems.append(f"{where}.task must be one of {sorted(TASKS)}, got {task!r}.{_suggest(str(task), list(TASKS))}")
    try:
        TinyModelConfig.resolve(init_args.get("build_model", False))
    except ConfigError as err:
        problems.extend(f"{where}.{p}" for p in err.problems)
    return problems


def _unknown_callback_keys(where: str, cls: type, init_args: Mapping[str, Any]) -> list[str]:
    """A key that is no argument: where a flat key of an earlier release moved, or the closest argument."""
    params, _ = _init_params(cls)
    out = []
    for k in init_args:
        if k in params:
            continue
        if k in FLAT_KEYS:
            out.append(f"{where}.{k}: {moved_key_hint(k)}.")
        else:
            out.append(
                f"{where}.{k} is not an argument of {cls.__name__}.{_suggest(str(k), list(params))} "
                f"Valid arguments: {', '.join(params)}."
            )
    return out


# --------------------------------------------------------------------------------------------------------------
# trainer
# --------------------------------------------------------------------------------------------------------------


def _check_strategy(where: str, strategy: Any) -> list[str]:
    if isinstance(strategy, Mapping):
        return _check_class_entry(where, strategy)
    if not isinstance(strategy, str):
        return []
    from lightning.pytorch.strategies import StrategyRegistry

    import lightning_hybrid_rollout.lightning  # noqa: F401  (registers hybrid_* names)

    names = [*StrategyRegistry.available_strategies(), "auto", "ddp", "ddp_spawn", "fsdp", "deepspeed"]
    if strategy in names or "." in strategy:
        return []
    hybrid = sorted(n for n in names if n.startswith("hybrid_"))
    return [
        f"{where} {strategy!r} is not a registered strategy.{_suggest(strategy, names)} "
        f"Hybrid strategies: {', '.join(hybrid)}."
    ]


def _entries(value: Any) -> list[tuple[int, Any]]:
    if isinstance(value, Mapping):
        return [(0, value)]
    if isinstance(value, list):
        return list(enumerate(value))
    return []


def _check_trainer(where: str, trainer: Any) -> list[str]:
    if trainer is None:
        return []
    if not isinstance(trainer, Mapping):
        return [f"{where} must be a mapping of Trainer arguments (accelerator:, devices:, ...), got {trainer!r}."]
    from lightning.pytorch import Trainer

    problems = check_init_args(where, Trainer, trainer, skip=("strategy", "callbacks", "logger", "plugins"))
    problems.extend(_check_strategy(f"{where}.strategy", trainer.get("strategy")))
    for i, entry in _entries(trainer.get("logger")):
        problems.extend(_check_class_entry(f"{where}.logger[{i}]", entry))
    for i, entry in _entries(trainer.get("callbacks")):
        if not isinstance(entry, Mapping) or "class_path" not in entry:
            continue
        cb_where = f"{where}.callbacks[{i}]"
        cls, problem = resolve_class_path(cb_where, entry["class_path"])
        if problem:
            problems.append(problem)
        elif _is_hybrid_callback(entry, cls):
            problems.extend(check_callback_args(f"{cb_where}.init_args", entry.get("init_args") or {}, cls))
        elif cls is not None:
            problems.extend(check_init_args(f"{cb_where}.init_args", cls, entry.get("init_args")))
    return problems


# --------------------------------------------------------------------------------------------------------------
# whole file
# --------------------------------------------------------------------------------------------------------------


def check_config(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Problems of a whole ``lhr`` config mapping (empty when the pre-check finds none).

    Args:
        config: The loaded YAML: ``trainer:``, ``model:``, ``data:``, ... (or ``fit:`` etc. around them, the shape
            of a file given before the subcommand).
        prefix: Prepended to every key path (``"fit."`` inside a subcommand block).
    """
    if not prefix and any(isinstance(config.get(s), Mapping) for s in _SUBCOMMANDS):
        problems = []
        for key, value in config.items():
            if key in _SUBCOMMANDS and isinstance(value, Mapping):
                problems.extend(check_config(value, prefix=f"{key}."))
            elif key != "config":
                problems.append(
                    f"{key} is not a key of an lhr config given before the subcommand. Nest it under one of "
                    f"{', '.join(_SUBCOMMANDS)}."
                )
        return problems
    problems: list[str] = []
    top = [k for k in _TOP_LEVEL_KEYS if k not in ("config", "print_config")]
    for key in config:
        if key in _TOP_LEVEL_KEYS:
            continue
        hint = (
            " The optimizer is configured by the model (e.g. model.init_args.lr)."
            if key in ("optimizer", "lr_scheduler")
            else _suggest(str(key), top)
        )
        problems.append(f"{prefix}{key} is not a top-level key of an lhr config.{hint} Valid keys: {', '.join(top)}.")
    seed = config.get("seed_everything")
    if seed is not None and _type_ok(seed, bool | int) is False:
        problems.append(
            f"{prefix}seed_everything must be an integer or true/false, got {seed!r}. Write e.g. `seed_everything: 0`."
        )
    problems.extend(_check_trainer(f"{prefix}trainer", config.get("trainer")))
    for key in ("model", "data"):
        problems.extend(_check_class_entry(f"{prefix}{key}", config.get(key)))
    problems.extend(_check_model_path(config, prefix))
    return problems


def _check_model_path(config: Mapping[str, Any], prefix: str) -> list[str]:
    """The run's one model directory (see :mod:`~lightning_hybrid_rollout.models.model_path`): one, and present."""
    from lightning_hybrid_rollout.models.model_path import model_path_problems

    trainer = config.get("trainer")
    if not isinstance(trainer, Mapping):
        return []
    model = config.get("model")
    model_args = model.get("init_args") if isinstance(model, Mapping) else None
    module_path = model_args.get("model_path") if isinstance(model_args, Mapping) else None
    problems = []
    for i, entry in _entries(trainer.get("callbacks")):
        if not isinstance(entry, Mapping) or not _is_hybrid_callback(entry, None):
            continue
        args = entry.get("init_args")
        rollout = args.get("rollout") if isinstance(args, Mapping) else None
        rollout_path = rollout.get("model_path") if isinstance(rollout, Mapping) else None
        build_model = args.get("build_model", False)
        if not isinstance(rollout_path, str) or not rollout_path or not isinstance(build_model, bool | Mapping):
            continue  # reported by the callback's checks
        run_dir = args.get("run_dir") or trainer.get("default_root_dir")
        problems.extend(
            model_path_problems(
                rollout_path,
                module_path if isinstance(module_path, str) else None,
                build_model=build_model is not False,
                run_dir=run_dir if isinstance(run_dir, str) else None,
                rollout_key=f"{prefix}trainer.callbacks[{i}].init_args.rollout.model_path",
                module_key=f"{prefix}model.init_args.model_path",
            )
        )
    return problems


def precheck_config_file(path: str | Path) -> None:
    """Validate an ``lhr`` YAML file before jsonargparse does (it reports mistakes much less readably).

    Args:
        path: The YAML file given with ``--config``.

    Raises:
        ConfigError: With one message per problem (full key path, value seen, fix).
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
    problems = check_config(config)
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
