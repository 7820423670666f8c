"""Tools in TRL's convention: loaded by path with their JSON schemas, run with timeouts, faults as counted errors."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.agentic.tool_parsers import ToolCall, create_tool_parser
from lightning_hybrid_rollout.agentic.tools import (
    ToolRunner,
    load_tools,
    template_renders_tools,
    tool_from_callable,
    tools_system_message,
)
from lightning_hybrid_rollout.errors import ToolError

HERE = Path(__file__).resolve().parent
FILE = os.path.relpath(HERE / "my_tools.py")


def test_tools_load_by_file_and_module_path_with_their_schemas() -> None:
    add, lookup = load_tools([f"{FILE}:add", "tests.agentic.my_tools:lookup"])
    assert (add.name, lookup.name) == ("add", "lookup")
    assert add.schema["function"]["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "The first integer.",
    }
    assert add.schema["function"]["parameters"]["required"] == ["a", "b"]
    assert not add.is_async and lookup.is_async


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (f"{FILE}:undocumented", "has no docstring"),
        (f"{FILE}:untyped", "missing a type hint"),
        ("no_such_dir/tools.py:add", "not found"),
        (f"{FILE}:ad", "Did you mean 'add'?"),
    ],
)
def test_a_tool_that_cannot_be_used_is_one_line_naming_it(item: str, says: str) -> None:
    with pytest.raises(ToolError) as err:
        load_tools([item])
    assert says in str(err.value) and f"tool {item!r}" in str(err.value) and "\n" not in str(err.value)


def test_every_bad_tool_is_reported_together_and_names_must_be_unique() -> None:
    with pytest.raises(ToolError) as err:
        load_tools([f"{FILE}:undocumented", f"{FILE}:add", "tests.agentic.my_tools:add"])
    text = str(err.value)
    assert text.startswith("2 tools cannot be used") and "undocumented" in text and "share the name 'add'" in text


def test_bound_methods_are_tools_without_self() -> None:
    class Env:
        def inc(self, by: int) -> int:
            """Increment.

            Args:
                by: How much.
            """
            return by

    tool = tool_from_callable(Env().inc)
    assert list(tool.schema["function"]["parameters"]["properties"]) == ["by"]


def _run(runner: ToolRunner, *calls: ToolCall) -> list[Any]:
    async def main() -> list[Any]:
        return [await runner.run(c) for c in calls]

    return asyncio.run(main())


def test_runner_answers_sync_and_async_tools() -> None:
    runner = ToolRunner(load_tools([f"{FILE}:add", f"{FILE}:lookup"]), timeout_s=5)
    add, look = _run(runner, ToolCall("add", {"a": 2, "b": 3}), ToolCall("lookup", {"key": "abc"}))
    assert (add.content, add.error, add.message) == ("5", None, {"role": "tool", "name": "add", "content": "5"})
    assert look.content == '{"key": "abc", "value": 3}' and look.error is None
    assert runner.calls == 2 and sum(runner.errors.values()) == 0
    runner.close()


def _blocking_tools(gate: threading.Event, finished: list[str]) -> list[Any]:
    """``slow`` blocks its thread until ``gate`` is set, ``slow_async`` sleeps on the loop; each appends its name to
    ``finished`` if it ever returns (at most ``seconds`` later)."""

    def slow(seconds: float) -> str:
        """Block until the gate opens, then answer.

        Args:
            seconds: The longest wait.
        """
        gate.wait(seconds)
        finished.append("slow")
        return "done"

    async def slow_async(seconds: float) -> str:
        """Sleep on the loop, then answer.

        Args:
            seconds: How long to sleep.
        """
        await asyncio.sleep(seconds)
        finished.append("slow_async")
        return "done"

    return [tool_from_callable(slow), tool_from_callable(slow_async)]


def test_runner_turns_every_fault_into_a_counted_error_message() -> None:
    gate = threading.Event()
    finished: list[str] = []
    runner = ToolRunner([*load_tools([f"{FILE}:add", f"{FILE}:broken"]), *_blocking_tools(gate, finished)], 0.3)
    try:
        results = _run(
            runner,
            ToolCall("nope", {}),
            ToolCall("add", {"a": 1}),
            ToolCall("broken", {"x": 1}),
            ToolCall("slow", {"seconds": 5.0}),
            ToolCall("slow_async", {"seconds": 5.0}),
        )
        assert finished == []  # the timeouts answered while neither slow tool had returned: neither was awaited
    finally:
        gate.set()
    assert [r.error for r in results] == ["unknown", "arguments", "raised", "timeout", "timeout"]
    assert "no tool 'nope'" in results[0].content and "Tools: add, broken, slow, slow_async" in results[0].content
    assert "missing a required argument: 'b'" in results[1].content
    assert results[2].content == "Error: broken raised RuntimeError: the database is down"
    assert "timed out after 0.3 s" in results[3].content
    assert runner.errors == {"unknown": 1, "arguments": 1, "raised": 1, "timeout": 2} and runner.calls == 5
    runner.close()


def test_smollm2_template_ignores_tools_so_the_fallback_system_message_describes_them(smollm2_tokenizer) -> None:
    tools = load_tools([f"{FILE}:add"])
    schemas = [t.schema for t in tools]
    assert not template_renders_tools(smollm2_tokenizer, schemas)  # SmolLM2's template drops tools=
    messages = tools_system_message([{"role": "user", "content": "2+3?"}], schemas, create_tool_parser())
    text = smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert messages[0]["role"] == "system" and '"name": "add"' in text and "<tool_call>" in text
    assert "You are a helpful AI assistant named SmolLM" not in text  # our system message replaces the default
    kept = tools_system_message([{"role": "system", "content": "Be brief."}], schemas, create_tool_parser())
    assert len(kept) == 1 and kept[0]["content"].startswith("Be brief.\n\n") and "<tools>" in kept[0]["content"]


def test_a_template_that_renders_tools_is_detected(tiny_tokenizer) -> None:
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = "{% if tools %}T{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert template_renders_tools(tok, [{"type": "function", "function": {"name": "f"}}])
