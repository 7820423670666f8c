"""Admitted samples while they are generated, their prompt groups, and the checkpoint form of both."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_hybrid_rollout.rollout.sample import Sample


@dataclass
class SampleState:
    """One admitted sample: its kept segments, counts of its attempts and, once finished, its :class:`Sample`.

    A multi-turn episode also keeps its own prompt (``prompt_ids``: the group's, rendered with the tools and the
    environment's reset text), one loss-mask entry per token (0 on tool/environment tokens), where its current
    model turn starts (``turn_start`` in ``tokens``, ``turn_version_start`` in ``versions``) and its summary
    (``episode``, plain data). A plain sample leaves them empty.
    """

    uid: str
    group_id: str
    index: int
    seed: int | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    replica_ids: list[str] = field(default_factory=list)
    attempts: int = 0
    failures: int = 0
    rejections: int = 0
    aborted_segments: int = 0
    admitted_version: int = 0
    started_at: float | None = None
    segment_starts: list[int] = field(default_factory=list)
    prompt_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    turn_start: int = 0
    turn_version_start: int = 0
    episode: dict[str, Any] | None = None
    result: Sample | None = None

    def keep_segment(
        self, tokens: list[int], logprobs: list[float], version: int, replica_id: str, final: bool = False
    ) -> None:
        """Append a segment's output; a non-final segment without tokens is not kept."""
        if not tokens and not final:
            return
        self.segment_starts.append(len(self.tokens))
        if self.loss_mask is not None:
            self.loss_mask.extend([1] * len(tokens))
        self.tokens.extend(tokens)
        self.logprobs.extend(logprobs)
        self.versions.append(version)
        self.replica_ids.append(replica_id)

    def drop_segments(self) -> None:
        """Forget every kept segment of the current model turn (a plain sample restarts from scratch; an episode
        keeps its finished turns)."""
        t, v = self.turn_start, self.turn_version_start
        del self.tokens[t:], self.logprobs[t:], self.versions[v:], self.replica_ids[v:], self.segment_starts[v:]
        if self.loss_mask is not None:
            del self.loss_mask[t:]

    def add_env_tokens(self, token_ids: list[int]) -> None:
        """Append a tool/environment turn's tokens (loss mask 0, log-prob 0.0); the next model turn starts after
        them."""
        if self.loss_mask is None:
            self.loss_mask = [1] * len(self.tokens)
        self.tokens.extend(token_ids)
        self.logprobs.extend([0.0] * len(token_ids))
        self.loss_mask.extend([0] * len(token_ids))
        self.start_turn()

    def start_turn(self) -> None:
        """Mark the end of the kept tokens as where the next model turn starts."""
        self.turn_start, self.turn_version_start = len(self.tokens), len(self.versions)

    def to_sample(self, group: PromptGroup, reason: str, now: float) -> Sample:
        """The finished sample (without its reward); ``metadata["rollout"]`` gets its generation time and counts."""
        metadata = dict(group.metadata)
        if self.episode is not None:
            metadata["episode"] = copy.deepcopy(self.episode)
        metadata["rollout"] = {
            "generation_s": now - (self.started_at if self.started_at is not None else now),
            "admitted_param_version": self.admitted_version,
            "aborted_segments": self.aborted_segments,
        }
        return Sample(
            uid=self.uid,
            group_id=self.group_id,
            prompt=group.prompt,
            prompt_token_ids=list(self.prompt_ids if self.prompt_ids is not None else group.prompt_token_ids),
            response_token_ids=list(self.tokens),
            response_logprobs=list(self.logprobs),
            min_weight_version=min(self.versions),
            max_weight_version=max(self.versions),
            finish_reason=reason,
            num_segments=len(self.versions),
            replica_ids=list(self.replica_ids),
            metadata=metadata,
            loss_mask=list(self.loss_mask) if self.loss_mask is not None else [],
        )

    def to_state(self) -> dict[str, Any]:
        """Plain-data form for a checkpoint (lists copied, the finished sample as a dict)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "result"}
        d = {k: (list(v) if isinstance(v, list) else copy.deepcopy(v)) for k, v in d.items()}
        d["result"] = dataclasses.asdict(self.result) if self.result is not None else None
        return d

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SampleState:
        """Undo :meth:`to_state`; the generation clock restarts (``started_at`` is cleared).

        The sample owns copies: continuing it never changes ``state`` (a checkpoint can be restored again).
        """
        fields = {k: (list(v) if isinstance(v, list) else copy.deepcopy(v)) for k, v in state.items() if k != "result"}
        st = cls(**{**fields, "started_at": None})
        result = state.get("result")
        st.result = Sample(**copy.deepcopy(dict(result))) if result is not None else None
        return st


@dataclass
class PromptGroup:
    """One admitted prompt and its samples; delivered to the queue whole, once every sample is finished."""

    group_id: str
    prompt: str
    prompt_token_ids: list[int]
    metadata: dict[str, Any]
    samples: list[SampleState]
    delivering: bool = False
    #: The group's rewards are set (a :class:`~lightning_hybrid_rollout.rollout.production.GroupScorer` ran).
    scored: bool = False

    @classmethod
    def admit(
        cls,
        number: int,
        prompt: str,
        prompt_token_ids: list[int],
        metadata: dict[str, Any],
        *,
        n_samples: int,
        base_seed: int | None,
        param_version: int,
    ) -> PromptGroup:
        """The ``number``-th group: ``n_samples`` fresh samples, sample ``k`` seeded ``base_seed + number * n + k``."""
        gid = f"g{number}"
        samples = [
            SampleState(
                uid=f"{gid}-{k}",
                group_id=gid,
                index=k,
                seed=None if base_seed is None else base_seed + number * n_samples + k,
                admitted_version=param_version,
            )
            for k in range(n_samples)
        ]
        return cls(gid, prompt, prompt_token_ids, metadata, samples)

    @property
    def done(self) -> bool:
        return all(s.result is not None for s in self.samples)

    def to_state(self) -> dict[str, Any]:
        """Plain-data form for a checkpoint."""
        return {
            "group_id": self.group_id,
            "prompt": self.prompt,
            "prompt_token_ids": list(self.prompt_token_ids),
            "metadata": copy.deepcopy(self.metadata),
            "samples": [s.to_state() for s in self.samples],
            "scored": self.scored,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> PromptGroup:
        """Undo :meth:`to_state` (into copies, like :meth:`SampleState.from_state`)."""
        samples = [SampleState.from_state(s) for s in state["samples"]]
        token_ids, metadata = list(state["prompt_token_ids"]), copy.deepcopy(dict(state["metadata"]))
        group = cls(state["group_id"], state["prompt"], token_ids, metadata, samples)
        group.scored = bool(state.get("scored", False))
        return group
