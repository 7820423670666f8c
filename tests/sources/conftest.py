"""Fixtures of the prompt-source tests: small data sets written in every format, and offline tokenizers.

- ``ROWS`` / ``CHAT_ROWS``: five plain-text rows and three chat rows, each with extra columns.
- ``write_rows(rows, fmt, name)``: writes rows as ``jsonl``, ``json``, ``parquet``, ``csv``, ``disk``
  (``Dataset.save_to_disk``) or ``disk_dict`` (a ``DatasetDict`` with ``train`` and ``test``) under ``tmp_path``.
- ``chat_tokenizer``: a word-level ``PreTrainedTokenizerFast`` (one token per whitespace-separated word, specials
  kept whole, ``<s>`` prepended with special tokens on) with a ChatML template, built without a hub.
- ``plain_tokenizer``: the tiny char-level one (no template, adds ``<s>``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROWS: list[dict[str, Any]] = [
    {"prompt": f"what is {i} plus {i}", "answer": f"a{2 * i}", "level": i % 2} for i in range(5)
]
CHAT_ROWS: list[dict[str, Any]] = [
    {"prompt": [{"role": "user", "content": "hi there"}], "answer": "a"},
    {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hi"}], "answer": "b"},
    {"prompt": [{"role": "user", "content": "one two three four five six"}], "answer": "c"},
]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ["user", "assistant", "system", "hi", "there", "say", "be", "brief"]
WriteRows = Callable[..., Path]


def write_rows_to(path: Path, rows: list[dict[str, Any]], fmt: str) -> Path:
    """Write ``rows`` at ``path`` (suffix added) in ``fmt``; returns the file or directory."""
    if fmt == "jsonl":
        out = path.with_suffix(".jsonl")
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return out
    if fmt == "json":
        out = path.with_suffix(".json")
        out.write_text(json.dumps(rows))
        return out
    import datasets

    ds = datasets.Dataset.from_list(rows)
    if fmt == "parquet":
        out = path.with_suffix(".parquet")
        ds.to_parquet(str(out))
    elif fmt == "csv":
        out = path.with_suffix(".csv")
        ds.to_csv(str(out), index=False)
    elif fmt == "disk":
        out = path
        ds.save_to_disk(str(out))
    elif fmt == "disk_dict":
        out = path
        datasets.DatasetDict(train=ds, test=ds.select([0])).save_to_disk(str(out))
    else:
        raise ValueError(fmt)
    return out


@pytest.fixture
def write_rows(tmp_path: Path) -> WriteRows:
    """``write_rows(rows, fmt="jsonl", name="train") -> path`` under this test's ``tmp_path``."""

    def write(rows: list[dict[str, Any]], fmt: str = "jsonl", name: str = "train") -> Path:
        return write_rows_to(tmp_path / name, rows, fmt)

    return write


@pytest.fixture(scope="session")
def chat_tokenizer() -> Any:
    """Word-level tokenizer with a ChatML chat template and a BOS; unknown words map to ``<unk>`` (one token each).

    Ids: ``<pad>`` 0, ``<unk>`` 1, ``<s>`` 2, ``</s>`` 3, ``<|im_start|>`` 4, ``<|im_end|>`` 5, then ``WORDS``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(specials + WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="session")
def plain_tokenizer() -> Any:
    """The tiny model's char-level tokenizer (no chat template; ``encode`` prepends ``<s>``)."""
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()
