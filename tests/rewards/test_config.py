"""RewardConfig: defaults, one ConfigError line per bad value, the item forms it accepts, documented fields."""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.config import field_docs
from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.rewards import BUILTINS
from lightning_hybrid_rollout.rewards.config import BUILTIN_CLASS_NAMES, BUILTIN_FUNCTION_NAMES, RewardConfig


def test_defaults_are_valid_and_weights_default_to_one_each() -> None:
    cfg = RewardConfig()
    assert (cfg.reward_funcs, cfg.reward_workers, cfg.reward_pool, cfg.reward_error) == ([], 1, "thread", "fail")
    assert cfg.reward_timeout_s == 60.0
    assert RewardConfig(reward_funcs=["math_verify", "a.b:c"]).weights == [1.0, 1.0]
    assert RewardConfig(reward_funcs=["math_verify", "a.b:c"], reward_weights=[2, 0.5]).weights == [2.0, 0.5]


def test_every_item_form_is_accepted() -> None:
    items = [
        "math_verify",
        "exact_match",
        "pkg.module:function",
        "pkg.module.function",
        "path/to/file.py:function",
        {"class_path": "format", "init_args": {"pattern": "x"}},
        {"class_path": "pkg.mod.Class"},
    ]
    assert RewardConfig(reward_funcs=items).reward_funcs == items


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"reward_funcs": ["math_verify"], "reward_weights": [1.0, 2.0]}, "has 2 weights for 1 reward_funcs"),
        ({"reward_funcs": ["math_verify"], "reward_weights": [float("nan")]}, "list of finite numbers"),
        ({"reward_workers": 0}, "reward_workers must be >= 1, got 0"),
        ({"reward_workers": True}, "reward_workers must be an integer >= 1"),
        ({"reward_pool": "fork"}, "reward_pool must be one of ['thread', 'process'], got 'fork'"),
        ({"reward_timeout_s": 0}, "reward_timeout_s must be a number > 0, got 0"),
        ({"reward_error": "ignore"}, "reward_error must be one of ['fail', 'zero'], got 'ignore'"),
        ({"reward_funcs": "math_verify"}, "reward_funcs must be a list"),
        ({"reward_funcs": [""]}, "reward_funcs[0] is an empty string"),
        ({"reward_funcs": ["rewards.py"]}, "Write 'rewards.py:function_name'"),
        ({"reward_funcs": ["math_verfy"]}, "Did you mean 'math_verify'?"),
        ({"reward_funcs": ["format"]}, "write {class_path: format, init_args: {...}}"),
        ({"reward_funcs": [{"class_path": "a.B", "args": {}}]}, "Unknown keys: args"),
        ({"reward_funcs": [{"class_path": "a.B", "init_args": [1]}]}, "init_args must be a mapping"),
        ({"reward_funcs": [3]}, "must be a string or a {class_path, init_args} mapping, got int 3"),
        ({"reward_funcs": ["mod:"]}, "must read 'module:function'"),
    ],
)
def test_a_bad_value_is_one_config_error_line_naming_the_key(kwargs: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        RewardConfig(**kwargs)
    assert len(err.value.problems) == 1
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("rewards.")


def test_several_bad_values_are_reported_together() -> None:
    with pytest.raises(ConfigError) as err:
        RewardConfig(reward_workers=0, reward_pool="x", reward_error="y")
    assert len(err.value.problems) == 3


def test_from_dict_round_trips_and_refuses_an_unknown_key_with_a_suggestion() -> None:
    cfg = RewardConfig(reward_funcs=["exact_match"], reward_weights=[0.5], reward_error="zero")
    assert RewardConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"has no key 'reward_timeout'\. Did you mean 'reward_timeout_s'"):
        RewardConfig.from_dict({"reward_timeout": 3})


def test_every_field_has_a_docstring() -> None:
    import dataclasses

    docs = field_docs(RewardConfig)
    assert set(docs) == {f.name for f in dataclasses.fields(RewardConfig)}
    assert all(len(d) > 30 for d in docs.values())


def test_the_config_knows_exactly_the_builtin_names() -> None:
    assert set(BUILTINS) == set(BUILTIN_FUNCTION_NAMES) | set(BUILTIN_CLASS_NAMES)
    assert all(isinstance(BUILTINS[n], type) for n in BUILTIN_CLASS_NAMES)
    assert not any(isinstance(BUILTINS[n], type) for n in BUILTIN_FUNCTION_NAMES)
