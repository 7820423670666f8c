"""The format warm-up: a few supervised steps that teach a random-init model the *shape* of an answer before GRPO."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["format_warmup"]


def format_warmup(
    model: nn.Module,
    tokenizer: Any,
    task_prompts: Sequence[str | Sequence[int]],
    steps: int = 100,
    *,
    answer_length: int | tuple[int, int] = 1,
    alphabet: str = "0123456789",
    batch_size: int = 64,
    lr: float = 1e-3,
    grad_clip: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Supervised "format warm-up": teach a random-init model the *shape* of an answer, not the answer.

    Each row is a task prompt followed by a random string of ``alphabet`` characters and the end token; the
    loss is cross-entropy on the answer and end token only. design/notes.md §7: ~100 steps make GRPO from a random-init
    tiny model reliable (without it, the model rarely ends an answer and rewards stay at zero).

    Args:
        model: A Hugging Face causal LM (trained in place).
        tokenizer: A Hugging Face tokenizer with ``eos_token_id``; string prompts are encoded with
            ``tokenizer.encode(prompt)`` (encode them the way the rollout does, or pass token id lists).
        task_prompts: Prompts to sample from: strings or already-tokenized id lists.
        steps: Optimizer steps.
        answer_length: Answer length in characters, or an inclusive ``(min, max)`` range.
        alphabet: Characters random answers are drawn from (each must encode to token ids on its own).
        batch_size: Rows per step.
        lr: AdamW learning rate (a fresh optimizer, discarded afterwards).
        grad_clip: Max grad norm.
        seed: Seed of the prompt / answer sampler.

    Returns:
        The loss of every step.

    Example::

        losses = format_warmup(model, tokenizer, [f"{a}+{b}=" for a in range(5) for b in range(5)], steps=100)
    """
    if not task_prompts:
        raise ValueError("format_warmup needs at least one task prompt")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in task_prompts]
    char_ids = {c: tokenizer.encode(c, add_special_tokens=False) for c in alphabet}
    lo, hi = (answer_length, answer_length) if isinstance(answer_length, int) else answer_length
    rng = random.Random(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    was_training = model.training
    model.train()
    losses: list[float] = []
    try:
        for _ in range(steps):
            rows = []
            for _ in range(batch_size):
                prompt = rng.choice(prompts)
                answer = [t for _ in range(rng.randint(lo, hi)) for t in char_ids[rng.choice(alphabet)]]
                rows.append((prompt, [*answer, eos]))
            width = max(len(p) + len(a) for p, a in rows)
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
            attention_mask = torch.zeros_like(input_ids)
            labels = torch.full_like(input_ids, -100)
            for i, (p, a) in enumerate(rows):
                ids = torch.tensor(p + a, dtype=torch.long)
                input_ids[i, : len(ids)] = ids
                attention_mask[i, : len(ids)] = 1
                labels[i, len(p) : len(ids)] = ids[len(p) :]
            out = model(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                labels=labels.to(device),
                use_cache=False,
            )
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            losses.append(float(out.loss.detach()))
    finally:
        model.train(was_training)
    return losses
