"""The unit of data that flows from rollout to training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One generated response to one prompt, ready for the trainer.

    Args:
        uid: Unique id of this sample's request (stable across partial-rollout retries).
        group_id: Id shared by the samples drawn for the same prompt (GRPO group).
        prompt: The prompt text.
        prompt_token_ids: Tokenized prompt.
        response_token_ids: Generated tokens (all segments of a partial rollout, concatenated).
        response_logprobs: Log-probability of each generated token under the engine that produced it.
        reward: Scalar reward from the task's reward function.
        min_weight_version: Oldest weight version any segment of this sample was generated under.
        max_weight_version: Newest weight version any segment was generated under.
        finish_reason: ``"stop"`` (end token) or ``"length"`` (response length reached).
        num_segments: Number of engine requests it took (1 + partial-rollout retries).
        replica_ids: Replica that generated each segment, in order.
        metadata: Task-specific data (for example the expected answer); a multi-turn episode's summary under
            ``"episode"`` (turns, tool calls, messages, per-segment weight versions).
        loss_mask: One per response token: 1 where the loss trains it, 0 on a tool/environment turn's tokens (a
            multi-turn episode). Empty: every response token is trained.
    """

    uid: str
    group_id: str
    prompt: str
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    reward: float = 0.0
    min_weight_version: int = 0
    max_weight_version: int = 0
    finish_reason: str = "stop"
    num_segments: int = 1
    replica_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    loss_mask: list[int] = field(default_factory=list)

    @property
    def response_length(self) -> int:
        return len(self.response_token_ids)
