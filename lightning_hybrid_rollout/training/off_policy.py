"""Off-policy correction between the trainer's old policy and the rollout engine's: importance weights at token or
sequence level, truncated or masked (TRL's ``vllm_importance_sampling_mode``, verl's ``rollout_correction``); the
formulas and when to use which are in docs/grpo.md."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor

from lightning_hybrid_rollout.config.base import Checker, ConfigBase
from lightning_hybrid_rollout.config.fields import choice, real

LEVELS: tuple[str, ...] = ("token", "sequence")
"""Accepted values of :attr:`OffPolicyCorrection.level`."""

MODES: tuple[str, ...] = ("truncate", "mask")
"""Accepted values of :attr:`OffPolicyCorrection.mode`."""

DEFAULT_CAP = 2.0
"""``cap`` of the truncate mode when none is given (TRL's former ``vllm_importance_sampling_cap``, verl's
``rollout_is_threshold``)."""

DEFAULT_BOUNDS = (0.5, 2.0)
"""``(low, high)`` of the mask mode when none is given (IcePop's range)."""

_MAX_LOG_RATIO = 20.0  # exp(±20) bounds a weight before truncation or masking (verl's safety bound)


@dataclass
class OffPolicyCorrection(ConfigBase):
    """Importance weight ``w = pi_old / pi_rollout`` per token (or per sequence), truncated or masked.

    Example::

        GRPOModule(use_rollout_log_probs=False, off_policy_correction=OffPolicyCorrection("sequence", "mask"))
    """

    level: Literal["token", "sequence"] = choice("token", LEVELS, fix="Use token (TIS/IcePop per token) or sequence.")
    """``token``: one weight per token; ``sequence``: one weight per response, the geometric mean of its tokens'
    ratios over the trained tokens, ``exp(mean_t log(pi_old / pi_rollout))``."""
    mode: Literal["truncate", "mask"] = choice("truncate", MODES, fix="Use truncate (TIS) or mask (IcePop).")
    """``truncate``: ``min(w, cap)`` (TIS); ``mask``: weight 0 where ``w`` lies outside ``[low, high]`` (IcePop)."""
    cap: float | None = real(None, above=0.0, nullable=True, fix="E.g. 2.0 (the default).")
    """Truncate mode only: the largest weight (> 0); default 2.0."""
    low: float | None = real(None, at_least=0.0, nullable=True, fix="E.g. 0.5 (the default).")
    """Mask mode only: tokens (sequences) with ``w < low`` get weight 0 (>= 0, < ``high``); default 0.5."""
    high: float | None = real(None, above=0.0, nullable=True, fix="E.g. 2.0 (the default).")
    """Mask mode only: tokens (sequences) with ``w > high`` get weight 0 (> ``low``); default 2.0."""

    SECTION: ClassVar[str] = "off_policy_correction"

    def check(self, c: Checker) -> None:
        if self.mode == "truncate" and (self.low is not None or self.high is not None):
            key = "low" if self.low is not None else "high"
            fix = "Truncate takes cap; low/high are for mode: mask."
            c.add(key, "null with mode: truncate", getattr(self, key), fix)
        if self.mode == "mask":
            if self.cap is not None:
                c.add("cap", "null with mode: mask", self.cap, "Mask takes low and high; cap is for mode: truncate.")
            low, high = self.bounds
            if not low < high:
                c.problems.append(
                    f"{self.SECTION} needs 0 <= low < high, got low={low}, high={high}. E.g. low: 0.5, high: 2.0."
                )

    @property
    def bounds(self) -> tuple[float, float]:
        """``(low, high)`` of the mask mode, defaults filled in."""
        low = DEFAULT_BOUNDS[0] if self.low is None else self.low
        high = DEFAULT_BOUNDS[1] if self.high is None else self.high
        return low, high


# a checkpoint's hyperparameters hold the module's correction: let torch.load(weights_only=True) (the default since
# torch 2.6, used when Lightning resumes a fit) rebuild it
torch.serialization.add_safe_globals([OffPolicyCorrection])


@dataclass(frozen=True)
class ImportanceWeights:
    """The weights :func:`importance_weights` computed for one (micro-)batch."""

    weights: Tensor
    """``[B, L]`` weight of each token in the loss (no grad; 0 off the mask and where masked)."""
    masked: Tensor
    """``[B, L]`` 1 on trained tokens the mask mode dropped, else 0."""


def importance_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, correction: OffPolicyCorrection
) -> ImportanceWeights:
    """Importance weights ``pi_old / pi_rollout`` of the trained tokens, corrected as ``correction`` says.

    Args:
        old_logprobs: ``[B, L]`` log-probs under the trainer's old policy (recomputed, or the current ones detached).
        rollout_logprobs: ``[B, L]`` the engine's log-probs of the same tokens.
        mask: ``[B, L]`` 1 on the tokens the loss trains (the sequence level averages over them).
        correction: Level, mode and bounds.

    Returns:
        The weights and the masked tokens.

    Example::

        iw = importance_weights(old, batch.rollout_logprobs[:, 1:], mask, OffPolicyCorrection("token", "mask"))
    """
    on = mask > 0
    log_ratio = torch.where(on, old_logprobs.detach() - rollout_logprobs, torch.zeros_like(old_logprobs))
    if correction.level == "sequence":
        n = on.sum(dim=-1, keepdim=True).clamp_min(1)
        log_ratio = (log_ratio.sum(dim=-1, keepdim=True) / n).expand_as(log_ratio)
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    if correction.mode == "truncate":
        cap = DEFAULT_CAP if correction.cap is None else correction.cap
        weights, dropped = ratio.clamp(max=cap), torch.zeros_like(on)
    else:
        low, high = correction.bounds
        # compared in log space: a ratio that the ±20 bound clamped is still outside any finite range
        dropped = on & ((log_ratio < _log(low)) | (log_ratio > _log(high)))
        weights = torch.where(dropped, torch.zeros_like(ratio), ratio)
    zero = torch.zeros_like(weights)
    return ImportanceWeights(torch.where(on, weights, zero), dropped.to(weights.dtype))


def importance_weight_sums(iw: ImportanceWeights, mask: Tensor) -> dict[str, Tensor]:
    """Detached sums for the ``train/is_*`` metrics: ``is_weight`` (sum of the trained tokens' weights),
    ``is_weight_max`` (their max; combine with ``max``, not ``+``) and ``is_masked`` (count of masked tokens).

    Example::

        sums = importance_weight_sums(iw, mask)  # train/is_weight_mean = sums["is_weight"] / mask.sum()
    """
    on = mask > 0
    w = iw.weights.detach()
    top = w[on].max() if bool(on.any()) else torch.zeros((), dtype=w.dtype, device=w.device)
    return {"is_weight": (w * mask).sum(), "is_weight_max": top, "is_masked": (iw.masked * mask).sum()}


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf
