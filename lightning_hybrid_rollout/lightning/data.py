"""Queue-backed data path: rollout ``Sample`` lists in, padded ``RolloutBatch`` tensors out.

A batch source attached by ``HybridRolloutCallback`` pulls one step's samples from the ``MessageQueue``; rank 0
calls it and broadcasts, every rank keeps its shard ``samples[rank::world_size]``, and GRPO advantages are computed
on the full list first. The module takes its batch inside ``training_step(self, dataloader_iter)`` with
:func:`next_rollout_batch`, so nothing is fetched ahead of the callback's deactivation (docs/custom_module.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset
from typing_extensions import override

from lightning_hybrid_rollout.rollout.sample import Sample

log = logging.getLogger(__name__)

BatchSource = Callable[[], "list[Sample] | None"]
"""A callable returning one training step's samples (all ranks together), or ``None`` when there are no more."""


@dataclass
class RolloutBatch:
    """One training step's samples as right-padded tensors (``B`` samples, ``T`` = longest prompt + response).

    Every ``[B, T]`` tensor is aligned with ``input_ids``: position ``t`` describes token ``input_ids[:, t]``.

    Args:
        input_ids: ``[B, T]`` long, prompt tokens then response tokens, right-padded with ``pad_token_id``.
        attention_mask: ``[B, T]`` long, 1 on prompt and response tokens, 0 on padding.
        response_mask: ``[B, T]`` float, 1.0 on the response tokens the loss trains: all of them, or a multi-turn
            episode's model tokens only (``Sample.loss_mask``: its tool/environment tokens are 0).
        rollout_logprobs: ``[B, T]`` float, at a response position the log-probability the rollout engine gave
            that token (``Sample.response_logprobs``); 0 elsewhere.
        rewards: ``[B]`` float, the samples' rewards.
        advantages: ``[B]`` float, GRPO group-normalised advantages (computed over the whole step's samples,
            before any sharding across ranks).
        group_ids: ``[B]`` long, a small int per distinct ``Sample.group_id`` (numbered in order of appearance
            in the full step batch).
        group_reward_std: ``[B]`` float, the reward std of each sample's group (0 for groups whose rewards are
            all equal: such samples carry no learning signal; see ``filter_groups``).
        weight_version_min: ``[B]`` long, oldest weight version any segment of the sample was generated under.
        weight_version_max: ``[B]`` long, newest weight version any segment was generated under.
        truncated: ``[B]`` float, 1.0 for a response cut at the length limit (``finish_reason == "length"``).
        samples: The raw ``Sample`` objects, in row order (for logging / custom losses).

    Example::

        batch = collate_samples(samples, pad_token_id=0)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor
    rewards: Tensor
    advantages: Tensor
    group_ids: Tensor
    group_reward_std: Tensor
    weight_version_min: Tensor
    weight_version_max: Tensor
    truncated: Tensor
    samples: list[Sample] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def batch_size(self) -> int:
        """Number of samples (rows)."""
        return len(self)

    @property
    def response_lengths(self) -> Tensor:
        """``[B]`` long, number of response tokens per row."""
        return self.response_mask.sum(dim=1).long()

    @property
    def num_response_tokens(self) -> int:
        """Total number of response tokens in the batch."""
        return int(self.response_mask.sum().item())

    def _tensor_fields(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "samples"}

    def to(self, device: torch.device | str) -> RolloutBatch:
        """Return a copy with every tensor moved to ``device`` (``samples`` is shared, not copied).

        Args:
            device: Target device.

        Example::

            batch = batch.to(self.device)
        """
        return RolloutBatch(**{k: v.to(device) for k, v in self._tensor_fields().items()}, samples=self.samples)

    def select(self, rows: slice) -> RolloutBatch:
        """Return the rows ``rows`` as a batch, with trailing all-padding columns trimmed.

        Args:
            rows: A slice over samples (for example one micro-batch).

        Example::

            for start in range(0, len(batch), 4):
                micro = batch.select(slice(start, start + 4))
        """
        out = {k: v[rows] for k, v in self._tensor_fields().items()}
        lengths = out["attention_mask"].sum(dim=1)
        width = max(int(lengths.max().item()), 1) if lengths.numel() else 1
        for k in ("input_ids", "attention_mask", "response_mask", "rollout_logprobs"):
            out[k] = out[k][:, :width]
        return RolloutBatch(**out, samples=self.samples[rows])

    def split(self, micro_batch_size: int) -> list[RolloutBatch]:
        """Split into consecutive micro-batches of at most ``micro_batch_size`` rows (see :meth:`select`).

        Args:
            micro_batch_size: Rows per micro-batch (> 0).

        Example::

            micro_batches = batch.split(4)
        """
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
        return [self.select(slice(s, s + micro_batch_size)) for s in range(0, len(self), micro_batch_size)]


def _group_index(group_ids: Sequence[Any]) -> Tensor:
    """Map arbitrary hashable group ids to ints 0..G-1 in order of first appearance."""
    mapping: dict[Any, int] = {}
    return torch.tensor([mapping.setdefault(g, len(mapping)) for g in group_ids], dtype=torch.long)


def _group_stats(rewards: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row group mean and unbiased group std (0 for singleton groups)."""
    rewards = rewards.to(torch.float64)
    num_groups = int(index.max().item()) + 1 if index.numel() else 0
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(rewards))
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, rewards)
    mean = total / count
    sq_dev = (rewards - mean[index]) ** 2
    sq_sum = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, sq_dev)
    var = torch.where(count > 1, sq_sum / (count - 1).clamp_min(1), torch.zeros_like(sq_sum))
    return mean[index], var.sqrt()[index]


