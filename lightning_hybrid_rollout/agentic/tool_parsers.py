"""Tool-call parsers: a model turn's text to the tool calls it makes, in a registry selectable by name (``hermes``,
the default: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); a malformed call becomes an error
message for the model, counted, never an exception."""

from __future__ import annotations

import contextlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from lightning_hybrid_rollout.errors import ToolError

__all__ = [
    "DEFAULT_TOOL_PARSER",
    "HermesToolParser",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "available_tool_parsers",
    "create_tool_parser",
    "register_tool_parser",
]

DEFAULT_TOOL_PARSER = "hermes"
"""The parser used when none is named (Qwen2.5/3, Hermes, and the fallback system message's format)."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model turn makes.

    Args:
        name: The tool's name.
        arguments: Its keyword arguments (a JSON object).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedTurn:
    """What a parser read in one model turn.

    Args:
        content: The turn's text outside its tool calls, stripped.
        calls: The well-formed tool calls, in order.
        errors: One message to the model per malformed call (what is wrong and the expected form).
    """

    content: str
    calls: list[ToolCall]
    errors: list[str]

    @property
    def wants_tools(self) -> bool:
        """True if the turn tried to call a tool (well-formed or not): the episode continues with a tool turn."""
        return bool(self.calls or self.errors)


class ToolCallParser(ABC):
    """Reads tool calls out of a model turn's text and describes their format (the fallback system message).

    Attributes:
        malformed: Malformed calls seen by this parser so far (the runtime reports it as a metric).
    """

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self.malformed = 0

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """The calls in ``text`` (a model turn, special tokens removed); malformed ones as error messages."""

    @abstractmethod
    def format_instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        """A system message describing the tools (JSON schemas) and the call format this parser reads."""


_P = TypeVar("_P", bound=type[ToolCallParser])
_REGISTRY: dict[str, type[ToolCallParser]] = {}


def register_tool_parser(name: str) -> Callable[[_P], _P]:
    """Class decorator: register a :class:`ToolCallParser` subclass under ``name`` (``tool_parser: name``).

    Re-registering the same class (or its reload) replaces the entry; another class under a taken name raises
    ``ValueError``.

    Example::

        @register_tool_parser("my_format")
        class MyParser(ToolCallParser): ...
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool parser name must be a non-empty string, got {name!r}")

    def decorator(cls: _P) -> _P:
        if not (isinstance(cls, type) and issubclass(cls, ToolCallParser)):
            raise TypeError(f"@register_tool_parser({name!r}) needs a ToolCallParser subclass, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"tool parser name {name!r} is already registered to {existing.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def available_tool_parsers() -> list[str]:
    """The registered parser names, sorted."""
    return sorted(_REGISTRY)


def create_tool_parser(name: str = DEFAULT_TOOL_PARSER) -> ToolCallParser:
    """A new parser registered as ``name``.

    Raises:
        ToolError: No parser has that name (the message lists the registered ones).
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ToolError(f"unknown tool_parser {name!r}; use one of {', '.join(available_tool_parsers())}")
    return cls()


@register_tool_parser("hermes")
class HermesToolParser(ToolCallParser):
    """Hermes-style calls: ``<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>``, any number per turn.

    A call whose JSON does not parse, lacks a string ``name``, has non-object ``arguments`` (a JSON string holding
    an object is accepted, as some models write it) or misses its closing tag becomes an error message.
    """

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
    _EXPECTED = '<tool_call>{"name": "<tool name>", "arguments": {<arguments as a JSON object>}}</tool_call>'

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        for i, match in enumerate(self._CALL.finditer(text), start=1):
            body, closed = match.group(1).strip(), bool(match.group(2))
            problem = None if closed else "has no closing </tool_call>"
            call = None
            if problem is None:
                call, problem = self._call(body)
            if call is not None:
                calls.append(call)
            else:
                errors.append(f"Error: tool call {i} {problem}. Write each call as {self._EXPECTED}")
        self.malformed += len(errors)
        content = self._CALL.sub("", text).strip()
        return ParsedTurn(content=content, calls=calls, errors=errors)

    @staticmethod
    def _call(body: str) -> tuple[ToolCall | None, str | None]:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as err:
            return None, f"is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None, 'is not a JSON object with a string "name"'
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models encode the arguments as a JSON string
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            return None, f'has "arguments" of type {type(args).__name__}, not a JSON object'
        return ToolCall(name=obj["name"], arguments=args), None

    def format_instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        listed = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
        return (
            "You may call one or more functions to assist with the user query. The functions available are listed "
            f"within <tools></tools>:\n<tools>\n{listed}\n</tools>\n"
            "For each function call, write a JSON object with the function name and its arguments within "
            f"<tool_call></tool_call> tags:\n{self._EXPECTED}\n"
            "The results come back in the next message. When you need no more calls, answer without any."
        )
