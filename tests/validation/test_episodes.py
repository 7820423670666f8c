"""Validation of an agentic run: each held-out prompt is played as one whole greedy episode against the run's own
environment and tools, and scored as the rollouter scores a training episode (``val/episode_reward``,
``val/turns``).

The model is :class:`TurnScriptedLM`, whose answer to a row depends only on how many model turns the row already
holds, so every episode's turns, tool calls and rewards are known in advance; the tokenizer is the tiny model's
character tokenizer (``PLAIN_CHAT_TEMPLATE``). ``test_lhr_validate_*`` runs the real CLI on the tiny random model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml

from lightning_hybrid_rollout.agentic import AgenticConfig, EpisodeDriver
from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.lightning import cli
from lightning_hybrid_rollout.models.tiny_model import EOS_ID, build_tiny_tokenizer
from lightning_hybrid_rollout.rewards import RewardFunction, RewardRunner
from lightning_hybrid_rollout.run.workload import PROMPT_KEY, RESERVED_KEYS, ResetPrompts, Workload
from lightning_hybrid_rollout.sources import PromptRecord, PromptRenderer, PromptSource
from lightning_hybrid_rollout.validation.answers import (
    VAL_EPISODE_REWARD,
    VAL_TURNS,
    ValidationSet,
)
from lightning_hybrid_rollout.validation.attach import attach_validation
from lightning_hybrid_rollout.validation.episodes import EpisodeValidationResult, EpisodeValidationSet
from tests.lightning import _validation_envs

ENVS = "tests.lightning._validation_envs"  # a dotted path: the same module (and SEEN) as imported here


class TurnScriptedLM(torch.nn.Module):
    """A stand-in causal LM: a row holding ``k`` end tokens (``k`` model turns so far) gets ``scripts[k]`` and the
    end token; records each ``generate`` call's kwargs with the model's mode and grad state."""

    def __init__(self, tok: Any, scripts: Sequence[str]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.answers = [[*tok(s, add_special_tokens=False)["input_ids"], EOS_ID] for s in scripts]
        self.calls: list[dict[str, Any]] = []

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append({"rows": len(input_ids), "training": self.training, "grad": torch.is_grad_enabled()} | kwargs)
        answers = [self.answers[min(int((row == EOS_ID).sum()), len(self.answers) - 1)] for row in input_ids]
        width = max(map(len, answers))
        new = torch.full((len(input_ids), width), kwargs["pad_token_id"], dtype=torch.long)
        for r, a in enumerate(answers):
            new[r, : len(a)] = torch.tensor(a, dtype=torch.long)
        return torch.cat([input_ids, new[:, : kwargs["max_new_tokens"]]], dim=1)


class Rows(PromptSource):
    """Held-out rows only (``validation_records``): prompt ``"go"``, the given columns."""

    name = "rows"

    def __init__(self, columns: Sequence[Mapping[str, Any]], first_index: int = 0) -> None:
        self.records = [
            PromptRecord(index=first_index + i, prompt="go", columns=dict(c)) for i, c in enumerate(columns)
        ]

    def __iter__(self) -> Any:
        yield from self.records

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass

    @property
    def epoch(self) -> int:
        return 0

    def validation_records(self) -> list[PromptRecord]:
        return list(self.records)


class LastTurn:
    """A reward function recording its completions: ``value`` for a completion equal to ``target``, else 0."""

    __name__ = "last_turn"

    def __init__(self, target: str, value: float = 0.5) -> None:
        self.target, self.value = target, value
        self.completions: list[Any] = []

    def __call__(self, prompts: list, completions: list, completion_ids: list, **columns: Any) -> list[float]:
        self.completions.extend(completions)
        return [self.value if c == self.target else 0.0 for c in completions]


@pytest.fixture
def tok() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    _validation_envs.SEEN.clear()


def agentic_workload(
    tok: Any,
    source: PromptSource | None = None,
    reward: Any = None,
    max_turns: int = 4,
    turn_tokens: int = 4,
    **agentic: Any,
) -> Workload:
    agentic.setdefault("environment", f"{ENVS}:Guess")
    config = AgenticConfig(max_turns=max_turns, max_episode_tokens=256, **agentic)
    driver = EpisodeDriver(
        config, tok, max_turn_tokens=turn_tokens, prompt_key=PROMPT_KEY, reserved_keys=tuple(RESERVED_KEYS)
    )
    return Workload(
        source=source if source is not None else ResetPrompts(),
        renderer=PromptRenderer(tok, prompt_length=64),
        runner=None if reward is None else RewardRunner([RewardFunction(name=reward.__name__, fn=reward)]),
        tokenizer=tok,
        stop_token_ids=(EOS_ID,),
        episodes=driver,
    )


def validate(vs: EpisodeValidationSet, model: Any) -> EpisodeValidationResult:
    try:
        return EpisodeValidationResult.combine(vs.generate_and_score(model, b, "cpu") for b in vs.batches())
    finally:
        vs.close()


# ------------------------------------------------------------------------------------------------ the episodes


def test_an_environment_only_run_plays_whole_greedy_episodes_and_reports_episode_reward_and_turns(tok: Any) -> None:
    """No data set, no reward function: each held-out episode is a reset of the environment (seeds from 10000),
    played turn after turn until the environment says done; its reward is the environment's."""
    workload = agentic_workload(tok, environment_kwargs={"secret": 3})
    vs = EpisodeValidationSet.from_workload(workload, limit=5, batch_size=2)
    model = TurnScriptedLM(tok, ["1", "2", "3", "4"])
    model.train()
    result = validate(vs, model)
    metrics = result.metrics()
    assert result.num_episodes == 5
    assert metrics[VAL_TURNS] == 3.0  # "1" and "2" are wrong, "3" is right: three model turns, whole episodes
    assert metrics[VAL_EPISODE_REWARD] == metrics["val/env_reward"] == metrics["val/pass@1"] == 1.0
    assert metrics["val/tool_calls"] == 15.0 and metrics["val/tool_errors"] == 0.0
    assert [seed for seed, _ in _validation_envs.SEEN] == [10_000, 10_001, 10_002, 10_003, 10_004]
    assert len(model.calls) == 3 * 3  # batches of 2, 2, 1 episodes: one generate call per turn of each batch
    assert all(not c["do_sample"] and not c["training"] and not c["grad"] for c in model.calls)  # greedy, eval
    assert all(c["max_new_tokens"] == 4 for c in model.calls)  # rollout.response_length per model turn
    assert model.training  # its mode is given back
    workload.close()


