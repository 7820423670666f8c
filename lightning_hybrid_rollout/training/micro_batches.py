"""Micro-batches by a token budget: a training step's memory follows ``max_tokens_per_forward``, not its mini-batch.

A mini-batch is cut into consecutive micro-batches whose padded size (rows x their longest row) stays within the
budget, as verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu`` does; every rank of a multi-rank strategy
runs the same number of them (their collectives pair up), a rank with fewer rows repeating a row at zero weight. The
default budget is derived from the model's config so that one forward's saved activations stay near
``ACTIVATION_BUDGET_BYTES`` (docs/grpo.md, "Memory").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "ACTIVATION_BUDGET_BYTES",
    "activation_bytes_per_token",
    "default_tokens_per_forward",
    "even_out",
    "plan_micro_batches",
    "same_count_on_every_rank",
]

ACTIVATION_BUDGET_BYTES = 2 * 1024**3
"""What one forward's saved activations may take by default (float32 training)."""
_MIN_TOKENS, _MAX_TOKENS = 1024, 65536


def activation_bytes_per_token(config: Any) -> int:
    """Bytes a float32 training forward of a decoder LM keeps per token for the backward (an estimate).

    Per layer: about 16 hidden-sized and 5 intermediate-sized tensors (norms, projections, attention output,
    the MLP's gate/up/act), each 4 bytes an element; the logits are not counted (they are scored in chunks).
    """
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or 1024)
    intermediate = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 12)
    return 4 * layers * (16 * hidden + 5 * intermediate)


def default_tokens_per_forward(config: Any) -> int:
    """``GRPOModule(max_tokens_per_forward=None)``: ``ACTIVATION_BUDGET_BYTES`` over the model's bytes per token, in
    ``[1024, 65536]`` (SmolLM2-135M: 1,059 tokens; the tiny CPU model: the maximum)."""
    tokens = ACTIVATION_BUDGET_BYTES // max(1, activation_bytes_per_token(config))
    return int(min(_MAX_TOKENS, max(_MIN_TOKENS, tokens)))


def plan_micro_batches(lengths: Sequence[int], max_tokens: int, max_rows: int | None = None) -> list[slice]:
    """Consecutive row ranges whose ``rows x longest row`` stays within ``max_tokens`` (and ``max_rows`` rows).

    A row longer than ``max_tokens`` goes alone (``GRPOModule`` refuses such a run before it starts).

    Example::

        plan_micro_batches([3, 5, 2, 8], max_tokens=10)  # [slice(0, 2), slice(2, 3), slice(3, 4)]
    """
    plan: list[slice] = []
    start, longest = 0, 0
    for i, length in enumerate(lengths):
        wider = max(longest, int(length))
        rows = i - start + 1
        if i > start and (rows * wider > max_tokens or (max_rows is not None and rows > max_rows)):
            plan.append(slice(start, i))
            start, wider = i, int(length)
        longest = wider
    if len(lengths):
        plan.append(slice(start, len(lengths)))
    return plan


def even_out(plan: list[slice], count: int) -> list[slice | None]:
    """``plan`` cut further to ``count`` micro-batches (the widest range halved first); ``None`` pads a plan of fewer
    rows than ``count`` (the caller runs a zero-weight row there, so its collectives still pair up)."""
    out: list[slice | None] = list(plan)
    while len(out) < count:
        widest = max(range(len(out)), key=lambda j: -1 if out[j] is None else out[j].stop - out[j].start)
        part = out[widest]
        if part is None or part.stop - part.start < 2:
            out.extend([None] * (count - len(out)))
            break
        mid = (part.start + part.stop) // 2
        out[widest : widest + 1] = [slice(part.start, mid), slice(mid, part.stop)]
    return out


def same_count_on_every_rank(count: int, device: torch.device) -> int:
    """The largest micro-batch count of any rank (``count`` itself in a single process)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    backend = dist.get_backend()
    on = device if backend != "gloo" else torch.device("cpu")
    value = torch.tensor([count], dtype=torch.long, device=on)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())
