"""Secrets never reach what a run writes: the masking of config trees and log records."""

from __future__ import annotations

import logging

import pytest

from lightning_hybrid_rollout import redaction
from lightning_hybrid_rollout.redaction import RedactingFilter, collect_secrets, is_secret_name, redact

KEY = "0123456789abcdef0123456789abcdef01234567"


def test_secret_named_keys_and_known_values_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    config = {
        "logger": [{"init_args": {"settings": {"api_key": "another-secret-value"}, "project": "p"}}],
        "note": f"key={KEY}",
        "n": 8,
        "pad_token": "<pad>",
        "tokenizer_path": "runs/tok",
    }
    out = redact(config)
    assert out["logger"][0]["init_args"]["settings"]["api_key"] == "***"
    assert out["logger"][0]["init_args"]["project"] == "p"
    assert out["note"] == "key=***" and out["n"] == 8
    assert out["pad_token"] == "<pad>" and out["tokenizer_path"] == "runs/tok"
    assert config["note"] == f"key={KEY}"  # a copy: the run's own config is untouched


def test_names_that_hold_secrets() -> None:
    for name in ("WANDB_API_KEY", "HF_TOKEN", "api_key", "apiKey", "AWS_SECRET_ACCESS_KEY", "db_password"):
        assert is_secret_name(name), name
    for name in ("RAY_AUTH_TOKEN_PATH", "TOKENIZERS_PARALLELISM", "max_tokens", "pad_token", "model_path"):
        assert not is_secret_name(name), name


def test_the_log_filter_masks_messages_arguments_and_tracebacks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(redaction, "_registered", set())
    collect_secrets({"settings": {"api_key": KEY}})
    log = logging.getLogger("lhr.test.redaction")
    caplog.handler.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, logger="lhr.test.redaction"):
        log.info("starting with %s", {"api_key": KEY})
        try:
            raise RuntimeError(f"login failed for {KEY}")
        except RuntimeError:
            log.exception("oops")
    text = caplog.text
    assert KEY not in text and text.count("***") >= 2
