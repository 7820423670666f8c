"""What a real model's tokenizer and ``generation_config.json`` say about ending and padding (no vLLM import).

A chat model may end a turn with more than one token (SmolLM2: ``<|im_end|>``, and ``<|endoftext|>``); its tokenizer
names one ``eos_token`` while ``generation_config.json`` may list several. :func:`stop_token_ids` merges both, so a
request stops at any of them (pass them as ``SamplingSpec.stop_token_ids``); :func:`ensure_pad_token` gives a
tokenizer without a pad token its end token as pad (batching needs one).

Example::

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    stops = stop_token_ids(model_dir, tok)  # e.g. (2, 0)
    pad_id = ensure_pad_token(tok)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["ensure_pad_token", "generation_eos_ids", "stop_token_ids"]

logger = logging.getLogger(__name__)


def _ids(value: Any) -> list[int]:
    """``value`` (an id, a list of ids, or None) as a list of ints; anything else gives nothing."""
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def generation_eos_ids(model_dir: str | os.PathLike[str]) -> list[int]:
    """The ``eos_token_id`` of ``model_dir/generation_config.json`` (an int or a list) as a list; ``[]`` if none.

    Raises:
        ValueError: the file exists but is not valid JSON (the message names it).
    """
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}): fix or delete it.") from None
    return _ids(data.get("eos_token_id")) if isinstance(data, dict) else []


def stop_token_ids(model_dir: str | os.PathLike[str], tokenizer: Any) -> tuple[int, ...]:
    """Every end-of-sequence id of a model: the tokenizer's ``eos_token_id`` first, then ``generation_config.json``'s.

    Deduplicated, in that order. A request that should end where the model ends its answer stops at any of them.

    Args:
        model_dir: The model directory (its ``generation_config.json`` is read if present).
        tokenizer: Its Hugging Face tokenizer (anything with an ``eos_token_id`` attribute).
    """
    ids = _ids(getattr(tokenizer, "eos_token_id", None)) + generation_eos_ids(model_dir)
    return tuple(dict.fromkeys(ids))


def ensure_pad_token(tokenizer: Any) -> int:
    """The tokenizer's pad id; a tokenizer without a pad token gets its end token as pad first.

    Raises:
        ValueError: it has neither a pad nor an end token.
    """
    if getattr(tokenizer, "pad_token_id", None) is None:
        if getattr(tokenizer, "eos_token", None) is None:
            raise ValueError(
                f"{type(tokenizer).__name__} has neither a pad token nor an end token: set tokenizer.pad_token "
                "to a token of its vocabulary first."
            )
        tokenizer.pad_token = tokenizer.eos_token
        logger.debug("tokenizer has no pad token: using its end token %r as pad", tokenizer.eos_token)
    return int(tokenizer.pad_token_id)
