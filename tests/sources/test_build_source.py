"""build_source: every accepted spec form, and one ConfigError line (with the closest valid name) for bad ones."""

from __future__ import annotations

import itertools
import re
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.sources import DatasetConfig, DatasetSource, TaskSource, build_source, load_source_class
from tests.sources.conftest import ROWS, WriteRows
from tests.sources.test_base import Counter


@pytest.fixture
def custom_module() -> Iterator[str]:
    """A module ``lhr_test_custom_sources`` holding ``Counter`` (a PromptSource) and ``NotASource``."""
    module = types.ModuleType("lhr_test_custom_sources")
    module.Counter = Counter  # type: ignore[attr-defined]
    module.NotASource = dict  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


def test_a_source_instance_is_returned_as_is() -> None:
    source = Counter()
    assert build_source(source, seed=0) is source


def test_a_dataset_config_a_dict_or_a_path_string_build_a_dataset_source(write_rows: WriteRows) -> None:
    path = str(write_rows(ROWS))
    for spec in (DatasetConfig(path=path, shuffle=False), {"path": path, "shuffle": False}):
        source = build_source(spec, seed=0)
        assert isinstance(source, DatasetSource) and next(iter(source)).prompt == ROWS[0]["prompt"]
    assert isinstance(build_source(path, seed=0), DatasetSource)
    seeded = [r.index for r in itertools.islice(build_source(path, seed=3), 5)]
    assert seeded == [r.index for r in itertools.islice(DatasetSource(DatasetConfig(path=path), seed=3), 5)]


@pytest.mark.parametrize("name", ["arithmetic", "copy", "reverse"])
def test_a_toy_task_name_builds_a_task_source_with_the_seed_and_task_kwargs(name: str) -> None:
    source = build_source(name, seed=4, task_kwargs={"max_response_tokens": 9})
    assert isinstance(source, TaskSource) and source.name == name and source.seed == 4
    assert source.task.max_response_tokens == 9


def test_an_unknown_string_suggests_the_closest_task() -> None:
    with pytest.raises(ConfigError, match=re.escape("unknown prompt source 'arithmetc'. Did you mean 'arithmetic'?")):
        build_source("arithmetc", seed=0)


def test_an_unknown_dict_key_names_the_closest_dataset_key() -> None:
    with pytest.raises(ConfigError, match=re.escape("dataset has no key 'pth'. Did you mean 'path'?")):
        build_source({"pth": "a.jsonl"}, seed=0)


def test_a_class_path_builds_that_class_passing_init_args_and_the_seed(custom_module: str) -> None:
    source = build_source({"class_path": f"{custom_module}.Counter"}, seed=7)
    assert isinstance(source, Counter) and source.seed == 7
    own = build_source({"class_path": f"{custom_module}.Counter", "init_args": {"seed": 1}}, seed=7)
    assert isinstance(own, Counter) and own.seed == 1
    assert load_source_class(f"{custom_module}.Counter") is Counter


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"class_path": "no_such_module_xyz.Source"}, "module 'no_such_module_xyz' does not import"),
        ({"class_path": "{mod}.Countr"}, "has no 'Countr'. Did you mean 'Counter'?"),
        ({"class_path": "{mod}.NotASource"}, "is not a PromptSource subclass"),
        ({"class_path": "Counter"}, "must be a dotted path like 'my_pkg.sources.MySource'"),
        ({"class_path": "{mod}.Counter", "init_args": {"bad": 1}}, "refused init_args {'bad': 1, 'seed': 0}"),
        ({"class_path": "{mod}.Counter", "init_arg": {}}, "has no key 'init_arg'. Did you mean 'init_args'?"),
        ({"init_args": {}}, "init_args but no class_path"),
    ],
)
def test_a_bad_class_path_is_one_clear_config_error(custom_module: str, spec: dict[str, Any], expected: str) -> None:
    if "class_path" in spec:
        spec = {**spec, "class_path": spec["class_path"].format(mod=custom_module)}
    with pytest.raises(ConfigError) as info:
        build_source(spec, seed=0)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_any_other_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="got int 3"):
        build_source(3, seed=0)  # type: ignore[arg-type]
