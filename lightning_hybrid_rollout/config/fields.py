"""The one way a config section declares a setting: ``n: int = integer(8, at_least=1, fix="...")``. Each declaration
is a ``dataclasses.field`` whose metadata holds a :class:`Rule`; :func:`check_fields` checks every declared field
(one line per bad value: key, requirement, value, fix) and :func:`field_help` writes each field's help from its
docstring and the same rule, so the error, the help and the docs table cannot disagree (as vLLM's and TRL's
``field(metadata={"help": ...})`` do for help). A rule the declarations cannot say (two fields together, a mapping of
engine arguments) is the section's ``check`` method.

Example::

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Knobs(ConfigBase):
    ...     SECTION = "knobs"
    ...     n: int = integer(8, at_least=1, fix="Use the group size, e.g. 8.")
    ...     '''Samples per prompt.'''
    >>> Knobs(n=0)
    Traceback (most recent call last):
    ...
    lightning_hybrid_rollout.errors.ConfigError: knobs.n must be an integer >= 1, got 0. Use the group size, e.g. 8.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ConfigError

__all__ = [
    "RULE_KEY",
    "Checker",
    "Rule",
    "boolean",
    "check_fields",
    "choice",
    "custom",
    "field_rule",
    "integer",
    "real",
    "section",
    "text",
]

#: The ``dataclasses.field`` metadata key holding a field's :class:`Rule`.
RULE_KEY = "lhr_rule"

Kind = Literal["int", "real", "bool", "choice", "text", "section", "custom"]

#: ``check(section_object, key, value) -> problems`` of a :func:`custom` field: each problem a whole line.
CustomCheck = Callable[[Any, str, Any], list[str]]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Rule:
    """What one field accepts. Made by the declaration functions below, never by hand."""

    kind: Kind
    fix: str = ""
    nullable: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    empty_ok: bool = False
    section_type: type | None = None
    check: CustomCheck | None = None
    requirement_text: str = ""

    def allowed(self) -> tuple[str, ...]:
        return tuple(self.choices()) if callable(self.choices) else self.choices

    def requirement(self) -> str:
        """What the field must be, as the rest of "``key`` must be ...": e.g. ``an integer >= 1``."""
        if self.kind == "bool" and self.nullable:
            return "null, true or false"
        base = self._requirement()
        return f"null or {base}" if self.nullable else base

    def _requirement(self) -> str:
        if self.kind == "int":
            return "an integer" + (f" >= {self.low:g}" if self.low is not None else "")
        if self.kind == "real":
            return "a number" + self._interval()
        if self.kind == "bool":
            return "a bool"
        if self.kind == "choice":
            return f"one of {list(self.allowed())}"
        if self.kind == "text":
            return "a string" if self.empty_ok else "a non-empty string"
        if self.kind == "section":
            name = self.section_type.__name__ if self.section_type else "section"
            return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"
        return self.requirement_text or "valid"

    def _interval(self) -> str:
        low, high = self.low, self.high
        if low is not None and high is not None:
            return f" in {'(' if self.low_open else '['}{low:g}, {high:g}{')' if self.high_open else ']'}"
        if low is not None:
            return f" > {low:g}" if self.low_open else f" >= {low:g}"
        if high is not None:
            return f" < {high:g}" if self.high_open else f" <= {high:g}"
        return ""

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` passes the declared rule (:func:`check_fields` runs a :func:`custom` field's check)."""
        if value is None and self.nullable:
            return True
        if self.kind == "int":
            return is_int(value) and (self.low is None or value >= self.low)
        if self.kind == "real":
            if not is_real(value):
                return False
            if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
                return False
            return self.high is None or not (value > self.high or (self.high_open and value == self.high))
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return isinstance(value, str) and value in self.allowed()
        if self.kind == "text":
            return isinstance(value, str) and (self.empty_ok or bool(value))
        if self.kind == "section":
            return self.section_type is None or isinstance(value, self.section_type)
        return True

    def problem(self, key: str, value: Any) -> str:
        """The one line reported when ``value`` is refused under ``key``."""
        fix = self.fix
        if self.kind == "bool" and not fix:
            name = key.rpartition(".")[2]
            fix = f"Write `{name}: true` or `{name}: false` (no quotes)."
        if self.kind == "choice" and isinstance(value, str):
            fix += did_you_mean(value, self.allowed())
        requirement = self.requirement()
        if self.kind == "int" and is_int(value) and self.low is not None and not self.nullable:
            requirement = f">= {self.low:g}"  # the type is right: name the bound only
        return f"{key} must be {requirement}, got {value!r}. {fix}".rstrip()


