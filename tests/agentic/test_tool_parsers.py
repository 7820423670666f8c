"""The tool-call parser registry and the Hermes parser: well-formed calls read, malformed ones as counted errors."""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.agentic.tool_parsers import (
    DEFAULT_TOOL_PARSER,
    HermesToolParser,
    ToolCall,
    ToolCallParser,
    available_tool_parsers,
    create_tool_parser,
    register_tool_parser,
)
from lightning_hybrid_rollout.errors import ToolError


def test_hermes_is_the_default_and_selectable_by_name() -> None:
    assert DEFAULT_TOOL_PARSER == "hermes" and "hermes" in available_tool_parsers()
    assert isinstance(create_tool_parser(), HermesToolParser)
    with pytest.raises(ToolError, match=r"unknown tool_parser 'qwen9'.*hermes"):
        create_tool_parser("qwen9")


def test_hermes_reads_every_call_and_the_text_around_them() -> None:
    parser = create_tool_parser("hermes")
    text = (
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"x\\"}"}</tool_call>'
    )
    turn = parser.parse(text)
    assert turn.calls == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("lookup", {"key": "x"})]
    assert turn.content == "Let me add." and turn.errors == [] and turn.wants_tools
    assert parser.malformed == 0


def test_a_turn_without_calls_wants_no_tools() -> None:
    turn = create_tool_parser().parse("The answer is 5.")
    assert turn.calls == [] and turn.errors == [] and not turn.wants_tools and turn.content == "The answer is 5."


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 2,}}</tool_call>', "is not valid JSON"),
        ('<tool_call>["add"]</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "of type list"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}}', "no closing </tool_call>"),
    ],
)
def test_malformed_calls_become_counted_error_messages(body: str, problem: str) -> None:
    parser = create_tool_parser()
    turn = parser.parse('<tool_call>{"name": "ok", "arguments": {}}</tool_call>' + body)
    assert turn.calls == [ToolCall("ok", {})]
    assert len(turn.errors) == 1 and problem in turn.errors[0] and turn.errors[0].startswith("Error: tool call 2 ")
    assert '<tool_call>{"name":' in turn.errors[0]  # the model is told the expected form
    assert parser.malformed == 1 and turn.wants_tools


def test_format_instructions_list_the_schemas_and_the_call_form() -> None:
    schema = {"type": "function", "function": {"name": "add", "parameters": {}}}
    text = create_tool_parser().format_instructions([schema])
    assert '"name": "add"' in text and "<tools>" in text and "<tool_call>" in text


def test_the_registry_refuses_a_second_class_under_a_taken_name() -> None:
    with pytest.raises(ValueError, match="already registered"):

        @register_tool_parser("hermes")
        class Other(ToolCallParser):
            def parse(self, text):
                raise NotImplementedError

            def format_instructions(self, schemas):
                return ""

    with pytest.raises(TypeError, match="ToolCallParser subclass"):
        register_tool_parser("x")(dict)
