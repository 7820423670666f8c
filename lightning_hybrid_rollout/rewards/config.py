"""The ``rewards`` section (:class:`RewardConfig`): which reward functions score a finished prompt group and how they
are run (the forms of a ``reward_funcs`` item: docs/workloads.md); bad values are collected into one
:class:`ConfigError`.

Example::

    >>> cfg = RewardConfig(reward_funcs=["math_verify", "my_rewards.py:brevity"], reward_weights=[1.0, 0.1])
    >>> cfg.weights
    [1.0, 0.1]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from lightning_hybrid_rollout.config.base import ConfigBase
from lightning_hybrid_rollout.config.fields import choice, custom, integer, is_real, real
from lightning_hybrid_rollout.did_you_mean import did_you_mean

__all__ = ["BUILTIN_CLASS_NAMES", "BUILTIN_FUNCTION_NAMES", "RewardConfig"]

BUILTIN_FUNCTION_NAMES: tuple[str, ...] = ("math_verify", "exact_match")
"""Short names of the built-in functions, usable as a plain ``reward_funcs`` string (kept here, import-free, so
the config checks names without importing the built-ins; ``builtin.BUILTINS`` holds the objects)."""

BUILTIN_CLASS_NAMES: tuple[str, ...] = ("format",)
"""Short names of the built-in classes, usable as a ``class_path`` (they need ``init_args``)."""

_DICT_KEYS = ("class_path", "init_args")


def _funcs_problems(key: str, funcs: Any) -> list[str]:
    if not isinstance(funcs, list):
        return [f"{key} must be a list, got {funcs!r}. Write one item per function."]
    return [p for i, item in enumerate(funcs) if (p := _item_problem(f"{key}[{i}]", item))]


def _weights_problems(key: str, w: Any, funcs: Any) -> list[str]:
    if not isinstance(w, list) or not all(is_real(x) for x in w):
        return [f"{key} must be a list of finite numbers, got {w!r}. Or leave it unset (1.0)."]
    if isinstance(funcs, list) and len(w) != len(funcs):
        return [
            f"{key} has {len(w)} weights for {len(funcs)} reward_funcs, got {w!r}. "
            "Give one weight per function, in the same order."
        ]
    return []


def _item_problem(key: str, item: Any) -> str | None:
    """The problem of one ``reward_funcs`` item (None if its form is valid; whether it loads is checked later)."""
    if isinstance(item, str):
        spec = item.strip()
        if not spec:
            return f"{key} is an empty string. Give 'package.module:function', 'path/file.py:function' or a built-in."
        if ":" in spec:
            where, _, attr = spec.rpartition(":")
            if not where or not attr.isidentifier():
                return f"{key} must read 'module:function' or 'path/file.py:function', got {item!r}."
            return None
        if spec.endswith(".py"):
            return f"{key} names a file but no function, got {item!r}. Write '{spec}:function_name'."
        if "." in spec or spec in BUILTIN_FUNCTION_NAMES:
            return None
        if spec in BUILTIN_CLASS_NAMES:
            return (
                f"{key} is the built-in class {spec!r}, which needs arguments: write "
                f"{{class_path: {spec}, init_args: {{...}}}}."
            )
        hint = did_you_mean(spec, BUILTIN_FUNCTION_NAMES)
        return (
            f"{key} is not a built-in reward, got {item!r}.{hint} Built-ins: {', '.join(BUILTIN_FUNCTION_NAMES)}; "
            "or give 'package.module:function'."
        )
    if isinstance(item, Mapping):
        unknown = [k for k in item if k not in _DICT_KEYS]
        if unknown or not isinstance(item.get("class_path"), str) or not item["class_path"].strip():
            return f"{key} must be {{class_path: package.module.Class, init_args: {{...}}}}, got {dict(item)!r}." + (
                f" Unknown keys: {', '.join(map(str, unknown))}." if unknown else ""
            )
        if not isinstance(item.get("init_args", {}), Mapping):
            return f"{key}.init_args must be a mapping of constructor arguments, got {item['init_args']!r}."
        return None
    return f"{key} must be a string or a {{class_path, init_args}} mapping, got {type(item).__name__} {item!r}."


@dataclass
class RewardConfig(ConfigBase):
    """The ``rewards`` section: reward functions in TRL's calling convention, run in a worker pool.

    Each function is called once per finished prompt group as
    ``fn(prompts=..., completions=..., completion_ids=..., **columns)`` (one list entry per completion, columns being
    the data set's other fields) and returns one float, or ``None`` ("does not apply"), per completion. A sample's
    reward is the weighted sum over the functions that did not return ``None`` for it (0.0 if all did).
    """

    SECTION: ClassVar[str] = "rewards"

    reward_funcs: list[str | dict[str, Any]] = custom(
        default_factory=list,
        requirement="a list of 'module:function', 'path/file.py:function', built-in names or {class_path, init_args}",
        check=lambda cfg, key, value: _funcs_problems(key, value),
    )
    """Reward functions, in order: ``"package.module:function"``, ``"path/to/file.py:function"`` (relative to the
    current directory), a built-in name (``math_verify``, ``exact_match``), or ``{class_path: package.module.Class,
    init_args: {...}}`` for a callable class (``class_path: format`` is the built-in regex format reward). Empty:
    the task's own reward is used."""

    reward_weights: list[float] | None = custom(
        None,
        nullable=True,
        requirement="a list of finite numbers, one per reward function",
        check=lambda cfg, key, value: _weights_problems(key, value, cfg.reward_funcs),
    )
    """One weight per reward function (a sample's reward is the weighted sum). ``None``: 1.0 each."""

    reward_workers: int = integer(1, at_least=1, fix="Use 1 or more.")
    """Size of the worker pool the reward functions run in (off the rollouter's event loop). Calls beyond it
    wait for a free worker; the functions of one group run concurrently up to this many."""

    reward_pool: Literal["thread", "process"] = choice(
        "thread", ("thread", "process"), fix="'thread' for I/O-bound functions, 'process' for CPU-bound ones."
    )
    """``thread``: a thread pool (cheap; right for functions that release the GIL or wait on I/O, e.g. a remote
    judge). ``process``: a pool of spawned processes (true parallelism for CPU-bound scoring); each worker loads
    the functions again from their ``reward_funcs`` item, so they must be importable from the current directory,
    and their inputs and results must be picklable."""

    reward_timeout_s: float = real(60.0, above=0.0, fix="E.g. 60 (seconds).")
    """Longest one call (one function on one group) may run, in seconds, counted from when it gets a worker. A
    timed-out call frees its group, not its worker: a thread cannot be killed (a stuck one keeps its worker until
    it returns); a process pool's workers are terminated when the run closes."""

    reward_error: Literal["fail", "zero"] = choice(
        "fail", ("fail", "zero"), fix="'fail' stops the run on a failed call, 'zero' scores it 0."
    )
    """What a failed call does (raised, timed out, returned NaN/inf, a non-number or the wrong number of values):
    ``fail`` stops the run with the function's name and the prompt index; ``zero`` scores that function 0.0 on
    every sample of the group, counts it in ``train/reward_errors`` and logs each kind of failure once per
    function at WARNING (repeats at DEBUG)."""

    @property
    def weights(self) -> list[float]:
        """The weight of each function: :attr:`reward_weights`, or 1.0 each."""
        if self.reward_weights is None:
            return [1.0] * len(self.reward_funcs)
        return [float(w) for w in self.reward_weights]
