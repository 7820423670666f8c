"""Environments by import path: TRL's convention and Gymnasium's behind one adapter; bad input in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_hybrid_rollout.agentic.environments import (
    GymEnvironment,
    TrlEnvironment,
    append_to_prompt,
    load_environment,
)
from lightning_hybrid_rollout.errors import AgentEnvironmentError

FILE = os.path.relpath(Path(__file__).resolve().parent / "my_envs.py")


def test_trl_environment_resets_on_the_row_and_exposes_its_public_methods_as_tools() -> None:
    factory = load_environment(f"{FILE}:CounterEnv", {"start": 1})
    env = factory.make()
    assert isinstance(env, TrlEnvironment) and env.kind == "trl"
    assert sorted(t.name for t in env.tools) == ["increment", "step"]  # step(message) is a tool here
    assert env.reset({"target": 3, "prompt": "ignored"}) == "Reach 3."
    increment = next(t for t in env.tools if t.name == "increment")
    assert increment.fn(by=2) == 3 and env.reward() == 1.0
    with pytest.raises(NotImplementedError):
        env.step("3")
    assert factory.make() is not env and factory.made == 2  # one instance per episode


def test_gym_environment_resets_with_seed_and_the_row_as_options_then_steps() -> None:
    factory = load_environment(f"{FILE}:GuessEnv", {"secret": 2})
    env = factory.make()
    assert isinstance(env, GymEnvironment) and env.tools == []
    assert env.reset({"level": 1}, seed=7) == "Guess a number from 1 to 5."
    assert (env.env.seen_seed, env.env.seen_options) == (7, {"level": 1})
    wrong = env.step("4")
    assert (wrong.observation, wrong.reward, wrong.done) == ("Wrong, try again.", -0.1, False)
    right = env.step(" 2 ")
    assert right.terminated and right.done and right.info == {"steps": 2}
    assert env.reward() == pytest.approx(0.9)


def test_a_reset_without_options_gets_only_the_seed() -> None:
    env = load_environment(f"{FILE}:SeedOnlyEnv").make()
    assert env.reset({"level": 1}, seed=3) == "Go." and env.env.seen_seed == 3


def test_a_factory_function_makes_the_environment_from_its_kwargs() -> None:
    env = load_environment("tests.agentic.my_envs:make", {"env_id": "guess", "secret": 5}).make()
    assert isinstance(env, GymEnvironment) and env.env.secret == 5
    trl = load_environment("tests.agentic.my_envs:make", {"env_id": "counter"}).make()
    assert isinstance(trl, TrlEnvironment)


def test_a_step_of_the_wrong_shape_ends_the_episode_counted_never_the_run() -> None:
    factory = load_environment(f"{FILE}:FourTupleEnv")
    env = factory.make()
    env.reset({})
    result = env.step("1")
    assert result.done and "returned a 4-tuple" in result.error and "(observation, reward, terminated" in result.error
    assert factory.bad_steps == 1


def test_the_convention_can_be_forced_and_an_undocumented_public_method_is_one_line() -> None:
    assert isinstance(load_environment(f"{FILE}:CounterEnv", convention="gym").make(), GymEnvironment)
    with pytest.raises(AgentEnvironmentError) as err:  # as TRL's, GuessEnv's step() would be an undescribed tool
        load_environment(f"{FILE}:GuessEnv", convention="trl").make()
    assert "public method 'step' is not a tool" in str(err.value) and "no docstring" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nowhere/my_env.py:Env", "not found"),
        (f"{FILE}:GuesEnv", "Did you mean 'GuessEnv'?"),
        (f"{FILE}:NoReset", "has no reset() method"),
        (f"{FILE}:ENVS", "is a dict, not a class or factory function"),
    ],
)
def test_bad_environment_input_is_one_line(spec: str, says: str) -> None:
    with pytest.raises(AgentEnvironmentError) as err:
        load_environment(spec)
    assert says in str(err.value) and "\n" not in str(err.value) and spec in str(err.value)


def test_bad_kwargs_and_a_reset_of_the_wrong_shape_are_one_line() -> None:
    with pytest.raises(AgentEnvironmentError, match="cannot be built with environment_kwargs"):
        load_environment(f"{FILE}:GuessEnv", {"colour": "red"}).make()
    env = load_environment(f"{FILE}:GuessEnv").make()
    env.env.reset = lambda seed=None, options=None: "just text"
    with pytest.raises(AgentEnvironmentError, match=r"returns \(observation, info\)"):
        env.reset({})


def test_reset_text_is_appended_to_the_last_user_message() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert append_to_prompt(messages, "more")[-1] == {"role": "user", "content": "q\n\nmore"}
    assert messages[-1]["content"] == "q"  # not modified in place
    assert append_to_prompt("q", "more") == "q\n\nmore" and append_to_prompt(messages, None) is messages
    assert append_to_prompt([{"role": "system", "content": "s"}], "obs")[-1] == {"role": "user", "content": "obs"}
