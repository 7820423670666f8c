"""DatasetSource: every format, chat and plain prompts, columns, shuffle, epochs, exact resume, held-out rows."""

from __future__ import annotations

import itertools
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.sources import DatasetConfig, DatasetSource, PromptRecord
from tests.sources.conftest import CHAT_ROWS, ROWS, WriteRows, write_rows_to


def draw(source: DatasetSource, n: int) -> list[PromptRecord]:
    return list(itertools.islice(iter(source), n))


def source_of(path: Any, **kwargs: Any) -> DatasetSource:
    seed = kwargs.pop("run_seed", 0)
    return DatasetSource(DatasetConfig(path=path if isinstance(path, list) else str(path), **kwargs), seed=seed)


def many_rows(n: int) -> list[dict[str, Any]]:
    return [{"prompt": f"p{i}", "answer": str(i)} for i in range(n)]


EXPECTED = [
    PromptRecord(index=i, prompt=r["prompt"], columns={"answer": r["answer"], "level": r["level"]}, epoch=0)
    for i, r in enumerate(ROWS)
]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "csv", "disk", "disk_dict"])
def test_every_format_yields_the_rows_in_file_order_with_their_columns(write_rows: WriteRows, fmt: str) -> None:
    source = source_of(write_rows(ROWS, fmt), shuffle=False)
    assert draw(source, 5) == EXPECTED
    assert source.num_rows == 5 and source.name == "train"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_list_of_files_is_read_as_one_data_set_in_order(tmp_path: Path, fmt: str) -> None:
    files = [str(write_rows_to(tmp_path / "a", ROWS[:2], fmt)), str(write_rows_to(tmp_path / "b", ROWS[2:], fmt))]
    assert draw(source_of(files, shuffle=False), 5) == EXPECTED


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "disk"])
def test_chat_prompts_come_back_as_the_exact_message_lists(write_rows: WriteRows, fmt: str) -> None:
    records = draw(source_of(write_rows(CHAT_ROWS, fmt), shuffle=False), 3)
    assert [r.prompt for r in records] == [r["prompt"] for r in CHAT_ROWS]
    assert [r.columns for r in records] == [{"answer": r["answer"]} for r in CHAT_ROWS]
    assert all(r.is_chat for r in records)


def test_message_keys_that_only_other_rows_have_are_not_added(write_rows: WriteRows) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": "hi", "name": "ann"}]},
        {"prompt": [{"role": "user", "content": "yo"}]},
    ]
    records = draw(source_of(write_rows(rows, "parquet"), shuffle=False), 2)
    assert [r.prompt for r in records] == [rows[0]["prompt"], rows[1]["prompt"]]


def test_plain_and_chat_prompts_may_mix_in_one_file(write_rows: WriteRows) -> None:
    rows = [{"prompt": "plain text"}, {"prompt": [{"role": "user", "content": "chat"}]}]
    records = draw(source_of(write_rows(rows), shuffle=False), 2)
    assert [r.prompt for r in records] == ["plain text", [{"role": "user", "content": "chat"}]]
    assert [r.columns for r in records] == [{}, {}]


def test_prompt_column_names_the_column_and_the_rest_become_columns(write_rows: WriteRows) -> None:
    rows = [{"question": "q0", "prompt": "not this", "gold": 1}]
    (record,) = draw(source_of(write_rows(rows), prompt_column="question", shuffle=False), 1)
    assert record.prompt == "q0" and record.columns == {"prompt": "not this", "gold": 1}


def test_shuffle_draws_a_new_permutation_each_epoch_reproducible_by_seed(write_rows: WriteRows) -> None:
    path = write_rows(many_rows(20))
    records = draw(source_of(path), 60)
    epochs = [[r.index for r in records[e * 20 : (e + 1) * 20]] for e in range(3)]
    assert all(sorted(order) == list(range(20)) for order in epochs)
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != list(range(20))
    assert [r.epoch for r in records] == [e for e in range(3) for _ in range(20)]
    assert draw(source_of(path), 60) == records
    assert [r.index for r in draw(source_of(path, run_seed=1), 20)] != epochs[0]


def test_config_seed_overrides_the_run_seed(write_rows: WriteRows) -> None:
    path = write_rows(many_rows(20))
    assert draw(source_of(path, seed=5, run_seed=0), 20) == draw(source_of(path, seed=5, run_seed=9), 20)
    assert draw(source_of(path, seed=5), 20) != draw(source_of(path, seed=6), 20)


def test_a_negative_run_seed_is_a_config_error(write_rows: WriteRows) -> None:
    with pytest.raises(ConfigError, match="must be an integer >= 0, got -1"):
        source_of(write_rows(ROWS), run_seed=-1)


def test_without_shuffle_every_epoch_is_file_order(write_rows: WriteRows) -> None:
    records = draw(source_of(write_rows(ROWS), shuffle=False), 15)
    assert [r.index for r in records] == [0, 1, 2, 3, 4] * 3


def test_epochs_are_counted_and_num_epochs_ends_the_stream(write_rows: WriteRows) -> None:
    source = source_of(write_rows(ROWS), num_epochs=2)
    assert source.epoch == 0
    draw(source, 4)
    assert source.epoch == 0
    draw(source, 1)
    assert source.epoch == 1
    assert len(draw(source, 100)) == 5 and source.epoch == 2
    assert draw(source, 1) == []


