"""A hub data set id (config, revision, splits) loads from the hub cache offline; a wrong split or config is one
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_hybrid_rollout.errors import DatasetError
from lightning_hybrid_rollout.sources.config import DatasetConfig
from lightning_hybrid_rollout.sources.dataset import DatasetSource
from tests.hub_cache import add_to_hub_cache

DATA_ID = "lhr-test/sums"


@pytest.fixture
def hub_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``lhr-test/sums`` in an offline ``HF_HOME``: parquet files of a ``train`` (12 rows) and a ``test`` (3) split."""
    import datasets

    src = tmp_path / "src" / "data"
    src.mkdir(parents=True)
    for split, n in (("train", 12), ("test", 3)):
        rows = [{"prompt": f"{split} {i}+1=", "answer": str(i + 1)} for i in range(n)]
        datasets.Dataset.from_list(rows).to_parquet(str(src / f"{split}-00000-of-00001.parquet"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return add_to_hub_cache(tmp_path / "hf" / "hub", DATA_ID, tmp_path / "src", repo_type="dataset")


def test_a_hub_id_trains_on_its_train_split_and_validates_on_its_test_split(hub_dataset: Path) -> None:
    source = DatasetSource(DatasetConfig(path=DATA_ID, val_path=DATA_ID), seed=0)
    prompts = {next(iter(source)).prompt for _ in range(12)}
    assert all(str(p).startswith("train ") for p in prompts)
    assert sorted(r.prompt for r in source.validation_records()) == ["test 0+1=", "test 1+1=", "test 2+1="]
    assert source.name == "sums"


def test_train_split_picks_another_split_of_the_hub_data_set(hub_dataset: Path) -> None:
    source = DatasetSource(DatasetConfig(path=DATA_ID, train_split="test"), seed=0)
    assert {next(iter(source)).prompt for _ in range(6)} == {"test 0+1=", "test 1+1=", "test 2+1="}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"train_split": "trian"}, "has the splits ['train', 'test'] but no 'trian'. Did you mean 'train'?"),
        ({"name": "nope"}, "(config 'nope') cannot be read"),
    ],
    ids=["split", "config_name"],
)
def test_a_wrong_split_or_config_of_a_hub_data_set_is_one_line(hub_dataset: Path, config: dict, expected: str) -> None:
    with pytest.raises(DatasetError) as err:
        DatasetSource(DatasetConfig(path=DATA_ID, **config), seed=0)
    (line,) = str(err.value).splitlines()
    assert expected in line and line.startswith("dataset.path: hub data set 'lhr-test/sums'")
