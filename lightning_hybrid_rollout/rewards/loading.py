"""Turn the ``reward_funcs`` items of a :class:`RewardConfig` into checked :class:`RewardFunction` objects.

Everything is resolved and checked before the run starts, and each problem reads as one line naming the item,
what is wrong and how to fix it: a module that does not import (with its error), a missing file, a missing
attribute (with the module's callables and the closest name), something not callable, a ``class_path`` that is not
a class or whose ``init_args`` do not fit, and a signature that TRL's call cannot satisfy (:func:`check_signature`).
All problems of a config are raised together in one :class:`RewardFunctionError`.

Example::

    >>> from lightning_hybrid_rollout.rewards.config import RewardConfig
    >>> [f.name for f in load_reward_functions(RewardConfig(reward_funcs=["exact_match", "exact_match"]))]
    ['exact_match', 'exact_match_2']
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import logging
import re
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import HybridRolloutError, RewardFunctionError
from lightning_hybrid_rollout.rewards.builtin import BUILTINS
from lightning_hybrid_rollout.rewards.config import BUILTIN_CLASS_NAMES, BUILTIN_FUNCTION_NAMES, RewardConfig

__all__ = [
    "TRL_ARGUMENTS",
    "RewardFunction",
    "check_signature",
    "load_reward_functions",
    "resolve_import_path",
    "resolve_reward_item",
    "spec_text",
]

log = logging.getLogger(__name__)

TRL_ARGUMENTS: tuple[str, ...] = ("prompts", "completions", "completion_ids")
"""The keyword arguments every reward function is called with (besides one per data set column)."""


@dataclass(frozen=True)
class RewardFunction:
    """One loaded reward function.

    Args:
        name: Its ``__name__`` (a callable instance: its class name), made unique with ``_2``, ``_3``... when
            repeated; metric keys use it (``train/rewards/<name>_mean``).
        fn: The callable, called as ``fn(prompts=, completions=, completion_ids=, **columns)``.
        weight: Its weight in a sample's reward (the weighted sum).
        spec: The ``reward_funcs`` item as text, for messages (``"my_rewards.py:accuracy"``).
        item: The ``reward_funcs`` item itself; a process pool's workers load the function again from it (``None``:
            the workers get ``fn`` pickled, so it must be importable by its module and name).
    """

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    spec: str = ""
    item: str | Mapping[str, Any] | None = None


def spec_text(item: str | Mapping[str, Any]) -> str:
    """A ``reward_funcs`` item as one line: the string itself, or ``class_path(init_args)`` for a mapping."""
    if isinstance(item, Mapping):
        args = ", ".join(f"{k}={v!r}" for k, v in dict(item.get("init_args") or {}).items())
        return f"{item.get('class_path')}({args})"
    return str(item)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


def _load_file(label: str, where: str, kind: str, error: type[HybridRolloutError]) -> ModuleType:
    path = Path(where).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.is_file():
        raise error(
            f"{kind} {label!r}: file {str(path)!r} not found (a relative path is read from the current "
            f"directory, {str(Path.cwd())!r}); fix the path"
        )
    path = path.resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", path.stem)
    mod_name = f"lhr_reward_file_{stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise error(f"{kind} {label!r}: {str(path)!r} cannot be loaded as Python; use a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses, pickling and relative lookups need the module registered
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:
        del sys.modules[mod_name]
        raise error(f"{kind} {label!r}: file {str(path)!r} does not import: {_one_line(err)}; fix the file") from err
    return module


def _load_module(label: str, where: str, kind: str, error: type[HybridRolloutError]) -> ModuleType:
    try:
        return importlib.import_module(where)
    except (Exception, SystemExit) as err:
        raise error(
            f"{kind} {label!r}: module {where!r} does not import: {_one_line(err)}; check the module name "
            "and that it is installed or on sys.path (or give a file: 'path/to/file.py:function')"
        ) from err


def _callables(module: ModuleType) -> list[str]:
    """The module's public callables, those it defines first (not what it imports)."""
    public = {n: v for n, v in vars(module).items() if not n.startswith("_") and callable(v)}
    own = [n for n, v in public.items() if getattr(v, "__module__", None) == module.__name__]
    return sorted(own or public)


