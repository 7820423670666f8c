"""PromptRecord and the PromptSource defaults (preview restores the position; no held-out prompts or rewards)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from lightning_hybrid_rollout.sources import PromptRecord, PromptSource


class Counter(PromptSource):
    """An endless source of ``"p<i>"``: a minimal subclass, as a user would write one."""

    name = "counter"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.next = 0

    def __iter__(self) -> Iterator[PromptRecord]:
        while True:
            i, self.next = self.next, self.next + 1
            yield PromptRecord(index=i, prompt=f"p{i + self.seed}", columns={})

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.next = state["next"]

    @property
    def epoch(self) -> int:
        return 0


def test_a_record_knows_whether_its_prompt_is_chat() -> None:
    assert PromptRecord(index=0, prompt=[{"role": "user", "content": "x"}], columns={}).is_chat
    assert not PromptRecord(index=0, prompt="x", columns={}).is_chat
    assert PromptRecord(index=1, prompt="x").columns == {} and PromptRecord(index=1, prompt="x").epoch == 0


def test_default_preview_draws_without_moving_the_stream() -> None:
    source = Counter()
    list(itertools.islice(iter(source), 3))
    assert [r.index for r in source.preview(4)] == [3, 4, 5, 6]
    assert next(iter(source)).index == 3


def test_defaults_have_no_held_out_prompts_rewards_or_row_count() -> None:
    source = Counter()
    assert source.validation_records() == [] and source.default_reward_funcs() == [] and source.num_rows is None
    assert repr(source) == "Counter(name='counter', epoch=0)"
