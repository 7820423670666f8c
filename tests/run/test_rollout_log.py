"""``log_rollouts``: the first N samples of a cycle written as JSON lines; the callback's agentic section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.run.rollout_log import RolloutLog


def _episode(uid: str, reward: float) -> Sample:
    messages = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    return Sample(
        uid,
        "g0",
        "2+3?",
        [1, 2],
        [10, 11, 20, 21, 12],
        [-0.5, -0.5, 0.0, 0.0, -0.25],
        reward=reward,
        min_weight_version=3,
        max_weight_version=4,
        metadata={
            "episode": {"messages": messages, "turns": 2, "stop_reason": "no_tool_call", "weight_versions": [3, 4]}
        },
        loss_mask=[1, 1, 0, 0, 1],
    )


def test_the_first_n_samples_of_each_cycle_are_written_with_their_tokens_mask_and_versions(tmp_path: Path) -> None:
    log = RolloutLog(tmp_path, per_cycle=2)
    log.keep([_episode("a", 1.0)])
    log.keep([_episode("b", 0.0), _episode("c", 0.5)])
    path = log.write(3)
    assert path == tmp_path / "rollouts" / "cycle_3.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["uid"] for r in rows] == ["a", "b"]
    first = rows[0]
    assert first["token_ids"] == [1, 2, 10, 11, 20, 21, 12] and first["prompt_length"] == 2
    assert first["loss_mask"] == [1, 1, 0, 0, 1] and first["logprobs"] == [-0.5, -0.5, 0.0, 0.0, -0.25]
    assert first["weight_versions"] == [3, 4] and first["reward"] == 1.0 and first["turns"] == 2
    assert first["messages"][2] == {"role": "tool", "content": "5"}
    assert log.write(4) is None  # the next cycle starts empty


def test_the_callback_takes_the_agentic_section_and_refuses_bad_ones_at_once() -> None:
    from lightning_hybrid_rollout import HybridRolloutCallback
    from lightning_hybrid_rollout.config import RolloutConfig

    cb = HybridRolloutCallback(
        RolloutConfig(model_path="m"),
        agentic={"environment": "env.py:Env", "environment_kwargs": {"k": 1}, "max_turns": 3, "tool_workers": 32},
    )
    assert cb.run.agentic.enabled and cb.run.agentic.max_turns == 3 and cb.run.agentic.environment_kwargs == {"k": 1}
    assert cb.run.agentic.tool_workers == 32
    with pytest.raises(ConfigError, match="tool_workers must be >= 1"):
        HybridRolloutCallback(RolloutConfig(model_path="m"), agentic={"tools": ["t.py:f"], "tool_workers": 0})
    with pytest.raises(ConfigError, match="log_rollouts must be an integer >= 0"):
        HybridRolloutCallback(RolloutConfig(model_path="m"), log_rollouts=-1)
    with pytest.raises(ConfigError, match="environment_kwargs must be empty when no environment is set"):
        HybridRolloutCallback(RolloutConfig(model_path="m"), agentic={"environment_kwargs": {"k": 1}})
