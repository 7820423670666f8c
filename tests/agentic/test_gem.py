"""A real GEM environment (``gem-llm``, installed by scripts/install.sh) works without a wrapper: ``environment:
gem:make`` with the game's id in ``environment_kwargs`` loads it as Gymnasium's convention, and its episodes run
through the driver on a scripted replica (GEM's own reset text, hints, turn limit and reward); the example config
that trains on it passes the callback's check."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_hybrid_rollout.agentic import load_environment
from lightning_hybrid_rollout.agentic.environments import GymEnvironment
from lightning_hybrid_rollout.agentic.runtime import AgenticConfig, EpisodeDriver

from .test_runtime import ScriptedReplica, run_episodes

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gem") is None,
    reason="GEM is not installed: pip install --no-deps gem-llm==0.1.0 (scripts/install.sh does it)",
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gem_guess_the_number_cpu.yaml"
GAME = {"env_id": "game:GuessTheNumber-v0-easy"}  # 1 to 10, at most 4 turns


def test_gems_factory_loads_the_game_as_a_gymnasium_environment() -> None:
    env = load_environment("gem:make", GAME).make()
    assert isinstance(env, GymEnvironment) and type(env.env).__module__.startswith("gem.")
    text = env.reset({"prompt": "ignored"}, seed=3)  # GEM's reset takes no options: the row is not passed
    assert "Guess The Number" in text and "\\boxed{}" in text
    step = env.step("My guess: \\boxed{11}")
    assert not step.done and "outside the range" in step.observation


def test_gem_episodes_run_through_the_driver_with_gems_hints_turn_limit_and_reward(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    spans: list[tuple[str, dict[str, Any]]] = []
    driver = EpisodeDriver(
        AgenticConfig(environment="gem:make", environment_kwargs=GAME, max_turns=6, max_episode_tokens=1024),
        tok,
        max_turn_tokens=64,
        on_span=lambda name, start, end, args: spans.append((name, dict(args))),
    )
    script = [f"I guess \\boxed{{{k}}}." for k in (1, 2, 3, 4)]
    samples = run_episodes([ScriptedReplica("r0", tok, script)], driver, n=4)
    assert len(samples) == 4
    for sample in samples:
        ep = sample.metadata["episode"]
        hints = [m["content"] for m in ep["messages"][1:] if m["role"] == "user"]
        assert "Guess The Number" in ep["messages"][0]["content"]  # GEM's reset text, in the prompt
        assert ep["stop_reason"] == "environment_done" and 1 <= ep["turns"] <= 4  # GEM's own limit: 4 turns
        assert all(h.startswith(f"At turn {i + 1}, you guessed {i + 1}") for i, h in enumerate(hints))
        if ep["turns"] < 4:  # the secret was guessed: GEM's success reward, ending the episode
            assert ep["env_reward"] == 1.0
        else:  # the last turn: 1 - distance / range, or 1.0 when the fourth guess was right
            assert 0.0 < ep["env_reward"] <= 1.0
    resets = [a for name, a in spans if name == "env.reset"]
    steps = [a for name, a in spans if name == "env.step"]
    assert len(resets) == 4 and len(steps) == sum(s.metadata["episode"]["turns"] for s in samples)
    assert all(a["status"] == "ok" for _, a in spans)


def test_the_gem_example_config_is_accepted_and_scores_gems_reward_plus_its_format_bonus(
    smollm2_tokenizer, tmp_path: Path
) -> None:
    from lightning_hybrid_rollout import HybridRolloutCallback
    from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
    from lightning_hybrid_rollout.lightning.config_check import check_init_args
    from lightning_hybrid_rollout.run.workload import build_workload

    [init_args] = [
        c["init_args"]
        for c in yaml.safe_load(EXAMPLE.read_text())["trainer"]["callbacks"]
        if c["class_path"].endswith("HybridRolloutCallback")
    ]
    assert check_init_args("callback", HybridRolloutCallback, init_args) == []
    assert init_args["agentic"]["environment"] == "gem:make" and "dataset" not in init_args
    rollout = RolloutConfig(**{**init_args["rollout"], "model_path": str(tmp_path)})
    callback = HybridRolloutCallback(
        **{**init_args, "rollout": rollout, "async_training": AsyncTrainingConfig(**init_args["async_training"])}
    )
    workload = build_workload(
        dataset=callback.run.dataset,
        task=callback.run.task_name,
        task_kwargs=callback.run.task_kwargs,
        rewards=callback.run.rewards,
        rollout=callback.run.rollout,
        tokenizer=smollm2_tokenizer,
        agentic=callback.run.agentic,
    )
    try:
        assert workload.episodes is not None and workload.runner is not None
        script = ["Guess: 7"]  # a bare number: GEM ends the episode (-0.1), the format bonus gives 0.05
        [sample] = run_episodes([ScriptedReplica("r0", smollm2_tokenizer, script)], workload.episodes, n=1)
        assert sample.metadata["episode"]["env_reward"] == -0.1
        [reward] = asyncio.run(workload.scorer().score_group([sample]))
        assert reward == pytest.approx(-0.05)
    finally:
        workload.close()