def group_advantages(
    rewards: Tensor | Sequence[float],
    group_ids: Tensor | Sequence[Any],
    eps: float = 1e-6,
    normalize_std: bool = True,
) -> Tensor:
    """GRPO group-normalised advantages: ``(r - mean_g) / (std_g + eps)`` per sample.

    ``std_g`` is the unbiased (Bessel-corrected) std of the sample's group, as ``torch.std``, the probe and verl
    compute it. A singleton group has std 0 and advantage 0; so does any group whose rewards are all equal.

    Args:
        rewards: ``[B]`` rewards.
        group_ids: ``[B]`` group ids (ints or any hashable, e.g. ``Sample.group_id`` strings).
        eps: Added to the std to avoid division by zero.
        normalize_std: If False, return ``r - mean_g`` (Dr. GRPO style: no std division).

    Returns:
        ``[B]`` float32 advantages.

    Example::

        >>> group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), [0, 0, 1, 1], eps=0.0)
        tensor([ 0.7071, -0.7071,  0.0000,  0.0000])
    """
    rewards_t = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if isinstance(group_ids, Tensor):
        group_ids = group_ids.flatten().tolist()
    if len(group_ids) != rewards_t.numel():
        raise ValueError(f"{rewards_t.numel()} rewards but {len(group_ids)} group ids")
    if rewards_t.numel() == 0:
        return torch.zeros(0)
    index = _group_index(group_ids)
    mean, std = _group_stats(rewards_t, index)
    centered = rewards_t - mean
    if normalize_std:
        centered = centered / (std + eps)
    # a group whose rewards are all equal gets exactly 0 (not rounding noise / eps, nor 0 / 0 with eps = 0)
    return torch.where(std > 0, centered, torch.zeros_like(centered)).to(torch.float32)


def filter_groups(samples: Sequence[Sample]) -> list[Sample]:
    """DAPO dynamic-sampling filter: drop every group whose rewards are all equal (incl. singleton groups).

    Such groups have zero GRPO advantage for every member, so they only dilute a token-mean loss. A source that
    filters this way must generate more groups than it trains on to keep its batch size (as DAPO does).

    Args:
        samples: Samples of one or more groups (``Sample.group_id``), in any order.

    Returns:
        The samples of the groups with at least two distinct rewards, in their original order.

    Example::

        kept = filter_groups(samples)
        dropped = len(samples) - len(kept)
    """
    rewards: dict[str, set[float]] = {}
    for s in samples:
        rewards.setdefault(s.group_id, set()).add(float(s.reward))
    return [s for s in samples if len(rewards[s.group_id]) > 1]