def _resolve_path(
    label: str, path: str, kind: str = "reward function", error: type[HybridRolloutError] = RewardFunctionError
) -> Any:
    """The object ``path`` names: ``module:attr``, ``file.py:attr`` or ``package.module.attr``."""
    if ":" in path:
        where, _, attr = path.rpartition(":")
    elif "." in path:
        where, _, attr = path.rpartition(".")
    else:
        raise error(
            f"{kind} {label!r}: {path!r} names no module; write 'package.module:name' or 'path/to/file.py:name'"
        )
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    module = _load_file(label, where, kind, error) if is_file else _load_module(label, where, kind, error)
    if not hasattr(module, attr):
        names = _callables(module)
        hint = did_you_mean(attr, names)
        shown = ", ".join(names[:15]) + (", ..." if len(names) > 15 else "")
        raise error(f"{kind} {label!r}: {where!r} has no attribute {attr!r}.{hint} Its callables: {shown or 'none'}")
    return getattr(module, attr)


def resolve_import_path(path: str, *, kind: str, error: type[HybridRolloutError]) -> Any:
    """The object an import path names, with the reward functions' rules and one-line errors, for other plug-ins.

    Args:
        path: ``"package.module:name"``, ``"path/to/file.py:name"`` or ``"package.module.name"``.
        kind: How messages name what is loaded (``"tool"``, ``"environment"``).
        error: The exception raised, with one line naming ``kind``, ``path``, what is wrong and the fix.

    Example::

        >>> resolve_import_path("math:sqrt", kind="tool", error=RewardFunctionError).__name__
        'sqrt'
    """
    return _resolve_path(str(path), str(path).strip(), kind, error)


def _instantiate(label: str, cls: type, init_args: Mapping[str, Any]) -> Any:
    try:
        return cls(**init_args)
    except Exception as err:
        try:
            sig = inspect.signature(cls, eval_str=True)
        except Exception:  # an annotation that does not evaluate, or no signature
            sig = None
        sig = str(sig.replace(return_annotation=inspect.Signature.empty)) if sig else "(...)"
        raise RewardFunctionError(
            f"reward function {label!r}: init_args do not fit {cls.__name__}{sig}: {_one_line(err)}; fix init_args"
        ) from err


def resolve_reward_item(item: str | Mapping[str, Any]) -> Callable[..., Any]:
    """The callable one ``reward_funcs`` item names (a built-in, a module or file function, or a class instance).

    Args:
        item: ``"package.module:function"``, ``"path/to/file.py:function"``, ``"package.module.function"``, a
            built-in name, or ``{"class_path": ..., "init_args": {...}}``.

    Raises:
        RewardFunctionError: One line naming the item, what is wrong and the fix.
    """
    label = spec_text(item)
    if isinstance(item, Mapping):
        class_path = str(item.get("class_path", "")).strip()
        if class_path in BUILTIN_FUNCTION_NAMES:
            raise RewardFunctionError(
                f"reward function {label!r}: the built-in {class_path!r} is a function, not a class; write it as the "
                f"plain string {class_path!r}"
            )
        cls = BUILTINS[class_path] if class_path in BUILTIN_CLASS_NAMES else _resolve_path(label, class_path)
        if not inspect.isclass(cls):
            raise RewardFunctionError(
                f"reward function {label!r}: class_path {class_path!r} is a {type(cls).__name__}, not a class; give a "
                f"function as the plain string {class_path!r} instead"
            )
        fn = _instantiate(label, cls, dict(item.get("init_args") or {}))
        if not callable(fn):
            raise RewardFunctionError(
                f"reward function {label!r}: instances of {cls.__name__} are not callable; define "
                f"__call__(self, completions, **kwargs)"
            )
        return fn
    spec = str(item).strip()
    if spec in BUILTIN_FUNCTION_NAMES:
        return BUILTINS[spec]
    if spec in BUILTIN_CLASS_NAMES:
        raise RewardFunctionError(
            f"reward function {label!r}: the built-in {spec!r} is a class that needs arguments; write "
            f"{{class_path: {spec}, init_args: {{...}}}}"
        )
    fn = _resolve_path(label, spec)
    if inspect.isclass(fn):
        raise RewardFunctionError(
            f"reward function {label!r}: {spec!r} is a class; give {{class_path: {spec}, "
            f"init_args: {{...}}}} so an instance is built"
        )
    if not callable(fn):
        raise RewardFunctionError(
            f"reward function {label!r}: {spec!r} is a {type(fn).__name__} ({fn!r:.60}), not callable; point it at "
            f"a function"
        )
    return fn


