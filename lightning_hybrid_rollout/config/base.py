"""The config layer's base: the one checker every section reports through (``Checker``), the dataclass base
with ``from_dict``/``to_dict``/field docstrings (``ConfigBase``, :func:`field_docs`), the policy-name and
policy-kwargs checks, and the accepted values of the enumerated fields."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from lightning_hybrid_rollout.config.fields import RULE_KEY, Checker, check_fields, field_rule, is_int, is_real
from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ConfigError

__all__ = ["Checker", "ConfigBase", "field_docs", "field_help", "is_int", "is_real"]

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
    """The base of every config section: declared fields checked on construction, ``from_dict``/``to_dict``.

    A section declares each field with :mod:`~lightning_hybrid_rollout.config.fields` (``integer``, ``real``,
    ``choice``, ...) and puts what needs several fields in :meth:`check`. A dataclass itself, so jsonargparse treats
    subclasses as plain dataclasses.
    """

    SECTION: ClassVar[str] = ""
    #: The exception a bad value raises (the simulator's sections raise ``ScenarioError``).
    ERROR: ClassVar[type[Exception]] = ConfigError

    def __post_init__(self) -> None:
        self.prepare()
        c = Checker(self.SECTION)
        check_fields(self, c)
        if not c.problems:  # cross-field rules read values the declarations already vouched for
            self.check(c)
        c.raise_if_any(self.ERROR)

    def prepare(self) -> None:
        """Normalise values before the checks (e.g. an ``os.PathLike`` to ``str``); nothing by default."""

    def check(self, c: Checker) -> None:
        """Rules the field declarations cannot say (two fields together); append problems to ``c``."""

    def to_dict(self) -> dict[str, Any]:
        """A plain ``dict`` (nested for nested sections) that :meth:`from_dict` accepts back."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_C], data: Mapping[str, Any]) -> _C:
        """Build from a mapping (e.g. a YAML section). Unknown keys are rejected, with the valid keys listed.

        Raises:
            ConfigError: unknown or missing keys, or invalid values (see the class's field docs).
        """
        where = cls.SECTION or cls.__name__
        if not isinstance(data, Mapping):
            raise cls.ERROR(f"{where} must be a mapping of keys to values, got {data!r}.")
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        valid = [f.name for f in fields]
        unknown = [k for k in data if k not in valid]
        if unknown:
            raise cls.ERROR(
                [f"{where} has no key {k!r}.{_suggest(str(k), valid)} Valid keys: {', '.join(valid)}." for k in unknown]
            )
        missing = [
            f
            for f in fields
            if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            fixes = [f.metadata[RULE_KEY].fix if RULE_KEY in f.metadata else "" for f in missing]
            raise cls.ERROR([f"{where}.{f.name} is missing. {fix}".rstrip() for f, fix in zip(missing, fixes)])
        out = dict(data)
        for f in fields:  # nested sections from their own mappings
            rule = f.metadata.get(RULE_KEY)
            if rule is not None and rule.kind == "section" and isinstance(out.get(f.name), Mapping):
                out[f.name] = rule.section_type.from_dict(out[f.name])
        return cls(**cls._convert(out))

    @classmethod
    def _convert(cls, data: dict[str, Any]) -> dict[str, Any]:
        return data

    @classmethod
    def field_names(cls) -> list[str]:
        """The keys this section accepts, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


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


def field_help(cls: type) -> dict[str, str]:
    """Each field's help: its attribute docstring, then what it accepts (from the same rule the check uses)."""
    docs = field_docs(cls)
    out = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        rule = field_rule(f)
        accepts = f" Accepts {rule.requirement()}." if rule is not None and rule.kind != "section" else ""
        out[f.name] = docs.get(f.name, "") + accepts
    return out
