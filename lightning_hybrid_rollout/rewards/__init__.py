"""Reward functions given by import path, in TRL's calling convention, run in a worker pool off the event loop.

* :mod:`.config` — :class:`RewardConfig`, the ``rewards`` section (which functions, weights, pool, timeout, errors);
* :mod:`.loading` — :func:`load_reward_functions`: items -> checked :class:`RewardFunction` objects;
* :mod:`.builtin` — ``math_verify``, ``exact_match``, :class:`FormatReward` and :func:`completion_text`;
* :mod:`.runner` — :class:`RewardRunner`: scores a :class:`GroupRewardInput` into :class:`GroupRewards`.

A reward function is called once per finished prompt group, as TRL's ``GRPOTrainer`` calls it::

    def reward_len(completions, **kwargs):  # chat prompts: each completion is [{"role": "assistant", ...}]
        return [-abs(20 - len(c[0]["content"])) for c in completions]

with ``prompts=``, ``completions=``, ``completion_ids=`` and every other column of the data set as keyword
arguments, one list entry per completion; it returns one float (or ``None``: does not apply) per completion.
Pure Python on import (no torch, Ray or vLLM; ``math-verify`` loads on its first call).
"""

from __future__ import annotations

from lightning_hybrid_rollout.rewards.builtin import BUILTINS, FormatReward, completion_text, exact_match, math_verify
from lightning_hybrid_rollout.rewards.config import RewardConfig
from lightning_hybrid_rollout.rewards.loading import (
    RewardFunction,
    check_signature,
    load_reward_functions,
    resolve_reward_item,
)
from lightning_hybrid_rollout.rewards.runner import GroupRewardInput, GroupRewards, RewardRunner

__all__ = [
    "BUILTINS",
    "FormatReward",
    "GroupRewardInput",
    "GroupRewards",
    "RewardConfig",
    "RewardFunction",
    "RewardRunner",
    "check_signature",
    "completion_text",
    "exact_match",
    "load_reward_functions",
    "math_verify",
    "resolve_reward_item",
]
