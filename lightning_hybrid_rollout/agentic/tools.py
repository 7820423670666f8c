"""Tools in TRL's convention: typed functions with Google-style docstrings given by import path (``tools:
["my_tools.py:search", "pkg.module:calculator"]``), sync or async, described by transformers' ``get_json_schema``,
run with a timeout by :class:`ToolRunner` (a tool that raises, times out or is unknown answers the model with an
error message, counted); :func:`tools_system_message` for chat templates that ignore ``tools``."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.agentic.tool_parsers import ToolCall, ToolCallParser
from lightning_hybrid_rollout.errors import ToolError
from lightning_hybrid_rollout.rewards.loading import resolve_import_path

__all__ = [
    "Tool",
    "ToolResult",
    "ToolRunner",
    "load_tools",
    "template_renders_tools",
    "tool_from_callable",
    "tools_system_message",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tool:
    """One tool the model may call.

    Args:
        name: The name the model calls it by (the function's ``__name__``).
        fn: The function (or bound method); a coroutine function is awaited.
        schema: Its JSON schema, ``{"type": "function", "function": {...}}`` (``tools=`` of a chat template).
        spec: Where it came from, for messages (``"my_tools.py:search"``).
    """

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    spec: str = ""

    @property
    def is_async(self) -> bool:
        """True for a coroutine function (awaited on the loop, not run in the worker pool)."""
        return inspect.iscoroutinefunction(self.fn)


@dataclass(frozen=True)
class ToolResult:
    """The answer to one tool call, as the tool message's content.

    Args:
        name: The tool called.
        content: Its result as text (a ``str`` as is, anything else as JSON, else ``str()``), or the error message.
        error: ``None`` on success, else ``"unknown"``, ``"arguments"``, ``"raised"`` or ``"timeout"``.
    """

    name: str
    content: str
    error: str | None = None

    @property
    def message(self) -> dict[str, Any]:
        """The tool message for the conversation (``role: tool``)."""
        return {"role": "tool", "name": self.name, "content": self.content}


def tool_from_callable(fn: Callable[..., Any], spec: str = "") -> Tool:
    """A :class:`Tool` for ``fn``, its schema from its type hints and Google-style docstring.

    Raises:
        ToolError: ``fn`` is not callable, or has no docstring, an undocumented argument or an argument without a
            type hint (one line naming it and the fix).
    """
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    label = spec or getattr(fn, "__qualname__", repr(fn))
    if not callable(fn) or inspect.isclass(fn):
        raise ToolError(f"tool {label!r} is a {type(fn).__name__}, not a function; point it at a function")
    try:
        schema = get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as err:
        raise ToolError(
            f"tool {label!r} cannot be described to the model: {' '.join(str(err).split())}; give every argument a "
            "type hint and the function a Google-style docstring with an Args: section"
        ) from err
    return Tool(name=schema["function"]["name"], fn=fn, schema=schema, spec=label)


def load_tools(items: Sequence[str | Callable[..., Any]]) -> list[Tool]:
    """The tools of a ``tools:`` list, each an import path (``"file.py:fn"``, ``"pkg.module:fn"``) or a callable.

    Raises:
        ToolError: An item that does not load or cannot be described, or two tools with one name (one line each,
            all of them together).
    """
    problems: list[str] = []
    tools: list[Tool] = []
    for item in items:
        try:
            fn = resolve_import_path(item, kind="tool", error=ToolError) if isinstance(item, str) else item
            tools.append(tool_from_callable(fn, item if isinstance(item, str) else ""))
        except ToolError as err:
            problems.append(str(err))
    seen: dict[str, str] = {}
    for tool in tools:
        if tool.name in seen:
            problems.append(f"tools {seen[tool.name]!r} and {tool.spec!r} share the name {tool.name!r}; rename one")
        seen.setdefault(tool.name, tool.spec)
    if len(problems) == 1:
        raise ToolError(problems[0])
    if problems:
        raise ToolError(f"{len(problems)} tools cannot be used:\n" + "\n".join(f"  - {p}" for p in problems))
    return tools


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class ToolRunner:
    """Runs tool calls: async tools awaited, sync ones in a bounded thread pool, each under ``timeout_s``.

    A sync tool that times out keeps its worker thread until it returns (Python cannot stop a thread): the pool's
    bound keeps such tools from piling up threads; the episode gets its error message at once.

    Args:
        tools: The tools the model may call.
        timeout_s: The most seconds one call may take.
        workers: Threads of the pool for sync tools (when no ``pool`` is given).
        pool: A pool shared with other runners (the rollout's: one per run, not one per episode); not shut down by
            :meth:`close`.

    Attributes:
        calls: Calls run. errors: Calls answered with an error message, by kind (``unknown``, ``arguments``,
            ``raised``, ``timeout``).
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        timeout_s: float = 30.0,
        workers: int = 4,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        if not timeout_s > 0 or workers < 1:
            raise ToolError(f"tool timeout_s must be > 0 and workers >= 1, got {timeout_s!r} and {workers!r}")
        self.tools = {t.name: t for t in tools}
        self.timeout_s = float(timeout_s)
        self._owns_pool = pool is None
        self._pool = (
            pool if pool is not None else ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lhr-tool")
        )
        self.calls = 0
        self.errors: dict[str, int] = {"unknown": 0, "arguments": 0, "raised": 0, "timeout": 0}

    async def run(self, call: ToolCall) -> ToolResult:
        """The result of ``call`` (never raises for the tool's faults: those become the result's error message)."""
        self.calls += 1
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return self._error(call.name, "unknown", f"Error: there is no tool {call.name!r}. Tools: {known}.")
        try:
            inspect.signature(tool.fn).bind(**call.arguments)
        except TypeError as err:
            return self._error(call.name, "arguments", f"Error: bad arguments for {call.name}: {err}.")
        try:
            if tool.is_async:
                value = await asyncio.wait_for(tool.fn(**call.arguments), self.timeout_s)
            else:
                loop = asyncio.get_running_loop()
                future = loop.run_in_executor(self._pool, lambda: tool.fn(**call.arguments))
                value = await asyncio.wait_for(future, self.timeout_s)
        except TimeoutError:
            return self._error(call.name, "timeout", f"Error: {call.name} timed out after {self.timeout_s:g} s.")
        except Exception as err:  # the tool's own fault: the model reads it, the run goes on
            text = " ".join(str(err).split())[:500]
            return self._error(call.name, "raised", f"Error: {call.name} raised {type(err).__name__}: {text}")
        return ToolResult(name=call.name, content=_as_text(value))

    def _error(self, name: str, kind: str, content: str) -> ToolResult:
        self.errors[kind] += 1
        logger.debug("tool call %s answered with an error: %s", name, content)
        return ToolResult(name=name, content=content, error=kind)

    def close(self) -> None:
        """Stop the worker pool if it is this runner's own (calls still running finish on their own)."""
        if self._owns_pool:
            self._pool.shutdown(wait=False, cancel_futures=True)


def template_renders_tools(tokenizer: Any, schemas: Sequence[Mapping[str, Any]]) -> bool:
    """True if ``tokenizer``'s chat template puts ``tools=`` into the prompt (SmolLM2's does not: it ignores them).

    Renders one user message with and without the schemas: a template that uses them renders differently.
    """
    if not schemas:
        return True
    messages = [{"role": "user", "content": "hi"}]
    kwargs = {"add_generation_prompt": True, "tokenize": False}
    return tokenizer.apply_chat_template(messages, tools=list(schemas), **kwargs) != tokenizer.apply_chat_template(
        messages, **kwargs
    )


def tools_system_message(
    messages: Sequence[Mapping[str, Any]], schemas: Sequence[Mapping[str, Any]], parser: ToolCallParser
) -> list[dict[str, Any]]:
    """``messages`` with the tools described in the system message, for a chat template that ignores ``tools=``.

    The description is the parser's :meth:`~ToolCallParser.format_instructions` (the tools' JSON schemas and the
    call format that parser reads); it is appended to an existing system message, or becomes the first message.
    """
    text = parser.format_instructions(schemas)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content') or ''}\n\n{text}".lstrip()
    else:
        out.insert(0, {"role": "system", "content": text})
    return out
