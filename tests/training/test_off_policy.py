"""Tests of the off-policy corrections: the four weightings and the metrics by hand, bad combinations, real fits."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from lightning_hybrid_rollout.lightning.data import RolloutDataModule, collate_samples
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.training.off_policy import OffPolicyCorrection, importance_weights
from tests.lightning.test_module import _grads, _trainer, synthetic_samples, tiny_llama

# row 0: three trained tokens with pi_old / pi_rollout = 3, 1, 1/4; row 1: two trained tokens (1.5, 0.8) and a
# padding token whose ratio (100) must count nowhere
RATIOS = torch.tensor([[3.0, 1.0, 0.25], [1.5, 0.8, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ROLLOUT = torch.log(torch.full_like(RATIOS, 0.1))
OLD = ROLLOUT + RATIOS.log()


def _weights(level: str, mode: str, **bounds: float) -> tuple[torch.Tensor, torch.Tensor]:
    iw = importance_weights(OLD, ROLLOUT, MASK, OffPolicyCorrection(level, mode, **bounds))  # type: ignore[arg-type]
    return iw.weights, iw.masked


def test_token_truncate_by_hand() -> None:
    w, masked = _weights("token", "truncate", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.25], [1.5, 0.8, 0.0]]))
    assert masked.sum() == 0
    w, _ = _weights("token", "truncate")  # default cap 2
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.25], [1.5, 0.8, 0.0]]))


def test_token_mask_by_hand() -> None:
    w, masked = _weights("token", "mask", low=0.5, high=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0], [1.5, 0.8, 0.0]]))
    torch.testing.assert_close(masked, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    assert (masked * MASK).sum() / MASK.sum() == pytest.approx(2 / 5)  # the masked fraction


def test_sequence_truncate_by_hand() -> None:
    # geometric means over the trained tokens: row 0 (3 * 1 * 0.25) ** (1/3), row 1 (1.5 * 0.8) ** (1/2)
    g0, g1 = 0.75 ** (1 / 3), 1.2**0.5
    w, masked = _weights("sequence", "truncate", cap=1.0)
    torch.testing.assert_close(w, torch.tensor([[g0, g0, g0], [1.0, 1.0, 0.0]]))
    assert masked.sum() == 0
    w, _ = _weights("sequence", "truncate", cap=5.0)
    torch.testing.assert_close(w, torch.tensor([[g0, g0, g0], [g1, g1, 0.0]]))


def test_sequence_mask_by_hand() -> None:
    g1 = 1.2**0.5
    w, masked = _weights("sequence", "mask", low=0.95, high=1.5)  # row 0 (0.909) is dropped whole, row 1 kept
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [g1, g1, 0.0]]))
    torch.testing.assert_close(masked, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    w, masked = _weights("sequence", "mask", high=1.05)  # default low 0.5: row 1 (1.095) dropped
    assert masked.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]


# ------------------------------------------------------------------- in the loss, and the metrics
SHIFTS = (0.9, -0.2, 0.0, -1.2, 0.4)
"""Per-token ``log(pi_old / pi_rollout)``: the engine's log-probs are the model's minus these, in turn."""


def _shifted_batch(module: GRPOModule):
    samples = synthetic_samples(0)
    batch = collate_samples(samples)
    with torch.no_grad():
        logp = module.token_logprobs(batch)
    shift = torch.zeros_like(logp)
    for i, s in enumerate(samples):
        pos = batch.response_mask[i, 1:].nonzero().flatten()
        shift[i, pos] = torch.tensor([SHIFTS[(i + j) % len(SHIFTS)] for j in range(len(pos))])
        s.response_logprobs = (logp[i, pos] - shift[i, pos]).tolist()
    return collate_samples(samples), shift


def test_token_mask_in_the_loss_keeps_masked_tokens_in_the_denominator_and_logs_by_hand() -> None:
    corr = OffPolicyCorrection("token", "mask", low=0.5, high=2.0)
    module = GRPOModule(model=tiny_llama(), use_rollout_log_probs=False, off_policy_correction=corr)
    batch, shift = _shifted_batch(module)
    mask = batch.response_mask[:, 1:]
    ratio = shift.exp()
    kept = ((ratio >= 0.5) & (ratio <= 2.0)).float() * mask  # e^0.9 = 2.46 and e^-1.2 = 0.30 are dropped
    assert 0 < kept.sum() < mask.sum()
    loss, sums = module.compute_loss(batch)
    logp = module.token_logprobs(batch)
    # weight 0 on the dropped tokens, which stay in the token-mean denominator (as TRL)
    expected = -(kept * ratio * batch.advantages[:, None] * logp * mask).sum() / mask.sum()
    for g, v in zip(_grads(module, loss), _grads(module, expected)):
        torch.testing.assert_close(g, v, atol=1e-6, rtol=1e-4)
    n = mask.sum()
    assert (sums["is_masked"] / n).item() == pytest.approx((1 - kept.sum() / n).item())
    assert (sums["is_weight"] / n).item() == pytest.approx(((kept * ratio).sum() / n).item(), rel=1e-5)
    assert sums["is_weight_max"].item() == pytest.approx(math.exp(0.4), rel=1e-5)
    k3 = sum((math.exp(s) - 1 - s) * float(((shift == s) * mask).sum()) for s in SHIFTS)
    assert (sums["mismatch_kl"] / n).item() == pytest.approx(k3 / n.item(), rel=1e-4)  # r - 1 - log r
    assert sums["mismatch_kl"].item() > 0


def test_bad_combinations_are_one_line_errors() -> None:
    model = tiny_llama(hidden=32)
    cases = [
        (dict(level="tokens"), r"level must be one of \['token', 'sequence'\], got 'tokens'"),
        (dict(mode="clip"), r"mode must be one of \['truncate', 'mask'\]"),
        (dict(mode="mask", low=2.0, high=2.0), "0 <= low < high, got low=2.0, high=2.0"),
        (dict(mode="mask", low=3.0), "0 <= low < high, got low=3.0, high=2.0"),
        (dict(mode="mask", low=-1.0), "low must be null or a number >= 0, got -1.0"),
        (dict(cap=0.0), "cap must be null or a number > 0, got 0.0"),
        (dict(cap=-1.0), "cap must be null or a number > 0"),
        (dict(mode="mask", cap=2.0), "cap is for mode: truncate"),
        (dict(low=0.5), "low/high are for mode: mask"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            OffPolicyCorrection(**kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"needs use_rollout_log_probs=False: .* identically 1"):
        GRPOModule(model=model, off_policy_correction=OffPolicyCorrection())
    with pytest.raises(ValueError, match="not both"):
        GRPOModule(
            model=model, use_rollout_log_probs=False, off_policy_correction=OffPolicyCorrection(), truncated_is_cap=2
        )
    with pytest.raises(ValueError, match="needs use_rollout_log_probs=False"):
        GRPOModule(model=model, truncated_is_cap=2.0)
    with pytest.raises(ValueError, match="cap must be null or a number > 0"):
        GRPOModule(model=model, use_rollout_log_probs=False, truncated_is_cap=0.0)


def test_truncated_is_cap_is_a_deprecated_alias_of_token_truncate() -> None:
    with pytest.deprecated_call(match=r"off_policy_correction=\{level: token, mode: truncate, cap: C\}"):
        module = GRPOModule(model=tiny_llama(hidden=32), use_rollout_log_probs=False, truncated_is_cap=1.5)
    assert module.off_policy_correction == OffPolicyCorrection("token", "truncate", cap=1.5)


# --------------------------------------------------------------------------------------------- fits
class _Source:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return synthetic_samples(self.calls, version=2)


@pytest.mark.parametrize(
    "corr",
    [
        OffPolicyCorrection("token", "truncate", cap=1.2),
        OffPolicyCorrection("token", "mask", low=0.8, high=1.25),
        OffPolicyCorrection("sequence", "truncate", cap=1.05),
        OffPolicyCorrection("sequence", "mask", low=0.95, high=1.05),
    ],
    ids=lambda c: f"{c.level}_{c.mode}",
)
def test_fit_with_each_correction(tmp_path: Path, corr: OffPolicyCorrection) -> None:
    module = GRPOModule(model=tiny_llama(hidden=32), lr=1e-3, use_rollout_log_probs=False, off_policy_correction=corr)
    before = [p.detach().clone() for p in module.parameters()]
    trainer = _trainer(tmp_path, 2, gradient_clip_val=1.0)
    trainer.fit(module, datamodule=RolloutDataModule(source=_Source()))
    m = trainer.logged_metrics
    for name in ("is_weight_mean", "is_weight_max", "is_masked_fraction", "mismatch_kl"):
        assert torch.isfinite(m[f"train/{name}"]), name
    # the engine's log-probs are the synthetic ones, ~0.3 nats off the model's: some weights are cut or dropped
    if corr.mode == "truncate":
        assert m["train/is_weight_max"] == pytest.approx(corr.cap) and m["train/is_masked_fraction"] == 0
    else:
        assert 0 < m["train/is_masked_fraction"] < 1 and m["train/is_weight_max"] <= corr.bounds[1]
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, module.parameters()))


@pytest.mark.parametrize("recompute", [False, True], ids=["rollout_old", "recomputed_old"])
def test_manual_mode_logs_the_pre_update_policy(tmp_path: Path, recompute: bool) -> None:
    """Two PPO epochs over micro-batches of 3: the mismatch and the weights are the first epoch's (the policy before
    the update), the max is taken over micro-batches, the means divide by one epoch's tokens."""
    corr = OffPolicyCorrection("token", "truncate", cap=100.0) if recompute else None
    module = GRPOModule(
        model=tiny_llama(hidden=32),
        lr=1e-2,
        ppo_epochs=2,
        micro_batch_size=3,
        use_rollout_log_probs=not recompute,
        off_policy_correction=corr,
        shared_prompt_forward=False,
    )
    start = copy.deepcopy(module)
    trainer = _trainer(tmp_path, 2)  # one batch, two optimizer steps
    trainer.fit(module, datamodule=RolloutDataModule(source=_Source()))
    batch = collate_samples(synthetic_samples(1, version=2))
    with torch.no_grad():
        old = start.token_logprobs(batch)
    mask = batch.response_mask[:, 1:]
    d = old - batch.rollout_logprobs[:, 1:]
    m = trainer.logged_metrics
    expected_kl = ((d.exp() - d - 1) * mask).sum() / mask.sum()
    assert m["train/mismatch_kl"].item() == pytest.approx(expected_kl.item(), rel=1e-4)
    if recompute:
        assert m["train/is_weight_max"].item() == pytest.approx(d[mask > 0].exp().max().item(), rel=1e-4)
        assert m["train/is_weight_mean"].item() == pytest.approx(((d.exp() * mask).sum() / mask.sum()).item(), 1e-4)
        assert m["train/is_masked_fraction"] == 0
    else:
        assert "train/is_weight_mean" not in m


def test_a_checkpoint_with_a_correction_loads_weights_only(tmp_path: Path) -> None:
    """Lightning resumes with ``torch.load(weights_only=True)``: the hyperparameters' correction must unpickle."""
    corr = OffPolicyCorrection("sequence", "mask", low=0.9, high=1.1)
    torch.save({"hyper_parameters": {"off_policy_correction": corr}}, tmp_path / "c.ckpt")
    loaded = torch.load(tmp_path / "c.ckpt", weights_only=True)
    assert loaded["hyper_parameters"]["off_policy_correction"] == corr
