"""Micro-batches by a token budget: the plan, its padding to a common count, the model-derived default."""

from __future__ import annotations

import itertools

import pytest
from transformers import LlamaConfig

from lightning_hybrid_rollout.training.micro_batches import (
    ACTIVATION_BUDGET_BYTES,
    activation_bytes_per_token,
    default_tokens_per_forward,
    even_out,
    plan_micro_batches,
)


def _padded_tokens(lengths: list[int], part: slice) -> int:
    rows = lengths[part]
    return len(rows) * max(rows)


@pytest.mark.parametrize("budget", [1, 7, 10, 16, 40, 1000])
def test_a_plan_covers_every_row_once_in_order_within_the_budget(budget: int) -> None:
    lengths = [3, 5, 2, 8, 8, 1, 4, 6, 2, 9]
    plan = plan_micro_batches(lengths, budget)
    assert [i for part in plan for i in range(part.start, part.stop)] == list(range(len(lengths)))
    # within the budget, or one row alone (a row longer than the budget cannot be cut)
    assert all(_padded_tokens(lengths, p) <= budget or p.stop - p.start == 1 for p in plan)
    # greedy: no two neighbours could have been one micro-batch
    assert all(_padded_tokens(lengths, slice(a.start, b.stop)) > budget for a, b in itertools.pairwise(plan))


def test_a_plan_honours_a_row_cap_too() -> None:
    assert plan_micro_batches([1] * 7, max_tokens=100, max_rows=3) == [slice(0, 3), slice(3, 6), slice(6, 7)]


def test_a_large_budget_keeps_the_whole_batch_in_one_forward() -> None:
    assert plan_micro_batches([3, 9, 4], max_tokens=27) == [slice(0, 3)]
    assert plan_micro_batches([], max_tokens=8) == []


def test_evening_out_halves_the_widest_part_and_pads_a_rank_with_too_few_rows() -> None:
    assert even_out([slice(0, 8)], 3) == [slice(0, 2), slice(2, 4), slice(4, 8)]
    assert even_out([slice(0, 1), slice(1, 2)], 4) == [slice(0, 1), slice(1, 2), None, None]
    assert even_out([slice(0, 2)], 2) == [slice(0, 1), slice(1, 2)]


def test_the_default_budget_follows_the_models_size() -> None:
    small = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    smollm2 = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)
    big = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32)
    assert default_tokens_per_forward(small) == 65536  # capped
    assert default_tokens_per_forward(big) == 1024  # floored
    middle = default_tokens_per_forward(smollm2)
    assert 1024 < middle < 65536
    assert middle * activation_bytes_per_token(smollm2) <= ACTIVATION_BUDGET_BYTES