def test_an_episode_that_never_finds_the_answer_runs_to_max_turns_and_its_penalties_count(tok: Any) -> None:
    workload = agentic_workload(tok, max_turns=3, environment_kwargs={"secret": 7, "penalty": -0.25})
    result = validate(EpisodeValidationSet.from_workload(workload, limit=2), TurnScriptedLM(tok, ["1"]))
    metrics = result.metrics()
    assert metrics[VAL_TURNS] == 3.0 and metrics["val/pass@1"] == 0.0
    # the environment steps every model turn, the last one too (the budget ends the episode after its step)
    assert metrics[VAL_EPISODE_REWARD] == pytest.approx(3 * -0.25)
    workload.close()


def test_an_answer_found_on_the_last_allowed_turn_is_stepped_and_rewarded(tok: Any) -> None:
    """EpisodeDriver.after_turn (training's too): a Gymnasium episode that reaches max_turns steps its last action,
    so the third of three guesses can still win (it scored 0 while the last turn went unstepped)."""
    workload = agentic_workload(tok, max_turns=3, environment_kwargs={"secret": 3})
    result = validate(EpisodeValidationSet.from_workload(workload, limit=2), TurnScriptedLM(tok, ["1", "2", "3"]))
    metrics = result.metrics()
    assert metrics[VAL_TURNS] == 3.0 and metrics[VAL_EPISODE_REWARD] == 1.0
    assert metrics["val/tool_calls"] == 6.0  # 2 episodes: every turn of each reached the environment
    workload.close()


