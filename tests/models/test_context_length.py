"""A model's own context length, read from its ``config.json`` as vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_hybrid_rollout.models.context_length import model_context_length


def _model(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_smallest_length_key_of_the_config_is_the_context(tmp_path: Path) -> None:
    model = _model(tmp_path, {"max_position_embeddings": 2048, "seq_length": 1024, "hidden_size": 64})
    assert model_context_length(model) == (1024, "seq_length")


def test_a_multimodal_config_is_read_in_its_text_config(tmp_path: Path) -> None:
    model = _model(tmp_path, {"max_position_embeddings": 99, "text_config": {"max_position_embeddings": 8192}})
    assert model_context_length(model) == (8192, "max_position_embeddings")


def test_a_hub_id_or_a_config_without_a_length_gives_none(tmp_path: Path) -> None:
    assert model_context_length("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    assert model_context_length(_model(tmp_path, {"hidden_size": 64})) is None
