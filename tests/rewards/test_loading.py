"""load_reward_functions / check_signature: every item form loads, every bad item is one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import RewardFunctionError
from lightning_hybrid_rollout.rewards import (
    FormatReward,
    RewardConfig,
    check_signature,
    exact_match,
    load_reward_functions,
    math_verify,
)

from .conftest import FIXTURE


def load(*items: Any, columns: Any = None, weights: list[float] | None = None) -> list:
    return load_reward_functions(RewardConfig(reward_funcs=list(items), reward_weights=weights), columns)


def load_error(*items: Any, columns: Any = None) -> str:
    with pytest.raises(RewardFunctionError) as err:
        load(*items, columns=columns)
    return str(err.value)


def test_a_module_path_loads_the_function() -> None:
    (f,) = load("tests.rewards.my_rewards:accuracy", weights=[0.5])
    assert (f.name, f.weight, f.spec, f.item) == ("accuracy", 0.5, "tests.rewards.my_rewards:accuracy", f.spec)
    assert f.fn(completions=["7"], answer=["7"]) == [1.0]


def test_trls_dotted_module_path_loads_the_function() -> None:
    (f,) = load("tests.rewards.my_rewards.reward_len")
    assert f.name == "reward_len"


def test_a_file_path_relative_to_the_current_directory_loads_the_function() -> None:
    (f,) = load(f"{FIXTURE}:reward_len")
    assert f.name == "reward_len"
    assert f.fn(completions=[[{"role": "assistant", "content": "x" * 18}]]) == [-2]


def test_a_file_path_is_resolved_against_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.py").write_text("def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    (f,) = load("mine.py:score")
    assert f.fn(completions=["a"]) == [1.0]


def test_builtin_names_load_the_builtins() -> None:
    fs = load("math_verify", "exact_match")
    assert [f.fn for f in fs] == [math_verify, exact_match]


def test_a_class_path_builds_an_instance_with_its_init_args() -> None:
    (f,) = load({"class_path": "tests.rewards.my_rewards.LengthPenalty", "init_args": {"target": 3}})
    assert f.name == "LengthPenalty" and f.fn.target == 3
    assert f.spec == "tests.rewards.my_rewards.LengthPenalty(target=3)"
    (g,) = load({"class_path": f"{FIXTURE}:LengthPenalty", "init_args": {"target": 1}})
    assert g.fn(completions=["abc"]) == [-2]


def test_the_builtin_format_class_loads_by_its_short_name() -> None:
    (f,) = load({"class_path": "format", "init_args": {"pattern": "[0-9]+", "search": True}})
    assert isinstance(f.fn, FormatReward) and f.fn(["the answer is 7"]) == [1.0]


def test_repeated_functions_get_unique_names_in_order() -> None:
    names = [f.name for f in load("exact_match", "exact_match", f"{FIXTURE}:accuracy", "exact_match")]
    assert names == ["exact_match", "exact_match_2", "accuracy", "exact_match_3"]


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("no_such_pkg_xyz.rewards:fn", "module 'no_such_pkg_xyz.rewards' does not import: ModuleNotFoundError: No"),
        ("tests/rewards/missing.py:fn", "missing.py' not found (a relative path is read from the current directory"),
        (f"{FIXTURE}:acuracy", "has no attribute 'acuracy'. Did you mean 'accuracy'? Its callables: LengthPenalty"),
        ("tests.rewards.my_rewards:nothing_like_it", "has no attribute 'nothing_like_it'. Its callables:"),
        (f"{FIXTURE}:NOT_CALLABLE", "is a int (3), not callable"),
        (f"{FIXTURE}:LengthPenalty", "is a class; give {class_path: tests/rewards/my_rewards.py:LengthPenalty,"),
        ({"class_path": "tests.rewards.my_rewards.accuracy"}, "is a function, not a class"),
        ({"class_path": "tests.rewards.my_rewards.LengthPenalty"}, "init_args do not fit LengthPenalty(target: int)"),
        ({"class_path": "tests.rewards.my_rewards.LengthPenalty", "init_args": {"tgt": 1}}, "TypeError: "),
        ({"class_path": "tests.rewards.my_rewards.NotCallable"}, "instances of NotCallable are not callable"),
        ({"class_path": "format", "init_args": {"pattern": "("}}, "is not a valid regular expression"),
        ({"class_path": "exact_match"}, "the built-in 'exact_match' is a function, not a class"),
        (f"{FIXTURE}:positional_only", "parameter 'completions' is positional-only"),
    ],
)
def test_a_bad_item_is_one_line_naming_it_and_what_is_wrong(item: Any, expected: str) -> None:
    message = load_error(item)
    assert expected in message
    assert "\n" not in message
    assert message.startswith("reward function ")


def test_a_file_that_raises_on_import_is_one_line_with_its_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.py"
    bad.write_text("def f(completions, **kw):\n    return []\nraise RuntimeError('no GPU\\nhere')\n")
    message = load_error(f"{bad}:f")
    assert "broken.py' does not import: RuntimeError: no GPU here; fix the file" in message
    assert "\n" not in message


def test_all_bad_items_are_reported_together_before_anything_runs() -> None:
    message = load_error("exact_match", f"{FIXTURE}:acuracy", "no_such_pkg_xyz:f")
    assert message.startswith("2 reward functions cannot be used:")
    assert "'acuracy'" in message and "no_such_pkg_xyz" in message and len(message.splitlines()) == 3


def test_a_required_parameter_that_is_no_argument_nor_column_is_refused_by_name() -> None:
    message = load_error(f"{FIXTURE}:needs_judge", columns=["answer"])
    assert (
        "parameter 'judge_url' is required but is none of prompts, completions, completion_ids or the data" in message
    )
    assert "columns (answer); give it a default" in message and "\n" not in message


def test_a_required_column_parameter_is_accepted_once_the_column_is_known() -> None:
    def f(completions: Any, answer: Any, **kwargs: Any) -> list[float]:
        return []

    check_signature(f, "f", columns=["answer", "task"])
    check_signature(f, "f", columns=None)  # columns unknown: checked at call time
    with pytest.raises(RewardFunctionError, match=r"'answer' is required .* columns \(solution\)"):
        check_signature(f, "f", columns=["solution"])


def test_a_function_without_kwargs_must_name_every_argument_it_is_called_with() -> None:
    (f,) = load(f"{FIXTURE}:only_named")
    assert f.name == "only_named"
    message = load_error(f"{FIXTURE}:only_named", columns=["answer"])
    assert "does not accept the keyword argument 'answer'" in message and "add **kwargs" in message


def test_a_function_without_kwargs_missing_a_trl_argument_is_refused() -> None:
    def f(completions: Any, answer: Any) -> list[float]:
        return []

    with pytest.raises(RewardFunctionError, match="does not accept the keyword argument 'prompts'"):
        check_signature(f, "f", columns=["answer"])


def test_defaulted_and_var_positional_parameters_are_fine() -> None:
    def f(*args: Any, completions: Any, scale: float = 1.0, **kwargs: Any) -> list[float]:
        return []

    check_signature(f, "f", columns=[])
    check_signature(next, "next", columns=[])  # a signature that cannot be read is not checked