class Checker:
    """Collects one line per bad value of a section (``section.key must be ..., got ... . fix``)."""

    def __init__(self, section: str) -> None:
        self.section = section
        self.problems: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.section}.{name}" if self.section else name

    def add(self, name: str, requirement: str, value: Any, fix: str) -> None:
        self.problems.append(f"{self.key(name)} must be {requirement}, got {value!r}. {fix}")

    def raise_if_any(self, error: type[Exception] = ConfigError) -> None:
        if self.problems:
            raise error(self.problems)


def _field(default: Any, default_factory: Any, rule: Rule) -> Any:
    kwargs: dict[str, Any] = {"metadata": {RULE_KEY: rule}}
    if default_factory is not dataclasses.MISSING:
        kwargs["default_factory"] = default_factory
    else:
        kwargs["default"] = default
    return dataclasses.field(**kwargs)


_NO = dataclasses.MISSING


def integer(default: Any = _NO, *, at_least: int | None = None, nullable: bool = False, fix: str = "") -> Any:
    """An integer field, at least ``at_least``; ``nullable`` also takes ``null``."""
    return _field(default, _NO, Rule("int", fix, nullable, low=at_least))


def real(
    default: Any = _NO,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    nullable: bool = False,
    fix: str = "",
) -> Any:
    """A finite number (an integer is stored as a float): ``at_least``/``above`` and ``at_most``/``below`` bound it."""
    low = above if above is not None else at_least
    high = below if below is not None else at_most
    rule = Rule("real", fix, nullable, low=low, high=high, low_open=above is not None, high_open=below is not None)
    return _field(default, _NO, rule)


def boolean(default: Any = _NO, *, nullable: bool = False, fix: str = "") -> Any:
    """``true`` or ``false`` (``nullable``: or ``null``); never a quoted string."""
    return _field(default, _NO, Rule("bool", fix, nullable))


def choice(default: Any = _NO, choices: Iterable[str] | Callable[[], tuple[str, ...]] = (), *, fix: str = "") -> Any:
    """One of ``choices`` (a callable is asked at check time, e.g. the registered policies); a near miss gets a
    "did you mean"."""
    allowed = choices if callable(choices) else tuple(choices)
    return _field(default, _NO, Rule("choice", fix, choices=allowed))


def text(default: Any = _NO, *, nullable: bool = False, empty_ok: bool = False, fix: str = "") -> Any:
    """A string, non-empty unless ``empty_ok``."""
    return _field(default, _NO, Rule("text", fix, nullable, empty_ok=empty_ok))


def section(section_type: type, *, fix: str = "") -> Any:
    """A nested section (its own checks ran when it was built); its default is ``section_type()``."""
    return _field(_NO, section_type, Rule("section", fix, section_type=section_type))


def custom(
    default: Any = _NO,
    *,
    default_factory: Any = _NO,
    requirement: str,
    check: CustomCheck,
    nullable: bool = False,
    fix: str = "",
) -> Any:
    """A field whose values a declaration cannot say (a list of import paths, a mapping of engine arguments):
    ``check(config, key, value)`` returns its problem lines (not asked for ``null`` when ``nullable``);
    ``requirement`` is its help text."""
    rule = Rule("custom", fix, nullable, check=check, requirement_text=requirement)
    return _field(default, default_factory, rule)


def field_rule(f: dataclasses.Field[Any]) -> Rule | None:
    """The :class:`Rule` a field was declared with (None: declared without one)."""
    return f.metadata.get(RULE_KEY)


def check_fields(config: Any, checker: Checker) -> None:
    """Check every declared field of ``config`` into ``checker``; store an integer given to a ``real`` as a float."""
    for f in dataclasses.fields(config):
        rule = field_rule(f)
        if rule is None:
            continue
        value = getattr(config, f.name)
        key = checker.key(f.name)
        if rule.kind == "custom":
            if rule.check is not None and not (value is None and rule.nullable):
                checker.problems.extend(rule.check(config, key, value))
        elif not rule.accepts(value):
            checker.problems.append(rule.problem(key, value))
        elif rule.kind == "real" and is_int(value):
            object.__setattr__(config, f.name, float(value))  # frozen sections too
