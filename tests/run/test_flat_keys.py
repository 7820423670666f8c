"""The flat reward and multi-turn keys of earlier releases: folded into their sections for one release (Python), one
line naming the new place (YAML)."""

from __future__ import annotations

import warnings

import pytest

from lightning_hybrid_rollout import HybridRolloutCallback
from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
from lightning_hybrid_rollout.config import ConfigError, RolloutConfig
from lightning_hybrid_rollout.lightning.config_check import check_callback_args
from lightning_hybrid_rollout.rewards import RewardConfig
from lightning_hybrid_rollout.run.flat_keys import FLAT_KEYS


def test_flat_keys_land_in_their_sections_with_one_deprecation_line() -> None:
    with pytest.warns(FutureWarning, match=r"`reward_funcs` moved into the `rewards:` section.*`max_turns` moved"):
        cb = HybridRolloutCallback(
            RolloutConfig(model_path="m"),
            reward_funcs=["math_verify"],
            max_turns=3,
            environment="env.py:Env",
        )
    assert cb.run.rewards.reward_funcs == ["math_verify"]
    assert (cb.run.agentic.max_turns, cb.run.agentic.environment) == (3, "env.py:Env")


def test_a_flat_key_beside_its_section_overrides_that_key_only() -> None:
    with pytest.warns(FutureWarning):
        cb = HybridRolloutCallback(
            RolloutConfig(model_path="m"),
            rewards={"reward_funcs": ["math_verify"], "reward_workers": 2},
            reward_workers=3,
        )
    assert (cb.run.rewards.reward_funcs, cb.run.rewards.reward_workers) == (["math_verify"], 3)


def test_the_sections_take_their_objects_or_mappings_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cb = HybridRolloutCallback(
            RolloutConfig(model_path="m"),
            rewards=RewardConfig(reward_funcs=["exact_match"], reward_pool="process"),
            agentic={"tools": ["t.py:f"]},
        )
    assert cb.run.rewards.reward_pool == "process" and cb.run.agentic == AgenticConfig(tools=("t.py:f",))


def test_an_unknown_keyword_is_a_type_error_and_an_unknown_section_key_one_line() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'reward_fns'"):
        HybridRolloutCallback(RolloutConfig(model_path="m"), reward_fns=["x"])
    with pytest.raises(ConfigError, match=r"rewards has no key 'reward_fns'\. Did you mean 'reward_funcs'"):
        HybridRolloutCallback(RolloutConfig(model_path="m"), rewards={"reward_fns": ["x"]})


def test_a_yaml_flat_key_is_one_line_naming_its_new_section() -> None:
    problems = check_callback_args("cb", {"rollout": {"model_path": "m"}, "max_turns": 3, "reward_funcs": ["x.py:f"]})
    assert problems == [
        "cb.max_turns: `max_turns` moved into the `agentic:` section (agentic: {max_turns: ...}).",
        "cb.reward_funcs: `reward_funcs` moved into the `rewards:` section (rewards: {reward_funcs: ...}).",
    ]
    assert check_callback_args("cb", {"rollout": {"model_path": "m"}, "rewards": {"reward_fns": []}}) == [
        "cb.rewards has no key 'reward_fns'. Did you mean 'reward_funcs'? Valid keys: "
        + ", ".join(k for k, v in FLAT_KEYS.items() if v == "rewards")
        + "."
    ]
    assert (
        "cb.rolout is not an argument of HybridRolloutCallback. Did you mean 'rollout'?"
        in check_callback_args("cb", {"rollout": {"model_path": "m"}, "rolout": {}})[0]
    )
