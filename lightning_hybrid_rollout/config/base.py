"""The config layer's base: the one checker every section reports through (``Checker``), the dataclass base
with ``from_dict``/``to_dict``/field docstrings (``ConfigBase``, :func:`field_docs`), the policy-name and
policy-kwargs checks, and the accepted values of the enumerated fields."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ConfigError

BUILTIN_POLICIES: tuple[str, ...] = ("default", "static_fully_async", "fixed_ratio")
"""The policies registered by ``lightning_hybrid_rollout.schedule`` on import (used only if it cannot be imported)."""

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "auto")
"""Accepted values of :attr:`RolloutConfig.dtype`."""

WEIGHT_TRANSPORTS: tuple[str, ...] = ("auto", "node_shm", "ray", "collective", "cuda_ipc")
"""Accepted values of :attr:`RolloutConfig.weight_transport` (the names of ``rollout/weights/factory.py``)."""

WEIGHT_ENCODINGS: tuple[str, ...] = ("auto", "full", "delta")
"""Accepted values of :attr:`RolloutConfig.weight_encoding` (``rollout/weights/delta.py``)."""


_C = TypeVar("_C", bound="ConfigBase")


# --------------------------------------------------------------------------------------------------------------
# Validation helpers: each appends at most one message per key to `problems`.
# --------------------------------------------------------------------------------------------------------------


_suggest = did_you_mean


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Checker:
    def __init__(self, section: str) -> None:
        self.section = section
        self.problems: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.section}.{name}" if self.section else name

    def add(self, name: str, requirement: str, value: Any, fix: str) -> None:
        self.problems.append(f"{self.key(name)} must be {requirement}, got {value!r}. {fix}")

    def boolean(self, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            self.add(name, "a bool", value, f"Write `{name}: true` or `{name}: false` (no quotes).")

    def integer(self, name: str, value: Any, minimum: int, fix: str) -> None:
        if not is_int(value):
            self.add(name, f"an integer >= {minimum}", value, fix)
        elif value < minimum:
            self.add(name, f">= {minimum}", value, fix)

    def real(
        self, name: str, value: Any, fix: str, *, low: float, high: float = math.inf, low_open: bool = False
    ) -> None:
        if math.isfinite(high):
            interval = f"in {'(' if low_open else '['}{low:g}, {high:g}]"
        else:
            interval = f"> {low:g}" if low_open else f">= {low:g}"
        if not is_real(value) or value > high or value < low or (low_open and value == low):
            self.add(name, f"a number {interval}", value, fix)

    def choice(self, name: str, value: Any, choices: Iterable[str], fix: str) -> None:
        choices = tuple(choices)
        if value not in choices:
            self.add(name, f"one of {list(choices)}", value, fix + _suggest(value, choices))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)


#: The run dir's copy of a fit's ``rollout`` and ``async_training`` settings, written by the callback at the start of a
#: fit beside ``trace.json`` (``lhr simulate --from-run`` reads it when there is no Lightning CLI ``config.yaml``).
RUN_CONFIG_FILE = "hybrid_rollout_config.yaml"

_OWN_KEYS = {"deactivate_ratio": "dynamic_schedule_deactivate_ratio", "only_hybrid": "only_hybrid"}


def policy_kwargs_problems(policy: Any, kwargs: Any) -> list[str]:
    """Problems of ``dynamic_schedule_policy_kwargs`` for ``policy`` (empty when they fit its constructor).

    Each problem reads as the rest of a sentence after the key, e.g. ``"has an unknown argument 'gate_margin' for
    policy rate_matched. Did you mean 'gate_margin_s'? ..."``.
    """
    if not isinstance(kwargs, Mapping):
        return [f"must be a mapping of the policy's constructor arguments, got {kwargs!r}."]
    if not kwargs:
        return []
    try:
        from lightning_hybrid_rollout.schedule import get_policy_class

        cls = get_policy_class(policy)
    except (ImportError, ValueError):
        return []  # an unknown policy name is reported on its own key
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    valid = [n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    problems = []
    for name in kwargs:
        if name in _OWN_KEYS:
            problems.append(f"sets {name!r}: use async_training.{_OWN_KEYS[name]} instead.")
        elif not takes_any and name not in valid:
            knobs = [n for n in valid if n not in _OWN_KEYS]
            problems.append(
                f"has an unknown argument {name!r} for policy {policy}.{_suggest(str(name), knobs)} "
                f"Valid: {', '.join(knobs) or '(none)'}."
            )
    if problems:
        return problems
    try:
        cls(**kwargs)
    except (TypeError, ValueError) as err:
        return [f"is not accepted by policy {policy}: {err}"]
    return []


def available_policy_names() -> tuple[str, ...]:
    try:  # lazy: the schedule package is pure Python, but config must not depend on its import order
        from lightning_hybrid_rollout.schedule import available_policies
    except ImportError:
        return BUILTIN_POLICIES
    return tuple(available_policies())


# --------------------------------------------------------------------------------------------------------------
# Shared dict round trip
# --------------------------------------------------------------------------------------------------------------


@dataclass
class ConfigBase:
    """Shared ``to_dict``/``from_dict`` (a dataclass itself, so jsonargparse treats subclasses as plain dataclasses)."""

    SECTION: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """A plain ``dict`` (nested for :class:`HybridRolloutConfig`) that :meth:`from_dict` accepts back."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_C], data: Mapping[str, Any]) -> _C:
        """Build from a mapping (e.g. a YAML section). Unknown keys are rejected, with the valid keys listed.

        Raises:
            ConfigError: unknown keys, or invalid values (see the class's field docs).
        """
        where = cls.SECTION or cls.__name__
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping of keys to values, got {data!r}.")
        valid = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = [k for k in data if k not in valid]
        if unknown:
            raise ConfigError(
                [f"{where} has no key {k!r}.{_suggest(k, valid)} Valid keys: {', '.join(valid)}." for k in unknown]
            )
        return cls(**cls._convert(dict(data)))

    @classmethod
    def _convert(cls, data: dict[str, Any]) -> dict[str, Any]:
        return data


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a config dataclass: ``{field name: docstring}`` (for docs and ``--help``).

    Example::

        >>> field_docs(AsyncTrainingConfig)["staleness_threshold"].split(".")[0]
        'Fraction of extra samples the rollouter may generate ahead of the trainer, under older weights'
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs
