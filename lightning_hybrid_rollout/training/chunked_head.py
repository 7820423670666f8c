"""Per-token log-probs without the batch's float32 logits: the LM head scored in chunks, each recomputed in backward.

Inside :func:`scored_head` the model's output head returns ``log softmax(head(h) / T)`` at the given targets instead
of logits, a chunk of ``chunk_tokens(V)`` positions at a time under ``torch.utils.checkpoint``: at most one chunk's
``[tokens, V]`` logits exist at once, in forward and in backward (TRL's ``selective_log_softmax`` and Liger's fused
linear cross-entropy solve the same problem). The model still runs its own forward, so strategy hooks (DDP, FSDP2,
DeepSpeed) see what they always see. ``GRPOModule`` checks it once against the plain logits and falls back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["LOGITS_CHUNK_BYTES", "chunk_tokens", "has_output_head", "scored_head", "target_logprobs"]

LOGITS_CHUNK_BYTES = 256 * 1024**2
"""The float32 logits one chunk may hold."""


def chunk_tokens(vocab_size: int) -> int:
    """Positions per chunk: ``LOGITS_CHUNK_BYTES`` of float32 logits over a vocabulary of ``vocab_size``."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * max(1, vocab_size)))


def has_output_head(model: nn.Module) -> bool:
    """Whether ``model`` exposes its output head (``get_output_embeddings()``, every Hugging Face causal LM)."""
    getter = getattr(model, "get_output_embeddings", None)
    try:
        return isinstance(getter(), nn.Module) if callable(getter) else False
    except (AttributeError, NotImplementedError):
        return False


def target_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)`` at ``targets`` (``[..., V]`` and ``[...]``), in float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _score(head_forward: Any, temperature: float, hidden: Tensor, targets: Tensor) -> Tensor:
    return target_logprobs(head_forward(hidden), targets, temperature)


@contextmanager
def scored_head(model: nn.Module, targets: Tensor, temperature: float = 1.0) -> Iterator[None]:
    """Within it, ``model(...).logits`` is ``[B, K]`` float32 log-probs of ``targets`` ``[B, K]``.

    The head scores its first ``K`` positions (those ``targets`` follow: with ``logits_to_keep=K + 1`` the last
    kept position, which predicts nothing, is dropped).

    Example::

        with scored_head(model, input_ids[:, 1:]):
            logp = model(input_ids=input_ids, logits_to_keep=input_ids.shape[1]).logits  # [B, T - 1]
    """
    head = model.get_output_embeddings()
    original = head.forward
    vocab = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    step = chunk_tokens(vocab)

    def forward(hidden: Tensor) -> Tensor:
        b, k = targets.shape
        flat_h = hidden[:, :k].reshape(b * k, hidden.shape[-1])
        flat_t = targets.reshape(b * k)
        parts = []
        for s in range(0, b * k, step):
            h, t = flat_h[s : s + step], flat_t[s : s + step]
            if torch.is_grad_enabled() and h.requires_grad:
                parts.append(checkpoint(_score, original, temperature, h, t, use_reentrant=False))
            else:
                parts.append(_score(original, temperature, h, t))
        return (torch.cat(parts) if parts else flat_h.new_zeros(0)).view(b, k)

    patched = head.__dict__.get("forward")  # a hook's own forward (accelerate) is put back as it was
    head.forward = forward
    try:
        yield
    finally:
        if patched is None:
            del head.forward  # the class's forward again
        else:
            head.forward = patched
