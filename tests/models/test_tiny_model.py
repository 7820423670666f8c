"""The tiny local model/tokenizer builder (transformers only; vLLM loading is covered by tests/rollout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_hybrid_rollout.models.tiny_model import MARKER, build_tiny_model, tiny_vocab, warm_up_format
from lightning_hybrid_rollout.tasks import ArithmeticTask


def test_tiny_model_loads_and_tokenizes(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok("3+4=").input_ids
    assert ids[0] == tok.bos_token_id == 1 and len(ids) == 5
    assert tok.decode(ids, skip_special_tokens=True) == "3+4="
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0
    assert tok.decode(tok("rev:abc= XY", add_special_tokens=False).input_ids) == "rev:abc= XY"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.dtype == torch.float32 and model.config.vocab_size == len(tiny_vocab()) == 128
    assert 400_000 < sum(p.numel() for p in model.parameters()) < 700_000
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", MARKER} <= {
        p.name for p in tiny_model_dir.iterdir()
    }


def test_build_is_idempotent_and_rebuilds_on_new_args(tmp_path: Path) -> None:
    out = tmp_path / "m"
    build_tiny_model(out, hidden=64, layers=1)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    build_tiny_model(out, hidden=64, layers=1)
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    build_tiny_model(out, hidden=64, layers=1, seed=1)
    assert json.loads((out / MARKER).read_text())["seed"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path / "bad", hidden=100, heads=3)


def test_format_warm_up_teaches_the_answer_shape(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_model(tmp_path / "m", hidden=64, layers=1)
    task = ArithmeticTask()
    warm_up_format(out, task, steps=60, seed=0, batch_size=32, lr=3e-3)
    assert json.loads((out / MARKER).read_text())["warmup"]["steps"] == 60
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    warm_up_format(out, task, steps=60, seed=0, batch_size=32, lr=3e-3)  # recorded: skipped
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    build_tiny_model(out, hidden=64, layers=1)  # same build args: the warmed weights are kept
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    well_formed = 0
    prompts = task.sample_prompts(20, seed=5)
    for p in prompts:
        ids = torch.tensor([tok(p.prompt).input_ids])
        with torch.no_grad():
            for _ in range(3):
                ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
        new = ids[0, -3:].tolist()
        well_formed += tok.decode(new[:1]).isdigit() and new[1] == tok.eos_token_id
    assert well_formed >= 18, f"only {well_formed}/20 answers were '<digit></s>'"
