"""Tests of the queue-backed data path: collation, GRPO advantages, group filter, the lazy sharded iterable."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_hybrid_rollout.lightning.data import (
    QueueBatchIterable,
    RolloutBatch,
    RolloutDataModule,
    collate_samples,
    filter_groups,
    group_advantages,
    next_rollout_batch,
)
from lightning_hybrid_rollout.rollout.sample import Sample


def _sample(uid: str, group: str, prompt: list[int], response: list[int], reward: float = 0.0, **kw) -> Sample:
    logprobs = kw.pop("logprobs", [-0.1 * (i + 1) for i in range(len(response))])
    return Sample(
        uid=uid,
        group_id=group,
        prompt="",
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=logprobs,
        reward=reward,
        **kw,
    )


def test_group_advantages_hand_computed() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 3.0])
    adv = group_advantages(rewards, [0, 0, 0, 1, 1, 2], eps=0.0)
    # group 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    s0 = math.sqrt(1 / 3)
    # group 1: mean 0.75, unbiased std sqrt(2 * 0.25^2 / 1) = 0.25 * sqrt(2)
    s1 = 0.25 * math.sqrt(2)
    expected = [(2 / 3) / s0, (-1 / 3) / s0, (-1 / 3) / s0, -0.25 / s1, 0.25 / s1, 0.0]  # singleton group -> 0
    torch.testing.assert_close(adv, torch.tensor(expected), atol=1e-6, rtol=0)


def test_group_advantages_eps_strings_equal_groups_and_no_std() -> None:
    adv = group_advantages([2.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"], eps=0.5)
    s = math.sqrt(2.0)  # unbiased std of [2, 0]
    torch.testing.assert_close(adv, torch.tensor([1 / (s + 0.5), -1 / (s + 0.5), 0.0, 0.0]))
    centered = group_advantages([2.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"], normalize_std=False)
    torch.testing.assert_close(centered, torch.tensor([1.0, -1.0, 0.0, 0.0]))
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0], [0])


def test_filter_groups_drops_uniform_groups() -> None:
    samples = [
        _sample("a0", "a", [1], [2], reward=1.0),
        _sample("b0", "b", [1], [2], reward=1.0),
        _sample("a1", "a", [1], [2], reward=0.0),
        _sample("b1", "b", [1], [2], reward=1.0),
        _sample("c0", "c", [1], [2], reward=0.0),  # singleton
    ]
    assert [s.uid for s in filter_groups(samples)] == ["a0", "a1"]


def test_collate_shapes_masks_and_logprob_alignment() -> None:
    samples = [
        _sample("s0", "g", [5, 6, 7], [8, 9], reward=1.0, logprobs=[-0.5, -0.25], min_weight_version=2),
        _sample("s1", "g", [5], [10, 11, 12], reward=0.0, logprobs=[-1.0, -2.0, -3.0], max_weight_version=4),
        _sample("s2", "h", [3, 4], [], reward=0.5, logprobs=[]),
    ]
    b = collate_samples(samples, pad_token_id=63)
    assert isinstance(b, RolloutBatch) and len(b) == 3
    assert b.input_ids.shape == (3, 5) and b.input_ids.dtype == torch.long
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 10, 11, 12, 63], [3, 4, 63, 63, 63]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert b.response_mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 0], [0, 0, 0, 0, 0]]
    # rollout log-prob at position t belongs to token input_ids[:, t]
    assert b.rollout_logprobs.tolist() == [[0, 0, 0, -0.5, -0.25], [0, -1.0, -2.0, -3.0, 0], [0] * 5]
    for i, s in enumerate(samples):
        m = b.response_mask[i].bool()
        assert b.input_ids[i][m].tolist() == s.response_token_ids
        assert b.rollout_logprobs[i][m].tolist() == s.response_logprobs
    assert b.rewards.tolist() == [1.0, 0.0, 0.5]
    assert b.group_ids.tolist() == [0, 0, 1]
    assert b.weight_version_min.tolist() == [2, 0, 0] and b.weight_version_max.tolist() == [0, 4, 0]
    assert b.response_lengths.tolist() == [2, 3, 0] and b.num_response_tokens == 5
    torch.testing.assert_close(b.advantages, group_advantages([1.0, 0.0, 0.5], [0, 0, 1]))
    assert b.group_reward_std[2] == 0 and b.group_reward_std[0] > 0
    assert b.samples == samples
    # micro-batches trim trailing padding
    mb = b.select(slice(1, 3))
    assert mb.input_ids.shape == (2, 4) and mb.samples == samples[1:]
    assert [len(x) for x in b.split(2)] == [2, 1]


def test_collate_rejects_bad_samples() -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        collate_samples([_sample("x", "g", [], [1])])
    with pytest.raises(ValueError, match="log-probs"):
        collate_samples([_sample("x", "g", [1], [1, 2], logprobs=[-1.0])])


class _Source:
    """A batch source that records each call (proves laziness) and ends after ``n`` batches."""

    def __init__(self, n: int, per_batch: int = 4, events: list | None = None) -> None:
        self.n, self.per_batch, self.calls = n, per_batch, 0
        self.events = events if events is not None else []

    def __call__(self) -> list[Sample] | None:
        if self.calls >= self.n:
            return None
        k = self.calls
        self.calls += 1
        self.events.append(("fetch", k))
        return [
            _sample(f"{k}-{i}", f"{k}-{i // 2}", [1, 2], [3] * (1 + i % 3), reward=float(i % 2))
            for i in range(self.per_batch)
        ]


def test_iterable_is_lazy_and_stops_on_none() -> None:
    src = _Source(n=2)
    it = iter(QueueBatchIterable(src))
    assert src.calls == 0
    first = next(it)
    assert src.calls == 1 and [s.uid for s in first.samples] == ["0-0", "0-1", "0-2", "0-3"]
    next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_iterable_without_source_and_empty_batch() -> None:
    with pytest.raises(RuntimeError, match="attach_source"):
        next(iter(QueueBatchIterable()))
    with pytest.raises(ValueError, match="no samples"):
        next(iter(QueueBatchIterable(lambda: [])))


def test_shard_keeps_full_batch_advantages() -> None:
    samples = _Source(n=1, per_batch=6)()
    full = collate_samples(samples)
    shards = [QueueBatchIterable(rank=r, world_size=2).make_batch(samples, r, 2) for r in range(2)]
    assert [s.uid for s in shards[0].samples] == ["0-0", "0-2", "0-4"]
    assert [s.uid for s in shards[1].samples] == ["0-1", "0-3", "0-5"]
    for r, shard in enumerate(shards):
        # each group of 2 is split across ranks, yet advantages are those of the full batch
        torch.testing.assert_close(shard.advantages, full.advantages[r::2])
        torch.testing.assert_close(shard.group_reward_std, full.group_reward_std[r::2])
        assert shard.group_ids.tolist() == full.group_ids[r::2].tolist()
    it = QueueBatchIterable(lambda: samples, rank=1, world_size=2)
    assert [s.uid for s in next(iter(it)).samples] == ["0-1", "0-3", "0-5"]
    with pytest.raises(ValueError, match="sharded"):
        QueueBatchIterable().make_batch(samples[:1], 0, 2)


def test_datamodule_attach_length_and_next_rollout_batch() -> None:
    dm = RolloutDataModule(pad_token_id=0, num_steps=3)
    assert dm.source is None
    src = _Source(n=10)
    dm.attach_source(src)
    loader = dm.train_dataloader()
    assert len(loader) == 3
    batches = list(loader)
    assert len(batches) == 3 and all(isinstance(b, RolloutBatch) for b in batches) and src.calls == 3
    # Lightning's dataloader_iter yields (batch, batch_idx, dataloader_idx); a bare iterator works too
    assert next_rollout_batch(iter([(batches[0], 0, 0)])) is batches[0]
    assert next_rollout_batch(iter(batches)) is batches[0]
    with pytest.raises(TypeError):
        next_rollout_batch(iter([{"input_ids": 1}]))
    with pytest.raises(TypeError):
        len(RolloutDataModule().train_dataloader())  # unbounded by default: max_steps ends training
