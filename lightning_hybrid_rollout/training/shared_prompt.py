"""Shared-prompt log-probs: each distinct prompt of a batch runs through the model once, its rows continue from it.

Each distinct prompt runs once with ``use_cache=True``, its key/value cache is repeated for the group's rows and only
the responses run on top, so the log-probs and gradients match the plain forward up to rounding while ``(n - 1) / n``
of the prompt work is saved (the idea of Prefix Grouper, arXiv:2506.05433). :class:`GRPOModule` checks it once
against the plain forward and falls back with a warning (docs/grpo.md, ``shared_prompt_forward``).

Example::

    logp = shared_prompt_logprobs(model, batch)  # [B, T - 1], as GRPOModule.token_logprobs
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from lightning_hybrid_rollout.training.chunked_head import scored_head, target_logprobs

if TYPE_CHECKING:
    from lightning_hybrid_rollout.lightning.data import RolloutBatch

__all__ = [
    "PromptBucket",
    "check_shared_prompt",
    "prompt_buckets",
    "shared_prompt_logprobs",
    "shares_prompts",
    "target_logprobs",
]


@dataclass
class PromptBucket:
    """The rows of a batch whose prompts have one length ``prompt_len``.

    Args:
        prompt_len: The prompt's tokens (the first response token's column).
        prompts: ``[U, prompt_len]`` the distinct prompts of this length.
        rows: ``[N]`` the batch rows of this length.
        prompt_of_row: ``[N]`` for each of ``rows``, its prompt's index in ``prompts``.
        response_len: The longest response among ``rows``.
    """

    prompt_len: int
    prompts: Tensor
    rows: Tensor
    prompt_of_row: Tensor
    response_len: int


def prompt_buckets(batch: RolloutBatch) -> list[PromptBucket]:
    """Group ``batch``'s rows by their prompt tokens, bucketed by prompt length (rows without a response are left out).

    Rows share a prompt when their prompt tokens are equal (``group_ids`` are not trusted for it: two groups may
    ask the same prompt, and a hand-built batch may number them differently).
    """
    starts = (batch.response_mask > 0).int().argmax(dim=1).tolist()  # first response column (0: none)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    ids = batch.input_ids.cpu()
    by_len: dict[int, _Group] = {}
    for row, (p, length) in enumerate(zip(starts, lengths)):
        if p < 1:
            continue  # no response, or no prompt token to condition on: nothing to share
        group = by_len.setdefault(p, _Group())
        key = ids[row, :p].numpy().tobytes()
        if key not in group.seen:
            group.seen[key] = len(group.prompts)
            group.prompts.append(batch.input_ids[row, :p])
        group.rows.append(row)
        group.which.append(group.seen[key])
        group.response_len = max(group.response_len, int(length) - p)
    device = batch.input_ids.device
    return [
        PromptBucket(
            prompt_len=p,
            prompts=torch.stack(g.prompts),
            rows=torch.tensor(g.rows, device=device),
            prompt_of_row=torch.tensor(g.which, device=device),
            response_len=g.response_len,
        )
        for p, g in sorted(by_len.items())
    ]


@dataclass
class _Group:
    """:func:`prompt_buckets`' rows of one prompt length while it reads the batch."""

    seen: dict[bytes, int] = field(default_factory=dict)
    prompts: list[Tensor] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    which: list[int] = field(default_factory=list)
    response_len: int = 0