def test_state_dict_names_the_next_record_and_the_data(write_rows: WriteRows) -> None:
    source = source_of(write_rows(ROWS))
    draw(source, 7)
    state = source.state_dict()
    assert {k: state[k] for k in ("epoch", "position", "num_rows")} == {"epoch": 1, "position": 2, "num_rows": 5}
    assert state["fingerprint"] == source_of(write_rows(ROWS, name="copy")).fingerprint
    json.dumps(state)  # plain values, fit for any checkpoint


@pytest.mark.parametrize("first", [0, 3, 5, 7, 10])
@pytest.mark.parametrize("extra", [{}, {"val_split": 1}, {"shuffle": False}])
def test_resume_continues_exactly_across_epochs(write_rows: WriteRows, first: int, extra: dict[str, Any]) -> None:
    path = write_rows(many_rows(6 if extra.get("val_split") else 5))
    uninterrupted = draw(source_of(path, **extra), first + 10)
    original = source_of(path, **extra)
    draw(original, first)
    resumed = source_of(path, **extra)
    resumed.load_state_dict(original.state_dict())
    assert resumed.epoch == original.epoch
    assert draw(resumed, 10) == uninterrupted[first:]


def test_resume_on_a_file_with_another_row_count_raises(write_rows: WriteRows) -> None:
    source = source_of(write_rows(ROWS))
    draw(source, 3)
    other = source_of(write_rows(ROWS[:4], name="other"))
    with pytest.raises(DatasetError, match=r"had 5 training rows.*has 4 now; restore the data file"):
        other.load_state_dict(source.state_dict())


def test_resume_on_edited_prompts_of_the_same_count_warns_and_continues(
    write_rows: WriteRows, caplog: pytest.LogCaptureFixture
) -> None:
    source = source_of(write_rows(ROWS))
    draw(source, 3)
    edited = source_of(write_rows([{**r, "prompt": r["prompt"] + "?"} for r in ROWS], name="edited"))
    with caplog.at_level(logging.WARNING, logger="lightning_hybrid_rollout.sources.dataset"):
        edited.load_state_dict(source.state_dict())
    assert "prompts differ from the checkpoint's" in caplog.text
    assert edited.state_dict()["position"] == 3


def test_a_state_outside_the_data_raises(write_rows: WriteRows) -> None:
    source = source_of(write_rows(ROWS))
    with pytest.raises(DatasetError, match="position=5 outside"):
        source.load_state_dict({"epoch": 0, "position": 5, "num_rows": 5})
    with pytest.raises(DatasetError, match="lacks"):
        source.load_state_dict({"epoch": 0})


@pytest.mark.parametrize(("split", "held"), [(0.25, 5), (3, 3)])
def test_val_split_holds_out_rows_that_training_never_draws(write_rows: WriteRows, split: Any, held: int) -> None:
    path = write_rows(many_rows(20))
    source = source_of(path, val_split=split)
    val = {r.index for r in source.validation_records()}
    trained = {r.index for r in draw(source, 3 * (20 - held))}
    assert len(val) == held and source.num_rows == 20 - held
    assert val.isdisjoint(trained) and val | trained == set(range(20))
    assert [r.prompt for r in source.validation_records()] == [f"p{i}" for i in sorted(val)]
    assert {r.index for r in source_of(path, val_split=split).validation_records()} == val
    assert {r.index for r in source_of(path, val_split=split, seed=1).validation_records()} != val


def test_val_split_that_leaves_no_training_row_raises(write_rows: WriteRows) -> None:
    with pytest.raises(DatasetError, match=r"holds out 5 of the 5 rows.*use a smaller val_split"):
        source_of(write_rows(ROWS), val_split=5)


def test_val_path_rows_are_the_validation_records(write_rows: WriteRows) -> None:
    val = write_rows(CHAT_ROWS, name="val")
    source = source_of(write_rows(ROWS), val_path=str(val))
    assert [(r.index, r.prompt, r.columns) for r in source.validation_records()] == [
        (i, r["prompt"], {"answer": r["answer"]}) for i, r in enumerate(CHAT_ROWS)
    ]
    assert source.num_rows == 5


def test_no_validation_records_without_val_path_or_val_split(write_rows: WriteRows) -> None:
    assert source_of(write_rows(ROWS)).validation_records() == []


def test_preview_gives_training_rows_in_file_order_without_moving_the_stream(write_rows: WriteRows) -> None:
    source = source_of(write_rows(many_rows(10)), val_split=2)
    draw(source, 3)
    state = source.state_dict()
    preview = source.preview(100)
    assert [r.index for r in preview] == sorted(r.index for r in preview) and len(preview) == 8
    assert source.state_dict() == state


def test_loading_leaves_no_cache_next_to_the_data_in_the_hf_cache_or_in_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    hf_cache, tmp = tmp_path / "hf_cache", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(hf_cache))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    data = tmp_path / "data"
    data.mkdir()
    for fmt in ("jsonl", "parquet", "csv"):
        source_of(write_rows_to(data / "train", ROWS, fmt))
    assert sorted(p.name for p in data.iterdir()) == ["train.csv", "train.jsonl", "train.parquet"]
    assert not hf_cache.exists() and list(tmp.iterdir()) == []