def test_each_row_reaches_the_environment_with_the_seed_of_its_record_index(tok: Any) -> None:
    source = Rows([{"secret": 1}, {"secret": 2}, {"secret": 3}], first_index=40)
    workload = agentic_workload(tok, source=source)
    vs = EpisodeValidationSet.from_workload(workload, seed=500)
    result = validate(vs, TurnScriptedLM(tok, ["1", "2", "3"]))
    assert sorted(_validation_envs.SEEN) == [(540, {"secret": 1}), (541, {"secret": 2}), (542, {"secret": 3})]
    assert result.metrics()[VAL_TURNS] == pytest.approx((1 + 2 + 3) / 3)  # each stops at its own secret
    assert result.metrics()[VAL_EPISODE_REWARD] == 1.0
    workload.close()


def test_reward_functions_score_the_last_model_turn_and_add_the_environment_reward(tok: Any) -> None:
    reward = LastTurn("3")
    workload = agentic_workload(tok, reward=reward, environment_kwargs={"secret": 3})
    result = validate(EpisodeValidationSet.from_workload(workload, limit=2), TurnScriptedLM(tok, ["1", "3"]))
    assert reward.completions == ["3", "3"]  # the final answer, as the rollouter gives it in training
    metrics = result.metrics()
    assert metrics[VAL_EPISODE_REWARD] == pytest.approx(0.5 + 1.0)
    assert metrics["val/rewards/last_turn_mean"] == 0.5 and metrics["val/env_reward"] == 1.0
    assert "train/rewards/last_turn_mean" not in workload.runner.take_stats()  # a runner of its own
    workload.close()


def test_tools_are_called_between_model_turns_and_the_episode_ends_on_an_answer_without_a_call(tok: Any) -> None:
    reward = LastTurn("5", value=1.0)
    workload = agentic_workload(
        tok,
        source=Rows([{}, {}]),
        reward=reward,
        environment=None,
        tools=[f"{ENVS}:add"],
        tool_parser="lhr_test_words",
        turn_tokens=16,
    )
    result = validate(EpisodeValidationSet.from_workload(workload), TurnScriptedLM(tok, ["call add 2 3", "5"]))
    metrics = result.metrics()
    assert metrics[VAL_TURNS] == 2.0 and metrics["val/tool_calls"] == 2.0 and metrics[VAL_EPISODE_REWARD] == 1.0
    assert "val/env_reward" not in metrics  # no environment
    workload.close()


def test_the_validation_driver_is_its_own_and_the_training_window_stays_empty(tok: Any) -> None:
    workload = agentic_workload(tok)
    vs = EpisodeValidationSet.from_workload(workload, limit=2)
    assert vs.driver is not workload.episodes and vs.driver.budget == workload.episodes.budget
    validate(vs, TurnScriptedLM(tok, ["3"]))
    assert workload.episodes.take_window().episodes == 0
    workload.close()


# ------------------------------------------------------------------------------------------ settings and merging


