"""End and pad tokens of real models: the tokenizer's and ``generation_config.json``'s merged (no vLLM)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_hybrid_rollout.rollout.vllm.tokenizer_info import ensure_pad_token, generation_eos_ids, stop_token_ids


class Tok:
    """The attributes of a Hugging Face tokenizer these helpers read (and ``pad_token``'s id following it)."""

    def __init__(self, eos_token: str | None, eos_token_id: int | None, pad_token: str | None = None) -> None:
        self.vocab = {"<eos>": 2, "<pad>": 5}
        self.eos_token, self.eos_token_id, self.pad_token = eos_token, eos_token_id, pad_token

    @property
    def pad_token_id(self) -> int | None:
        return None if self.pad_token is None else self.vocab[self.pad_token]


def _model_dir(tmp_path: Path, eos: object) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "bos_token_id": 1}))
    return tmp_path


def test_stop_ids_merge_tokenizer_and_generation_config_in_order_without_duplicates(tmp_path: Path) -> None:
    assert stop_token_ids(_model_dir(tmp_path, [2, 0, 2, 7]), Tok("<eos>", 2)) == (2, 0, 7)


def test_generation_config_eos_may_be_a_single_int(tmp_path: Path) -> None:
    assert stop_token_ids(_model_dir(tmp_path, 9), Tok("<eos>", 2)) == (2, 9)


def test_without_generation_config_the_tokenizer_eos_is_the_stop(tmp_path: Path) -> None:
    assert stop_token_ids(tmp_path, Tok("<eos>", 2)) == (2,)
    assert generation_eos_ids(tmp_path) == []


def test_tokenizer_without_eos_uses_generation_config_only(tmp_path: Path) -> None:
    assert stop_token_ids(_model_dir(tmp_path, [3, 4]), SimpleNamespace()) == (3, 4)


def test_broken_generation_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"generation_config.json is not valid JSON"):
        stop_token_ids(tmp_path, Tok("<eos>", 2))


def test_missing_pad_token_becomes_eos_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    tok = Tok("<eos>", 2)
    with caplog.at_level(logging.DEBUG, logger="lightning_hybrid_rollout.rollout.vllm.tokenizer_info"):
        assert ensure_pad_token(tok) == 2
    assert tok.pad_token == "<eos>"
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


def test_existing_pad_token_is_kept() -> None:
    tok = Tok("<eos>", 2, pad_token="<pad>")
    assert ensure_pad_token(tok) == 5 and tok.pad_token == "<pad>"


def test_no_pad_and_no_eos_is_an_error() -> None:
    with pytest.raises(ValueError, match="neither a pad token nor an end token"):
        ensure_pad_token(Tok(None, None))


def test_real_tokenizer_gets_eos_as_pad(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.pad_token = None
    assert ensure_pad_token(tok) == tok.eos_token_id
    assert stop_token_ids(tiny_model_dir, tok)[0] == tok.eos_token_id
