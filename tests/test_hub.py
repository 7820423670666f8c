"""Hub ids resolve through a Hugging Face cache in the hub's own layout, offline, and fail in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.hub import is_hub_id, resolve_dataset_path, resolve_model_path
from lightning_hybrid_rollout.models.model_path import model_path_problems
from tests.hub_cache import add_to_hub_cache

MODEL_ID = "lhr-test/tiny-llama"


@pytest.fixture
def offline_cache(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``HF_HOME`` holding the tiny model as ``lhr-test/tiny-llama`` (branch ``main`` and tag ``v1``), offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = add_to_hub_cache(tmp_path / "hf" / "hub", MODEL_ID, tiny_model_dir)
    add_to_hub_cache(tmp_path / "hf" / "hub", MODEL_ID, tiny_model_dir, revision="v1")
    return snapshot


def test_a_hub_id_resolves_offline_to_its_cached_snapshot(offline_cache: Path) -> None:
    resolved = Path(resolve_model_path(MODEL_ID))
    assert resolved == offline_cache
    assert (resolved / "config.json").is_file() and list(resolved.glob("*.safetensors"))
    assert Path(resolve_model_path(MODEL_ID, revision="v1")) == offline_cache


def test_a_local_directory_is_returned_as_it_is(tiny_model_dir: Path, offline_cache: Path) -> None:
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)
    assert not is_hub_id(str(tiny_model_dir))
    assert not is_hub_id("data/train.jsonl")  # a missing file keeps its "not found" line
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct")


@pytest.mark.parametrize(
    ("repo_id", "revision", "expected"),
    [
        ("lhr-test/absent", None, "'lhr-test/absent' is no local path"),
        (MODEL_ID, "v9", "(revision 'v9')"),
    ],
    ids=["unknown_id", "unknown_revision"],
)
def test_an_id_missing_from_an_offline_cache_is_one_line_naming_it_and_the_fix(
    offline_cache: Path, repo_id: str, revision: str | None, expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_model_path(repo_id, revision)
    (line,) = str(err.value).splitlines()
    assert expected in line and "rollout.model_path" in line
    assert "HF_HUB_OFFLINE=1" in line and f"hf download {repo_id}" in line


def test_a_dataset_id_resolves_to_its_snapshot_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.jsonl").write_text('{"prompt": "1+1="}\n')
    snapshot = add_to_hub_cache(tmp_path / "hf" / "hub", "lhr-test/sums", tmp_path / "src", repo_type="dataset")
    assert Path(resolve_dataset_path("lhr-test/sums")) == snapshot
    with pytest.raises(ConfigError, match=r"dataset\.path 'lhr-test/other' is no local path"):
        resolve_dataset_path("lhr-test/other")


def test_a_hub_id_passes_the_model_check_but_a_build_target_of_the_same_shape_does_not_count_as_one(
    tmp_path: Path,
) -> None:
    assert model_path_problems("Qwen/Qwen3-0.6B", None, build_model=False, run_dir=tmp_path) == []
    # with build_model on, 'runs/tiny' is where the tiny model is built (outside the run dir: refused as before)
    (problem,) = model_path_problems("runs/tiny", None, build_model=True, run_dir=tmp_path / "run")
    assert "outside the run's directory" in problem


def test_an_id_is_resolved_once_per_process_and_cache(offline_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    calls: list[str] = []
    real = huggingface_hub.snapshot_download

    def counted(repo_id: str, **kwargs: object) -> str:
        calls.append(repo_id)
        return real(repo_id, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", counted)
    for _ in range(3):  # the callback's setup, the engine-args check, a second key naming the same id
        assert Path(resolve_model_path(MODEL_ID, revision="v1")) == offline_cache
    assert calls == [MODEL_ID]