def check_shared_prompt(
    model: nn.Module, batch: RolloutBatch, buckets: list[PromptBucket], plain: Tensor, temperature: float = 1.0
) -> str | None:
    """Why :func:`shared_prompt_logprobs` may not serve ``model``, or None: it gives ``plain`` (the plain forward's
    log-probs of ``batch``) within 1e-3 (5e-2 in half precision or under autocast) at the response tokens.

    Runs without gradients. The reason is one sentence naming the model and what went wrong.
    """
    name = type(model).__name__
    try:
        with torch.no_grad():
            shared = shared_prompt_logprobs(model, batch, temperature, buckets)
    except Exception as err:  # a model without a usable cache: the plain forward serves
        return f"{name} cannot continue a prompt's cache ({type(err).__name__}: {err})"
    mask = batch.response_mask[:, 1:] > 0
    diff = float((shared - plain).abs()[mask].max()) if bool(mask.any()) else 0.0
    dtype = next(model.parameters()).dtype
    low_precision = dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled(batch.input_ids.device.type)
    tolerance = 5e-2 if low_precision else 1e-3
    if not diff <= tolerance:
        return (
            f"on the first batch its log-probs differ from the plain forward's by up to {diff:.3g} (tolerance "
            f"{tolerance:g}); {name} does not continue a prompt's cache exactly"
        )
    return None


def shares_prompts(buckets: list[PromptBucket]) -> bool:
    """Whether any prompt is shared by two rows or more (else the plain forward is as cheap)."""
    return any(len(b.prompts) < len(b.rows) for b in buckets)


def shared_prompt_logprobs(
    model: nn.Module,
    batch: RolloutBatch,
    temperature: float = 1.0,
    buckets: list[PromptBucket] | None = None,
    chunked: bool = False,
) -> Tensor:
    """Log-probs of ``input_ids[:, 1:]`` at the response positions, each distinct prompt run once.

    Args:
        model: A Hugging Face causal LM (see the module docstring).
        batch: The (micro-)batch, on the model's device.
        temperature: Logits are divided by it.
        buckets: :func:`prompt_buckets` of ``batch`` when the caller has them.
        chunked: Score the responses' tokens chunk by chunk (:func:`~.chunked_head.scored_head`): no
            ``[rows, response, V]`` float32 logits at once.

    Returns:
        ``[B, T - 1]`` float32: ``logp[:, t]`` = log p(input_ids[t + 1] | input_ids[: t + 1]) where ``t + 1`` is a
        response column up to the row's bucket's longest response; 0 at the prompt's columns (as
        :meth:`GRPOModule.token_logprobs`, whose callers weigh only response tokens).

    Raises:
        RuntimeError: The model returned no cache (gradient checkpointing, or ``use_cache`` unsupported).
    """
    from transformers import DynamicCache

    width = batch.input_ids.shape[1]
    out = torch.zeros(len(batch), width - 1, device=batch.input_ids.device)
    for b in buckets if buckets is not None else prompt_buckets(batch):
        p, r = b.prompt_len, b.response_len
        first = model(
            input_ids=b.prompts,
            past_key_values=DynamicCache(config=getattr(model, "config", None)),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = first.past_key_values
        if cache is None:
            raise RuntimeError(f"{type(model).__name__} returned no cache (gradient checkpointing turns it off)")
        logits = first.logits[:, -1:][b.prompt_of_row]  # [N, 1, V]: predicts each row's first response token
        logp = target_logprobs(logits, batch.input_ids[b.rows, p : p + 1], temperature)  # [N, 1]
        if r > 1:
            cache.batch_select_indices(b.prompt_of_row)
            cols = slice(p, p + r - 1)  # every response token but the last: each predicts the next
            targets = batch.input_ids[b.rows, p + 1 : p + r]
            with scored_head(model, targets, temperature) if chunked else contextlib.nullcontext():
                rest = model(
                    input_ids=batch.input_ids[b.rows, cols],
                    attention_mask=batch.attention_mask[b.rows, : p + r - 1],
                    position_ids=torch.arange(p, p + r - 1, device=out.device).expand(len(b.rows), -1),
                    past_key_values=cache,
                    use_cache=True,
                )
            rest_logp = rest.logits if chunked else target_logprobs(rest.logits, targets, temperature)
            logp = torch.cat([logp, rest_logp], dim=1)  # [N, r]
        out = out.index_copy(0, b.rows, torch.nn.functional.pad(logp, (p - 1, width - 1 - (p - 1) - r)))
    return out
