"""DatasetConfig: defaults, the checks of __post_init__ and from_dict (one line per bad value, with the fix)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.config import field_docs
from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.sources import DatasetConfig


def test_defaults_shuffle_endless_with_the_prompt_column() -> None:
    cfg = DatasetConfig(path="train.jsonl")
    assert (cfg.prompt_column, cfg.shuffle, cfg.seed, cfg.num_epochs, cfg.chat_template) == (
        "prompt",
        True,
        None,
        None,
        None,
    )


def test_every_field_has_a_docstring() -> None:
    assert set(field_docs(DatasetConfig)) == set(DatasetConfig.field_names())


def test_a_path_object_becomes_a_string() -> None:
    assert DatasetConfig(path=Path("a.jsonl"), val_path=[Path("v.jsonl")]).to_dict()["val_path"] == ["v.jsonl"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"path": ""}, "dataset.path must be a file or directory path"),
        ({"path": []}, "dataset.path must be a file or directory path"),
        ({"prompt_column": ""}, "dataset.prompt_column must be a non-empty string"),
        ({"chat_template": "yes"}, "dataset.chat_template must be null, true or false, got 'yes'"),
        ({"shuffle": 1}, "dataset.shuffle must be a bool"),
        ({"seed": -1}, "dataset.seed must be null or an integer >= 0, got -1"),
        ({"val_split": 1.0}, "dataset.val_split must be null, a fraction in (0, 1) or a row count >= 1, got 1.0"),
        ({"val_split": 0}, "dataset.val_split must be null, a fraction in (0, 1) or a row count >= 1, got 0"),
        ({"val_split": True}, "dataset.val_split must be null, a fraction in (0, 1) or a row count >= 1"),
        ({"val_split": 0.1, "val_path": "v.jsonl"}, "dataset.val_split must be null when val_path is set"),
        ({"num_epochs": 0}, "dataset.num_epochs must be null or an integer >= 1, got 0"),
        ({"system_prompt": "x", "chat_template": False}, "set chat_template to null or true, or drop system_prompt"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key_and_the_fix(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        DatasetConfig(**{"path": "train.jsonl", **kwargs})
    assert len(info.value.problems) == 1 and expected in info.value.problems[0]


def test_all_bad_values_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        DatasetConfig(path="", shuffle="no", num_epochs=-2)  # type: ignore[arg-type]
    assert len(info.value.problems) == 3


def test_from_dict_names_an_unknown_key_and_the_closest_valid_one() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("dataset has no key 'promt_column'. Did you mean 'prompt_column'?")
    ):
        DatasetConfig.from_dict({"path": "a.jsonl", "promt_column": "q"})
    with pytest.raises(ConfigError, match=re.escape("dataset.path is missing")):
        DatasetConfig.from_dict({"shuffle": False})


def test_to_dict_round_trips() -> None:
    cfg = DatasetConfig(path=["a.jsonl", "b.jsonl"], val_split=3, seed=2, system_prompt="s")
    assert DatasetConfig.from_dict(cfg.to_dict()) == cfg