def collate_samples(
    samples: Sequence[Sample],
    pad_token_id: int = 0,
    advantages: Tensor | None = None,
    eps: float = 1e-6,
    normalize_std: bool = True,
    group_ids: Tensor | None = None,
    group_reward_std: Tensor | None = None,
) -> RolloutBatch:
    """Pad samples into a :class:`RolloutBatch` (``input_ids`` = prompt + response, right-padded).

    Args:
        samples: The samples, one row each. Every sample needs a non-empty prompt (the first response token is
            scored from the last prompt position) and one rollout log-prob per response token.
        pad_token_id: Token id used for padding (padding is masked out everywhere).
        advantages: Precomputed ``[B]`` advantages (e.g. computed over a larger batch this is a shard of);
            by default :func:`group_advantages` over ``samples``.
        eps: ``eps`` of :func:`group_advantages` when computing advantages here.
        normalize_std: ``normalize_std`` of :func:`group_advantages` when computing advantages here.
        group_ids: Precomputed ``[B]`` int group ids; by default numbered in order of appearance.
        group_reward_std: Precomputed ``[B]`` group reward std; by default computed over ``samples``.

    Returns:
        The batch.

    Example::

        batch = collate_samples(samples, pad_token_id=tokenizer.pad_token_id)
        batch.input_ids.shape  # [len(samples), longest prompt + response]
    """
    n = len(samples)
    for s in samples:
        if not s.prompt_token_ids:
            raise ValueError(f"sample {s.uid!r} has an empty prompt: its first response token cannot be scored")
        if s.loss_mask and len(s.loss_mask) != len(s.response_token_ids):
            raise ValueError(
                f"sample {s.uid!r}: {len(s.response_token_ids)} response tokens but a loss mask of {len(s.loss_mask)}"
            )
        if len(s.response_logprobs) != len(s.response_token_ids):
            raise ValueError(
                f"sample {s.uid!r}: {len(s.response_token_ids)} response tokens but "
                f"{len(s.response_logprobs)} rollout log-probs"
            )
    width = max((len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples), default=1)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    response_mask = torch.zeros((n, width), dtype=torch.float32)
    rollout_logprobs = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_token_ids), len(s.response_token_ids)
        input_ids[i, :p] = torch.tensor(s.prompt_token_ids, dtype=torch.long)
        attention_mask[i, : p + r] = 1
        if r:
            input_ids[i, p : p + r] = torch.tensor(s.response_token_ids, dtype=torch.long)
            if s.loss_mask:  # a multi-turn episode: its tool/environment tokens carry no gradient
                response_mask[i, p : p + r] = torch.tensor(s.loss_mask, dtype=torch.float32)
            else:
                response_mask[i, p : p + r] = 1.0
            rollout_logprobs[i, p : p + r] = torch.tensor(s.response_logprobs, dtype=torch.float32)
    rewards = torch.tensor([float(s.reward) for s in samples], dtype=torch.float32)
    if group_ids is None:
        group_ids = _group_index([s.group_id for s in samples])
    if group_reward_std is None:
        group_reward_std = (
            _group_stats(rewards, group_ids)[1].to(torch.float32) if n else torch.zeros(0, dtype=torch.float32)
        )
    if advantages is None:
        advantages = group_advantages(rewards, group_ids, eps=eps, normalize_std=normalize_std)
    if advantages.shape != (n,):
        raise ValueError(f"advantages must have shape ({n},), got {tuple(advantages.shape)}")
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        rollout_logprobs=rollout_logprobs,
        rewards=rewards,
        advantages=advantages.to(torch.float32),
        group_ids=group_ids.to(torch.long),
        group_reward_std=group_reward_std.to(torch.float32),
        weight_version_min=torch.tensor([s.min_weight_version for s in samples], dtype=torch.long),
        weight_version_max=torch.tensor([s.max_weight_version for s in samples], dtype=torch.long),
        truncated=torch.tensor([float(s.finish_reason == "length") for s in samples], dtype=torch.float32),
        samples=list(samples),
    )