def check_signature(fn: Callable[..., Any], name: str, columns: Collection[str] | None = None) -> None:
    """Refuse a function that TRL's call ``fn(prompts=, completions=, completion_ids=, **columns)`` cannot satisfy.

    Accepted: every argument passed is either named by a parameter or taken by ``**kwargs``, and every required
    parameter is one of the arguments passed. Refused (the message names the parameter): a required positional-only
    parameter, a required parameter that is none of ``prompts``/``completions``/``completion_ids`` and not a known
    column, an argument passed that the function neither names nor takes by ``**kwargs``. With ``columns=None``
    the columns are unknown: column names are not checked (a missing one fails at call time). A callable whose
    signature cannot be read (some C functions) is accepted.

    Args:
        fn: The callable.
        name: How messages name it (e.g. its ``reward_funcs`` item).
        columns: The data set's column names passed to every call, if known.

    Raises:
        RewardFunctionError: One line naming the function, the parameter and the fix.

    Example::

        >>> check_signature(lambda completions, answer, **kw: [], "f", columns=["answer"])  # accepted
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        log.debug("reward function %r: signature cannot be read; not checked", name)
        return
    kinds = inspect.Parameter
    takes_any = any(p.kind is kinds.VAR_KEYWORD for p in params)
    known = set(TRL_ARGUMENTS) | set(columns or ())
    named = {p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    prefix = f"reward function {name!r}"
    cols = f"the data set's columns ({', '.join(sorted(columns)) or 'none'})" if columns is not None else "a column"
    for p in params:
        required = p.default is p.empty
        if p.kind is kinds.POSITIONAL_ONLY and required:
            raise RewardFunctionError(
                f"{prefix}: parameter {p.name!r} is positional-only, but every argument is passed by keyword; "
                "remove the '/' from its signature"
            )
        if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY) and required and p.name not in known:
            if columns is None:
                continue  # may be a column: checked when the function is called
            raise RewardFunctionError(
                f"{prefix}: parameter {p.name!r} is required but is none of {', '.join(TRL_ARGUMENTS)} or {cols}; "
                "give it a default, rename it after a column, or take it from **kwargs"
            )
    if not takes_any:
        passed = list(TRL_ARGUMENTS) + sorted(columns or ())
        missing = [a for a in passed if a not in named]
        if missing:
            raise RewardFunctionError(
                f"{prefix}: does not accept the keyword argument {missing[0]!r} (it is called with "
                f"{', '.join(passed)}); add **kwargs to its parameters"
            )


def _base_name(fn: Callable[..., Any]) -> str:
    target = fn.func if isinstance(fn, functools.partial) else fn
    raw = getattr(target, "__name__", None) if inspect.isroutine(target) else type(target).__name__
    return re.sub(r"\W+", "_", str(raw or type(target).__name__)).strip("_") or "reward"


def load_reward_functions(cfg: RewardConfig, columns: Collection[str] | None = None) -> list[RewardFunction]:
    """Load and check every reward function of ``cfg``, in order, with its weight and a unique name.

    Args:
        cfg: The ``rewards`` section.
        columns: The data set's column names (every key of a prompt record but the prompt), if known: then a
            function's required parameters are checked against them too (see :func:`check_signature`).

    Raises:
        RewardFunctionError: Every item that does not load or cannot be called TRL's way, one line each.

    Example::

        >>> cfg = RewardConfig(reward_funcs=[{"class_path": "format", "init_args": {"pattern": "[0-9]+"}}])
        >>> load_reward_functions(cfg)[0].name
        'FormatReward'
    """
    problems: list[str] = []
    loaded: list[RewardFunction] = []
    seen: dict[str, int] = {}
    for item, weight in zip(cfg.reward_funcs, cfg.weights, strict=True):
        label = spec_text(item)
        try:
            fn = resolve_reward_item(item)
            check_signature(fn, label, columns)
        except RewardFunctionError as err:
            problems.append(str(err))
            continue
        base = name = _base_name(fn)
        while name in seen:
            seen[base] = seen.get(base, 1) + 1
            name = f"{base}_{seen[base]}"
        seen[name] = 1
        loaded.append(RewardFunction(name=name, fn=fn, weight=weight, spec=label, item=item))
    if len(problems) == 1:
        raise RewardFunctionError(problems[0])
    if problems:
        raise RewardFunctionError(
            f"{len(problems)} reward functions cannot be used:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    for f in loaded:
        log.info("reward function %s = %s (weight %g)", f.name, f.spec, f.weight)
    return loaded
