"""A model's own context length, read from its ``config.json`` the way vLLM derives ``max_model_len``: the smallest
of the length keys it knows (``max_position_embeddings``, ``n_positions``, ...), in the text config of a multimodal
model. A default context the run derives (``rollout.max_model_len`` left out) stays within it."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["CONTEXT_LENGTH_KEYS", "model_context_length"]

#: ``config.json`` keys that bound a model's context, as vLLM reads them (``ModelArchConfigConvertor``).
CONTEXT_LENGTH_KEYS: tuple[str, ...] = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def model_context_length(model_dir: str | os.PathLike[str]) -> tuple[int, str] | None:
    """The model's context length and the ``config.json`` key that gives it; None when ``model_dir`` is not a local
    directory with a ``config.json`` (a hub id not yet downloaded) or the config names no length.

    Example::

        model_context_length("runs/quickstart/model")  # (512, "max_position_embeddings")
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the engines' own check says what is wrong with the file
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    found = [(int(text[k]), k) for k in CONTEXT_LENGTH_KEYS if isinstance(text.get(k), int | float) and text[k] > 0]
    return min(found) if found else None
