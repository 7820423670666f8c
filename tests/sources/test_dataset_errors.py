"""Every unusable data set fails before anything starts, with one DatasetError line naming the file, row and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import DatasetError
from lightning_hybrid_rollout.sources import DatasetConfig, DatasetSource
from tests.sources.conftest import ROWS, WriteRows, write_rows_to


def error_of(path: Any, **kwargs: Any) -> str:
    with pytest.raises(DatasetError) as info:
        DatasetSource(DatasetConfig(path=path if isinstance(path, list) else str(path), **kwargs), seed=0)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def jsonl(tmp_path: Path, rows: list[Any], name: str = "bad.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_missing_file_names_it_and_the_accepted_forms(tmp_path: Path) -> None:
    message = error_of(tmp_path / "nope.jsonl")
    assert "nope.jsonl not found" in message
    assert "give a local .jsonl/.json/.parquet/.csv file, a save_to_disk directory or a hub data set id" in message


def test_a_missing_file_in_a_list_is_named(write_rows: WriteRows, tmp_path: Path) -> None:
    assert "b.jsonl not found" in error_of([str(write_rows(ROWS)), str(tmp_path / "b.jsonl")])


def test_a_missing_val_path_names_its_key(write_rows: WriteRows, tmp_path: Path) -> None:
    assert error_of(write_rows(ROWS), val_path=str(tmp_path / "val.jsonl")).startswith("dataset.val_path:")


def test_an_unknown_format_names_the_suffix_and_the_accepted_ones(tmp_path: Path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("hello\n")
    message = error_of(path)
    assert "unknown format '.txt'" in message and ".jsonl/.json/.parquet/.csv" in message


def test_files_of_mixed_formats_are_refused(tmp_path: Path) -> None:
    files = [str(write_rows_to(tmp_path / "a", ROWS, "jsonl")), str(write_rows_to(tmp_path / "b", ROWS, "csv"))]
    assert "mix formats (.csv, .jsonl); give files of one format" in error_of(files)


def test_a_directory_not_written_by_save_to_disk_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    assert "is a directory but not one written by datasets save_to_disk" in error_of(tmp_path / "dir")


def test_a_dataset_dict_without_train_split_names_its_splits(tmp_path: Path) -> None:
    import datasets

    datasets.DatasetDict(test=datasets.Dataset.from_list(ROWS)).save_to_disk(str(tmp_path / "dd"))
    assert "holds the splits ['test'] but no 'train'" in error_of(tmp_path / "dd")


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [("p.jsonl", "", "p.jsonl is empty"), ("p.csv", "prompt,answer\n", "p.csv has no rows")],
    ids=["empty-file", "header-only-csv"],
)
def test_a_file_without_rows_is_refused(tmp_path: Path, name: str, content: str, expected: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    message = error_of(path)
    assert expected in message and "give a file with at least one row" in message


def test_unparsable_json_names_the_file_and_format(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": \n')
    message = error_of(path)
    assert "broken.jsonl could not be read as json" in message


def test_a_missing_prompt_column_names_the_columns_found_and_the_closest(write_rows: WriteRows) -> None:
    rows = [{"prompts": "a", "answer": "b"}]
    message = error_of(write_rows(rows))
    assert "has no column 'prompt' (columns: prompts, answer). Did you mean 'prompts'?" in message
    assert "Set dataset.prompt_column" in message


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        (["hi"], "message 0 is a str, not a dict"),
        ([{"role": "user"}], "message 0: 'content' is missing"),
        ([{"role": "user", "content": 3}], "message 0: 'content' is a int, not a string"),
        ([{"content": "x"}], "message 0: 'role' is missing"),
        ([{"role": "user", "content": "a"}, {"role": "usr", "content": "b"}], "message 1 has unknown role 'usr'"),
        ([], "the prompt must be a string or a non-empty list"),
        (7, 'the prompt must be a string or a non-empty list of {"role", "content"} messages, got int'),
        (None, "got NoneType"),
        ("   ", "the prompt is empty; fill it in or drop the row"),
    ],
)
def test_a_malformed_prompt_names_its_row_and_what_is_wrong(tmp_path: Path, prompt: Any, expected: str) -> None:
    rows = [{"prompt": [{"role": "user", "content": "fine"}]}, {"prompt": prompt}]
    message = error_of(jsonl(tmp_path, rows))
    assert "bad.jsonl row 1 (counting from 0)" in message and expected in message, message


def test_an_unknown_role_suggests_the_closest(tmp_path: Path) -> None:
    message = error_of(jsonl(tmp_path, [{"prompt": [{"role": "usr", "content": "b"}]}]))
    assert "Did you mean 'user'?" in message and "Use one of system, developer, user, assistant, tool" in message


def test_a_malformed_val_path_row_is_found_too(write_rows: WriteRows, tmp_path: Path) -> None:
    val = jsonl(tmp_path, [{"prompt": "ok"}, {"prompt": "ok"}, {"prompt": [{"role": "user"}]}], name="val.jsonl")
    assert "val.jsonl row 2 (counting from 0), message 0" in error_of(write_rows(ROWS), val_path=str(val))