@pytest.mark.parametrize("kwargs", [{"n": 4}, {"temperature": 0.7}], ids=["val_n", "val_temperature"])
def test_single_answer_sampling_settings_still_validate_one_greedy_episode_per_prompt_and_say_so(
    tok: Any, kwargs: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """An environment added to a single-answer config (val_n: 4) validates as it is: the setting is logged unused."""
    workload = agentic_workload(tok)
    with caplog.at_level(logging.INFO):
        vs = EpisodeValidationSet.from_workload(workload, **kwargs)
    assert isinstance(vs, EpisodeValidationSet)
    assert "one greedy episode per held-out prompt" in caplog.text and "left unused" in caplog.text
    vs.close()
    workload.close()


def test_a_single_turn_workload_is_refused_by_the_episode_set(tok: Any) -> None:
    workload = Workload(ResetPrompts(), PromptRenderer(tok, prompt_length=8), None, tok, (EOS_ID,))
    with pytest.raises(ConfigError, match="needs an agentic run"):
        EpisodeValidationSet.from_workload(workload)


def test_results_merge_as_sums_and_name_the_documented_metrics() -> None:
    a = EpisodeValidationResult(num_episodes=2, reward_sum=1.0, passed=1, turns_sum=5, tool_calls=3)
    b = EpisodeValidationResult(num_episodes=1, reward_sum=0.5, turns_sum=1, env_reward_sum=0.5, env_rewards=1)
    b.function_sums, b.function_counts = {"acc": 0.5}, {"acc": 1}
    total = EpisodeValidationResult.combine([a, b])
    assert (total.num_episodes, total.reward_sum, total.turns_sum) == (3, 1.5, 6)
    assert total.metrics()[VAL_EPISODE_REWARD] == 0.5 and total.metrics()[VAL_TURNS] == 2.0
    assert set(total.metrics()) == {
        "val/episode_reward",
        "val/turns",
        "val/pass@1",
        "val/truncated_fraction",
        "val/tool_calls",
        "val/tool_errors",
        "val/reward_errors",
        "val/env_reward",
        "val/rewards/acc_mean",
    }
    assert EpisodeValidationResult().metrics() == {}
    assert (VAL_EPISODE_REWARD, VAL_TURNS) == ("val/episode_reward", "val/turns")


class _DataModule:
    def __init__(self, limit_val_batches: float = 1.0, **hparams: Any) -> None:
        self.hparams = hparams
        self.trainer = SimpleNamespace(limit_val_batches=limit_val_batches)
        self.validation_set: Any = None

    def attach_validation(self, validation_set: Any) -> None:
        self.validation_set = validation_set


def test_attach_validation_gives_an_environment_only_run_episodes_in_lhr_validate_only(
    tok: Any, caplog: pytest.LogCaptureFixture
) -> None:
    workload = agentic_workload(tok)
    assert attach_validation(workload, _DataModule(), max_new_tokens=4, during_fit=True) is None  # no val_path
    dm = _DataModule(limit_val_batches=0, val_prompts=3, val_seed=7)
    with caplog.at_level(logging.WARNING):
        vs = attach_validation(workload, dm, max_new_tokens=4, during_fit=False)
    assert isinstance(vs, EpisodeValidationSet) and dm.validation_set is vs
    assert (len(vs.records), vs.seed) == (3, 7)
    assert "limit_val_batches is 0" in caplog.text and "--trainer.limit_val_batches=1.0" in caplog.text
    with caplog.at_level(logging.INFO):  # val_n of a single-answer config: one greedy episode per prompt still
        sampled = attach_validation(workload, _DataModule(val_n=4), max_new_tokens=4, during_fit=False)
    assert isinstance(sampled, EpisodeValidationSet) and "val_n=4" in caplog.text
    sampled.close()
    vs.close()
    workload.close()


def test_a_single_turn_run_still_gets_the_single_answer_set(tok: Any) -> None:
    source = Rows([{}])
    runner = RewardRunner([RewardFunction(name="last_turn", fn=LastTurn("x"))])
    workload = Workload(source, PromptRenderer(tok, prompt_length=8), runner, tok, (EOS_ID,))
    vs = attach_validation(workload, _DataModule(), max_new_tokens=4, during_fit=False)
    assert type(vs) is ValidationSet
    vs.close()
    workload.close()


# ------------------------------------------------------------------------------------------- through the CLI


def test_lhr_validate_plays_episodes_of_an_environment_only_run_with_the_tiny_model(tmp_path: Path) -> None:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model", hidden=64, layers=1, seed=0)
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "strategy": "hybrid_single_device",
            "default_root_dir": str(tmp_path / "run"),
            "logger": False,
            "enable_progress_bar": False,
            "callbacks": [
                {
                    "class_path": "lightning_hybrid_rollout.HybridRolloutCallback",
                    "init_args": {
                        "agentic": {
                            "environment": f"{ENVS}:Guess",
                            "environment_kwargs": {"secret": 3},
                            "max_turns": 3,
                            "max_episode_tokens": 96,
                        },
                        "rollout": {"model_path": str(model_dir), "response_length": 4, "prompt_length": 16},
                    },
                }
            ],
        },
        "model": {"class_path": "lightning_hybrid_rollout.GRPOModule"},
        "data": {"class_path": "lightning_hybrid_rollout.RolloutDataModule", "init_args": {"val_prompts": 4}},
    }
    path = tmp_path / "validate.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    metrics = cli.cli_main(["validate", "--config", str(path)]).trainer.callback_metrics
    assert 0.0 <= float(metrics[VAL_EPISODE_REWARD]) <= 1.0
    assert 1.0 <= float(metrics[VAL_TURNS]) <= 3.0
    assert [seed for seed, _ in _validation_envs.SEEN] == [10_000, 10_001, 10_002, 10_003]
