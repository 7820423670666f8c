"""Environments and a tool-call parser for tests/validation/test_episodes.py (loaded by path, as a run
loads them): what each episode's ``reset`` saw is recorded in ``SEEN``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_hybrid_rollout.agentic import ParsedTurn, ToolCall, ToolCallParser, register_tool_parser

#: ``(seed, options)`` of every ``reset`` of a :class:`Guess`, in order.
SEEN: list[tuple[int | None, dict[str, Any] | None]] = []


class Guess:
    """Gymnasium's convention: guess the secret (``options["secret"]`` if the row has it, else ``secret``); each
    wrong guess costs ``penalty``, the right one gives 1.0 and ends the episode."""

    def __init__(self, secret: int = 3, penalty: float = 0.0) -> None:
        self.default, self.penalty = secret, penalty
        self.secret = secret

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        SEEN.append((seed, dict(options) if options is not None else None))
        self.secret = int((options or {}).get("secret", self.default))
        return "Guess a number.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        found = re.search(r"\d+", action)
        if found is not None and int(found.group()) == self.secret:
            return "Correct!", 1.0, True, False, {}
        return "No. Again.", self.penalty, False, False, {}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


@register_tool_parser("lhr_test_words")
class WordsParser(ToolCallParser):
    """Reads ``call add 2 3`` (words the tiny model's character tokenizer can spell) as ``add(a=2, b=3)``."""

    def parse(self, text: str) -> ParsedTurn:
        found = re.fullmatch(r"\s*call (\w+) (\d+) (\d+)\s*", text)
        if found is None:
            return ParsedTurn(content=text.strip(), calls=[], errors=[])
        name, a, b = found.groups()
        return ParsedTurn(content="", calls=[ToolCall(name, {"a": int(a), "b": int(b)})], errors=[])

    def format_instructions(self, schemas: Sequence[Mapping[str, Any]]) -> str:
        return "Tools: " + ", ".join(s["function"]["name"] for s in schemas) + ". Call one as: call add 2 3"
