"""What the rollouter reads from its prompt iterator: a string, or a mapping with ``"prompt"`` and metadata."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

PromptItem = str | Mapping[str, Any]


def parse_prompt_item(item: PromptItem) -> tuple[str, dict[str, Any], Sequence[int] | None]:
    """Split a prompt item into its text, its metadata and its token ids (``None``: the rollouter tokenizes it).

    Args:
        item: A string, or a mapping with ``"prompt"`` (and optionally ``"prompt_token_ids"``); the mapping's other
            keys are the metadata.

    Raises:
        TypeError: For anything else.
    """
    if isinstance(item, str):
        return item, {}, None
    if isinstance(item, Mapping) and "prompt" in item:
        metadata = {k: v for k, v in item.items() if k not in ("prompt", "prompt_token_ids")}
        return str(item["prompt"]), metadata, item.get("prompt_token_ids")
    raise TypeError(
        f"prompt items must be str or a mapping with a 'prompt' key, got {type(item).__name__}: {item!r:.80}"
    )


def expand_prompts(prompts: Iterable[PromptItem], repeat: int | None = None) -> Iterator[PromptItem]:
    """Cycle over ``prompts`` ``repeat`` times (``None``: forever); a helper for epoch-less prompt streams.

    Args:
        prompts: A re-iterable collection of prompts.
        repeat: Number of passes, or ``None`` for an endless stream.
    """
    items = list(prompts)
    passes = itertools.count() if repeat is None else range(repeat)
    for _ in passes:
        yield from items