def next_rollout_batch(dataloader_iter: Iterator[Any]) -> RolloutBatch:
    """Take the next :class:`RolloutBatch` from the iterator Lightning passes to ``training_step(dataloader_iter)``.

    Lightning's iterator yields ``(batch, batch_idx, dataloader_idx)``; a plain iterator of batches works too.
    Raises ``StopIteration`` when the data is exhausted (Lightning then ends the epoch).

    Args:
        dataloader_iter: The ``dataloader_iter`` argument of ``training_step``.

    Returns:
        The batch (still on the CPU: move it with ``batch.to(self.device)``).

    Example::

        def training_step(self, dataloader_iter):
            batch = next_rollout_batch(dataloader_iter).to(self.device)
    """
    item = next(dataloader_iter)
    if isinstance(item, tuple) and item and isinstance(item[0], RolloutBatch):
        item = item[0]
    if not isinstance(item, RolloutBatch):
        raise TypeError(f"expected a RolloutBatch from the dataloader, got {type(item).__name__}")
    return item


@dataclass
class _SourceFailed:
    """Broadcast in place of samples when rank 0's source raised."""

    message: str


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class QueueBatchIterable(IterableDataset):
    """Iterable of :class:`RolloutBatch` es, one per call of a batch source; rank 0 fetches, all ranks shard.

    Each ``next()`` calls the source exactly once, nothing ahead. A source returning ``None`` ends the iteration on
    all ranks; an exception in rank 0's source is re-raised on every rank, so none hangs. With ``rank`` /
    ``world_size`` given but no process group, every rank calls its own source and keeps its shard.

    Args:
        source: The batch source; may be attached later with :meth:`attach_source`.
        pad_token_id: Padding id for :func:`collate_samples`.
        num_steps: If set, stop after this many batches and report it as ``len()``; by default unbounded
            (let ``Trainer(max_steps=...)`` end training).
        adv_eps: ``eps`` of :func:`group_advantages`.
        normalize_std: ``normalize_std`` of :func:`group_advantages`.
        rank: Data-parallel rank (the shard kept); by default ``torch.distributed``'s rank (0 when not
            initialised). The source is always called by global rank 0 and broadcast to the whole default group.
        world_size: Data-parallel world size; by default ``torch.distributed``'s (1 when not initialised).

    Example::

        iterable = QueueBatchIterable(pad_token_id=0)
        iterable.attach_source(lambda: queue.get_samples(64))
        batch = next(iter(iterable))
    """

    def __init__(
        self,
        source: BatchSource | None = None,
        pad_token_id: int = 0,
        num_steps: int | None = None,
        adv_eps: float = 1e-6,
        normalize_std: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        if num_steps is not None and num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        self._source = source
        self.pad_token_id = pad_token_id
        self.num_steps = num_steps
        self.adv_eps = adv_eps
        self.normalize_std = normalize_std
        self.rank = rank
        self.world_size = world_size

    def attach_source(self, source: BatchSource) -> None:
        """Attach (or replace) the batch source. Safe to call any time before the next batch is taken.

        Args:
            source: ``next_batch() -> list[Sample] | None``.

        Example::

            iterable.attach_source(my_next_batch)
        """
        self._source = source

    @property
    def source(self) -> BatchSource | None:
        """The attached batch source, or ``None``."""
        return self._source

    def __len__(self) -> int:
        if self.num_steps is None:
            raise TypeError("QueueBatchIterable is unbounded (num_steps=None): it has no length")
        return self.num_steps

    def _rank_world(self) -> tuple[int, int]:
        rank, world = _dist_rank_world()
        rank = rank if self.rank is None else self.rank
        world = world if self.world_size is None else self.world_size
        if not 0 <= rank < world:
            raise ValueError(f"invalid rank {rank} for world size {world}")
        return rank, world

    def _fetch(self) -> list[Sample] | None:
        """Global rank 0 calls the source; with a process group of several ranks the result is broadcast."""
        payload: Any = None
        error: Exception | None = None
        global_rank, global_world = _dist_rank_world()
        broadcast = global_world > 1
        if global_rank == 0:  # without a process group every rank is "rank 0" of its own and calls its source
            try:
                if self._source is None:
                    raise RuntimeError(
                        "no batch source attached: call RolloutDataModule.attach_source(fn) (HybridRolloutCallback "
                        "does it at fit start) before training"
                    )
                samples = self._source()
                payload = None if samples is None else list(samples)
            except Exception as err:  # raised on every rank below (the exception itself may not pickle)
                error, payload = err, _SourceFailed(repr(err))
        if broadcast:
            box = [payload]
            torch.distributed.broadcast_object_list(box, src=0)
            payload = box[0]
        if error is not None:
            raise error
        if isinstance(payload, _SourceFailed):
            raise RuntimeError(f"rank 0's batch source failed: {payload.message}")
        return payload

    def make_batch(self, samples: Sequence[Sample], rank: int = 0, world_size: int = 1) -> RolloutBatch:
        """Collate one rank's shard of a full step batch (advantages computed over the full batch).

        Args:
            samples: All ranks' samples of this step.
            rank: This rank.
            world_size: Number of ranks.

        Returns:
            The batch of ``samples[rank::world_size]``.

        Example::

            shard = iterable.make_batch(samples, rank=1, world_size=2)
        """
        if not samples:
            raise ValueError("the batch source returned no samples (return None to end training)")
        if len(samples) < world_size:
            raise ValueError(f"{len(samples)} samples cannot be sharded over {world_size} ranks")
        rewards = torch.tensor([float(s.reward) for s in samples], dtype=torch.float32)
        group_ids = _group_index([s.group_id for s in samples])
        advantages = group_advantages(rewards, group_ids, eps=self.adv_eps, normalize_std=self.normalize_std)
        group_std = _group_stats(rewards, group_ids)[1].to(torch.float32)
        return collate_samples(
            list(samples)[rank::world_size],
            pad_token_id=self.pad_token_id,
            advantages=advantages[rank::world_size],
            group_ids=group_ids[rank::world_size],
            group_reward_std=group_std[rank::world_size],
        )

    @override
    def __iter__(self) -> Iterator[RolloutBatch]:
        rank, world = self._rank_world()
        produced = 0
        while self.num_steps is None or produced < self.num_steps:
            samples = self._fetch()
            if samples is None:
                return
            produced += 1
            yield self.make_batch(samples, rank, world)


def _identity(item: Any) -> Any:
    return item


class RolloutDataModule(LightningDataModule):
    """Lightning data module over a :class:`QueueBatchIterable`; its batch source is attached at fit start.

    Batching and sharding happen in the iterable (``DataLoader(batch_size=None, num_workers=0)``). Unbounded by
    default, so ``Trainer(max_steps=N)`` ends training.

    Args:
        pad_token_id: Padding id for :func:`collate_samples`.
        num_steps: Batches per epoch (and ``len()``), or ``None`` for unbounded.
        adv_eps: ``eps`` of :func:`group_advantages`.
        normalize_std: ``normalize_std`` of :func:`group_advantages`.
        source: Optional batch source to start with (tests, custom loops).
        val_task: A toy task whose held-out prompts ``lhr validate`` / ``trainer.validate`` scores (greedy answers,
            the task's reward). ``None`` (default): the ``HybridRolloutCallback``'s own held-out prompts
            (``dataset.val_path`` / ``val_split``, or a toy task's), answered with the run's stop tokens and up to
            ``rollout.response_length`` tokens and scored by its reward functions (``val/reward``, ``val/pass@1``,
            ``val/pass@<val_n>``).
        val_prompts: The most held-out prompts.
        val_batch_size: Prompts per validation batch.
        val_seed: Seed of ``val_task``'s held-out prompt stream, and of an agentic run's held-out episodes (record ``i``
            resets its environment with ``val_seed + i``); different from the rollout's default seed 0.
        val_n: Samples per held-out prompt (pass@k for k = 1 and ``val_n``).
        val_temperature: Sampling temperature of validation (``None``: greedy when ``val_n == 1``, else 1.0).
        val_pass_threshold: A sample passes (for pass@k) when its reward is at least this.

    Example::

        dm = RolloutDataModule(pad_token_id=tokenizer.pad_token_id)
        dm.attach_source(lambda: queue.get_samples(64))  # HybridRolloutCallback does this at fit start
        trainer.fit(GRPOModule(model_path="..."), datamodule=dm)
    """

    def __init__(
        self,
        pad_token_id: int = 0,
        num_steps: int | None = None,
        adv_eps: float = 1e-6,
        normalize_std: bool = True,
        source: BatchSource | None = None,
        val_task: str | None = None,
        val_prompts: int = 64,
        val_batch_size: int = 64,
        val_seed: int = 10_000,
        val_n: int = 1,
        val_temperature: float | None = None,
        val_pass_threshold: float = 1.0,
    ) -> None:
        super().__init__()
        if val_prompts < 1 or val_batch_size < 1 or val_n < 1:
            raise ValueError(
                f"val_prompts, val_batch_size and val_n must be >= 1, got {val_prompts}, {val_batch_size}, {val_n}"
            )
        #: The held-out prompts and how they are answered and scored (attached by the callback at setup).
        self.validation_set: Any = None
        self.save_hyperparameters(ignore=["source"])
        self.iterable = QueueBatchIterable(
            source=source,
            pad_token_id=pad_token_id,
            num_steps=num_steps,
            adv_eps=adv_eps,
            normalize_std=normalize_std,
        )

    def attach_source(self, source: BatchSource) -> None:
        """Attach (or replace) the batch source ``next_batch() -> list[Sample] | None``.

        Args:
            source: Called once per training step, on rank 0 only, after ``on_train_batch_start`` hooks ran.

        Example::

            datamodule.attach_source(lambda: message_queue.get_samples(required_samples))
        """
        self.iterable.attach_source(source)

    @property
    def source(self) -> BatchSource | None:
        """The attached batch source, or ``None``."""
        return self.iterable.source

    def attach_validation(self, validation_set: Any) -> None:
        """Attach the held-out prompts (a :class:`~lightning_hybrid_rollout.validation.answers.ValidationSet`);
        ignored when ``val_task`` is set."""
        if self.hparams.val_task is None:
            self.validation_set = validation_set

    @override
    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.iterable, batch_size=None, num_workers=0, collate_fn=_identity)

    @override
    def val_dataloader(self) -> DataLoader | list:
        """The attached validation set's batches, or ``val_task``'s prompts (lists of ``{"prompt", "metadata"}``)."""
        if self.hparams.val_task is None:
            if self.validation_set is None:
                return []
            batches = self.validation_set.batches()
            return DataLoader(batches, batch_size=None, num_workers=0, collate_fn=_identity) if batches else []
        from lightning_hybrid_rollout.tasks import get_task

        task = get_task(self.hparams.val_task)
        prompts = [
            {"prompt": p.prompt, "metadata": dict(p.metadata)}
            for p in task.sample_prompts(self.hparams.val_prompts, seed=self.hparams.val_seed)
        ]
        size = self.hparams.val_batch_size
        batches = [prompts[i : i + size] for i in range(0, len(prompts), size)]
        return DataLoader(batches, batch_size=None, num_workers=0, collate_fn=_identity)
