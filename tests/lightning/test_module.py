"""Tests of GRPOModule: the PPO-clip loss by hand, on-policy gradients, a real Lightning fit, DDP shards, docs."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import CSVLogger

from lightning_hybrid_rollout.lightning.data import RolloutDataModule, collate_samples
from lightning_hybrid_rollout.lightning.module import GRPOModule, kl_k3, ppo_clip_loss
from lightning_hybrid_rollout.models.format_warmup import format_warmup
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.training.off_policy import OffPolicyCorrection

REPO = Path(__file__).resolve().parents[2]
VOCAB = 64


def tiny_llama(seed: int = 0, hidden: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    return LlamaForCausalLM(cfg)


def synthetic_samples(step: int, groups: int = 2, group_size: int = 4, version: int = 0) -> list[Sample]:
    """Random prompts / responses (variable lengths), rewards that differ inside each group."""
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for k in range(groups):
        prompt = torch.randint(3, VOCAB, (3 + k,), generator=g).tolist()
        for i in range(group_size):
            n = 1 + (i + k) % 4
            out.append(
                Sample(
                    uid=f"{step}-{k}-{i}",
                    group_id=f"{step}-{k}",
                    prompt="",
                    prompt_token_ids=prompt,
                    response_token_ids=torch.randint(3, VOCAB, (n,), generator=g).tolist(),
                    response_logprobs=(-math.log(VOCAB) + 0.3 * torch.randn(n, generator=g)).tolist(),
                    reward=float((i + k) % 2),
                    min_weight_version=version - i % 2,
                    max_weight_version=version,
                )
            )
    return out


def _trainer(tmp_path: Path, max_steps: int, callbacks: list | None = None, **kw) -> Trainer:
    return Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
        callbacks=callbacks or [],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


# ----------------------------------------------------------------------------------- loss by hand
def _toy() -> tuple[torch.Tensor, ...]:
    # sample 0: two response tokens, A = +1; sample 1: one response token + one masked (padding) token, A = -1
    logp = torch.log(torch.tensor([[0.5, 0.3], [0.2, 0.9]])).requires_grad_()
    old = torch.log(torch.tensor([[0.4, 0.3], [0.4, 0.1]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return logp, old, adv, mask


def test_ppo_clip_loss_hand_computed() -> None:
    logp, old, adv, mask = _toy()
    loss, clip_frac = ppo_clip_loss(logp, old, adv, mask, clip_eps=0.2)
    # ratios: 0.5/0.4 = 1.25, 0.3/0.3 = 1.0, 0.2/0.4 = 0.5
    r = [1.25, 1.0, 0.5]
    t0 = -min(r[0] * 1.0, min(max(r[0], 0.8), 1.2) * 1.0)  # -min(1.25, 1.2) = -1.2 (clipped)
    t1 = -min(r[1] * 1.0, min(max(r[1], 0.8), 1.2) * 1.0)  # -1.0
    t2 = -min(r[2] * -1.0, min(max(r[2], 0.8), 1.2) * -1.0)  # -min(-0.5, -0.8) = 0.8 (clipped)
    expected = (t0 + t1 + t2) / 3  # token mean over the 3 response tokens
    assert expected == pytest.approx(-1.4 / 3)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert clip_frac.item() == pytest.approx(2 / 3)  # 1.25 > 1.2 and 0.5 < 0.8
    # only the unclipped token carries gradient: d/dlogp of -ratio * A = -ratio * A / 3
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.0 / 3], [0.0, 0.0]]))


def test_clip_higher_and_clip_fraction_boundaries() -> None:
    logp, old, adv, mask = _toy()
    loss, clip_frac = ppo_clip_loss(logp.detach(), old, adv, mask, clip_eps=0.2, clip_eps_high=0.3)
    assert loss.item() == pytest.approx((-1.25 - 1.0 + 0.8) / 3, abs=1e-6)  # 1.25 is inside [0.8, 1.3]
    assert clip_frac.item() == pytest.approx(1 / 3)
    ratio = torch.tensor([[0.7, 0.85, 1.0, 1.15, 1.3, 5.0]])
    _, frac = ppo_clip_loss(ratio.log(), torch.zeros(1, 6), torch.ones(1), torch.ones(1, 6), clip_eps=0.2)
    assert frac.item() == pytest.approx(3 / 6)  # 0.7, 1.3, 5.0 are outside [0.8, 1.2]
    w = torch.tensor([[2.0, 1.0], [0.5, 1.0]])
    loss_w, _ = ppo_clip_loss(logp.detach(), old, adv, mask, clip_eps=0.2, is_weights=w)
    assert loss_w.item() == pytest.approx((2 * -1.2 - 1.0 + 0.5 * 0.8) / 3, abs=1e-6)
    assert kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0


# --------------------------------------------------------------------------- on-policy gradients
def _on_policy_batch(module: GRPOModule, shift: float = 0.0):
    """A batch whose rollout log-probs are the model's own (minus ``shift`` on every response token)."""
    samples = synthetic_samples(0)
    batch = collate_samples(samples)
    with torch.no_grad():
        logp = module.token_logprobs(batch)
    for i, s in enumerate(samples):
        pos = batch.response_mask[i, 1:].nonzero().flatten()
        s.response_logprobs = (logp[i, pos] - shift).tolist()
    return collate_samples(samples)


def _grads(module: GRPOModule, loss: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in module.parameters()]


def test_token_logprobs_score_only_response_positions_and_equal_the_full_logits() -> None:
    """Logits are computed from the first response position on (``logits_to_keep``); the scored values equal a
    full forward's, the prompt columns before it are 0, and a model without ``logits_to_keep`` gets the same (the
    plain forward: ``shared_prompt_forward`` off, tests/training/test_shared_prompt.py has the shared one)."""
    module = GRPOModule(model=tiny_llama(), shared_prompt_forward=False)
    batch = collate_samples(synthetic_samples(3, groups=3))
    calls: list[int] = []
    model = module.policy_model
    forward = model.forward

    def spy(*args, logits_to_keep: int = 0, **kwargs):
        calls.append(logits_to_keep)
        return forward(*args, logits_to_keep=logits_to_keep, **kwargs)

    with torch.no_grad():
        module.token_logprobs(batch)  # the first batch checks the chunked head against the logits once
        model.forward = spy
        logp = module.token_logprobs(batch)
        del model.forward
        full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    full_lp = torch.log_softmax(full[:, :-1].float(), dim=-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    first = int(batch.response_mask[:, 1:].sum(0).nonzero()[0])
    assert first > 0 and calls == [batch.input_ids.shape[1] - first]  # the prompt's logits were never computed
    mask = batch.response_mask[:, 1:] > 0
    torch.testing.assert_close(logp[mask], full_lp[mask], atol=1e-5, rtol=1e-5)
    assert torch.all(logp[:, :first] == 0)

    class NoKeep(torch.nn.Module):  # a causal LM without Hugging Face's logits_to_keep
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None, use_cache=False):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)

    with torch.no_grad():
        plain = GRPOModule(model=NoKeep(model)).token_logprobs(batch)
    torch.testing.assert_close(plain, logp, atol=1e-6, rtol=1e-6)


def test_on_policy_ratio_one_and_vanilla_policy_gradient() -> None:
    module = GRPOModule(model=tiny_llama())
    batch = _on_policy_batch(module)
    loss, sums = module.compute_loss(batch)
    assert sums["clipped"].item() == 0 and sums["kl"].item() == pytest.approx(0.0, abs=1e-5)
    grads = _grads(module, loss)
    logp = module.token_logprobs(batch)
    mask = batch.response_mask[:, 1:]
    vanilla = -(batch.advantages[:, None] * logp * mask).sum() / mask.sum()
    # ratio 1 everywhere: the loss value is -mean_t(A), its gradient the vanilla policy gradient
    assert loss.item() == pytest.approx((-(batch.advantages[:, None] * mask).sum() / mask.sum()).item(), abs=1e-5)
    for g, v in zip(grads, _grads(module, vanilla)):
        torch.testing.assert_close(g, v, atol=1e-6, rtol=1e-4)


def test_recomputed_old_logprobs_with_truncated_is() -> None:
    # rollout log-probs 1 nat below the model's: pi_old / pi_rollout = e > cap = 2 -> every token weighs 2
    tis = OffPolicyCorrection("token", "truncate", cap=2.0)
    module = GRPOModule(model=tiny_llama(), use_rollout_log_probs=False, off_policy_correction=tis)
    batch = _on_policy_batch(module, shift=1.0)
    loss, _ = module.compute_loss(batch)
    logp = module.token_logprobs(batch)
    mask = batch.response_mask[:, 1:]
    weighted_pg = -(2.0 * batch.advantages[:, None] * logp * mask).sum() / mask.sum()
    for g, v in zip(_grads(module, loss), _grads(module, weighted_pg)):
        torch.testing.assert_close(g, v, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="use_rollout_log_probs=False"):
        GRPOModule(model=tiny_llama(), off_policy_correction=tis)
    with pytest.raises(ValueError, match="at most one"):
        GRPOModule(model_path="x", model=tiny_llama())
    with pytest.raises(ValueError, match=r"takes rollout\.model_path"):  # no model and no callback to take it from
        GRPOModule().configure_model()


# --------------------------------------------------------------------------------- Lightning fit
class _RecordingSource:
    def __init__(self, events: list) -> None:
        self.events, self.calls = events, 0

    def __call__(self) -> list[Sample]:
        self.events.append(("fetch", self.calls))
        self.calls += 1
        return synthetic_samples(self.calls, version=2)


class _RecordingCallback(Callback):
    def __init__(self, events: list) -> None:
        self.events = events

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.events.append(("start", trainer.global_step))
        pl_module.param_version = 2


def test_fit_takes_batch_after_on_train_batch_start(tmp_path: Path) -> None:
    events: list = []
    module = GRPOModule(model=tiny_llama(), lr=1e-3)
    before = [p.detach().clone() for p in module.parameters()]
    dm = RolloutDataModule(pad_token_id=0)
    dm.attach_source(_RecordingSource(events))
    trainer = _trainer(tmp_path, 3, [_RecordingCallback(events)], gradient_clip_val=1.0)
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 3
    # no prefetch: each fetch happens after that step's on_train_batch_start
    assert events == [("start", 0), ("fetch", 0), ("start", 1), ("fetch", 1), ("start", 2), ("fetch", 2)]
    metrics = trainer.logged_metrics
    for name in (
        "loss",
        "reward_mean",
        "clip_fraction",
        "kl",
        "staleness_mean",
        "staleness_max",
        "response_length_mean",
        "entropy",
    ):
        assert f"train/{name}" in metrics, name
        assert torch.isfinite(metrics[f"train/{name}"])
    # param_version 2; samples alternate min_weight_version 2 and 1
    assert metrics["train/staleness_max"] == 1 and metrics["train/staleness_mean"] == 0.5
    assert metrics["train/reward_mean"] == 0.5
    assert metrics["train/entropy"] > 0
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, module.parameters()))


def test_plain_training_step_form_would_prefetch(tmp_path: Path) -> None:
    """Negative control for the test above: the ``(batch, batch_idx)`` form fetches before the hooks run."""

    class PlainStep(GRPOModule):
        def training_step(self, batch, batch_idx):  # the form the contract forbids
            return self.compute_loss(batch.to(self.device))[0]

    events: list = []
    trainer = _trainer(tmp_path, 2, [_RecordingCallback(events)])
    trainer.fit(PlainStep(model=tiny_llama(hidden=32)), datamodule=RolloutDataModule(source=_RecordingSource(events)))
    assert events[:3] == [("fetch", 0), ("fetch", 1), ("start", 0)]


def test_fit_manual_mode_ppo_epochs_and_micro_batches(tmp_path: Path) -> None:
    events: list = []
    module = GRPOModule(
        model=tiny_llama(hidden=32),
        ppo_epochs=2,
        micro_batch_size=3,
        use_rollout_log_probs=False,
        off_policy_correction=OffPolicyCorrection("token", "truncate", cap=2.0),
        filter_groups=True,
        grad_clip=1.0,
    )
    assert not module.automatic_optimization
    before = [p.detach().clone() for p in module.parameters()]
    dm = RolloutDataModule(source=_RecordingSource(events))
    trainer = _trainer(tmp_path, 4)
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 4 and len(events) == 2  # 2 optimizer steps per batch
    assert trainer.logged_metrics["train/kept_fraction"] == 1.0
    assert torch.isfinite(trainer.logged_metrics["train/loss"])
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, module.parameters()))


def test_configure_model_loads_from_path(tmp_path: Path) -> None:
    tiny_llama(hidden=32).save_pretrained(tmp_path / "m")
    module = GRPOModule(model_path=str(tmp_path / "m"))
    with pytest.raises(RuntimeError, match="not built"):
        _ = module.policy_model
    module.configure_model()
    assert module.policy_model.config.hidden_size == 32
    assert next(module.policy_model.parameters()).dtype == torch.float32
    assert len(module.configure_optimizers().param_groups[0]["params"]) == len(list(module.parameters()))


def test_format_warmup_lowers_answer_loss() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["<pad>", "E", "B", *"0123456789+="]
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="E", pad_token="<pad>")
    assert tokenizer.encode("3+4=", add_special_tokens=False) == [6, 13, 7, 14]
    model = tiny_llama(hidden=32)
    prompts = [f"{a}+{b}=" for a in range(5) for b in range(5)]
    losses = format_warmup(model, tokenizer, prompts, steps=30, batch_size=16, lr=5e-3)
    assert len(losses) == 30
    # random 1-digit answers + end token: the floor is ln(10) / 2 ~ 1.15; random init starts near ln(64) ~ 4.2
    assert losses[0] > 3.0 and sum(losses[-5:]) / 5 < 2.0


# ------------------------------------------------------------------------------------ DDP shards
DDP_SCRIPT = textwrap.dedent(
    """
    import json, math, os, sys
    import torch
    from lightning.pytorch import Trainer
    from transformers import LlamaConfig, LlamaForCausalLM
    from lightning_hybrid_rollout.lightning.data import RolloutDataModule
    from lightning_hybrid_rollout.lightning.module import GRPOModule
    from lightning_hybrid_rollout.rollout.sample import Sample

    OUT = sys.argv[1]
    calls = []

    def source():
        k = len(calls)
        calls.append(k)
        return [
            Sample(uid=f"{k}-{i}", group_id=f"{k}-{i // 4}", prompt="", prompt_token_ids=[3, 4, 5],
                   response_token_ids=[6 + i, 7], response_logprobs=[-4.0, -4.0], reward=float(i % 3 == 0))
            for i in range(8)
        ]

    class Tap:
        def __init__(self, it, seen):
            self.it, self.seen = it, seen
        def __iter__(self):
            return self
        def __next__(self):
            item = next(self.it)
            b = item[0]
            self.seen.append({"uids": [s.uid for s in b.samples], "adv": b.advantages.tolist()})
            return item

    class Rec(GRPOModule):
        seen = []
        def training_step(self, dataloader_iter):
            return super().training_step(Tap(dataloader_iter, self.seen))

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    module = Rec(model=LlamaForCausalLM(cfg))
    dm = RolloutDataModule(source=source)
    trainer = Trainer(max_steps=2, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    checksum = sum(float(p.detach().double().sum()) for p in module.parameters())
    # a failing source on rank 0 must raise on every rank (no rank left waiting in the broadcast)
    from lightning_hybrid_rollout.lightning.data import QueueBatchIterable
    assert torch.distributed.is_initialized()
    try:
        next(iter(QueueBatchIterable(source=lambda: 1 / 0)))
        error = None
    except Exception as err:
        error = type(err).__name__
    with open(os.path.join(OUT, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"seen": Rec.seen, "calls": len(calls), "checksum": checksum, "step": trainer.global_step,
                   "error": error}, f)
    # leave gloo's threads no chance to abort the interpreter at exit ("terminate called without an active
    # exception", seen about 1 run in 3 on 2 cores)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    """
)


@pytest.mark.slow
def test_ddp_two_ranks_get_disjoint_shards(tmp_path: Path) -> None:
    script = tmp_path / "ddp_shards.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["calls"] for r in ranks] == [2, 0]  # only rank 0 calls the source
    assert [r["step"] for r in ranks] == [2, 2]
    assert [r["error"] for r in ranks] == ["ZeroDivisionError", "RuntimeError"]
    assert ranks[0]["checksum"] == pytest.approx(ranks[1]["checksum"], rel=1e-9)  # DDP kept replicas equal
    from lightning_hybrid_rollout.lightning.data import group_advantages

    for step in range(2):
        shards = [r["seen"][step] for r in ranks]
        uids = [f"{step}-{i}" for i in range(8)]
        assert shards[0]["uids"] == uids[0::2] and shards[1]["uids"] == uids[1::2]
        full_adv = group_advantages([float(i % 3 == 0) for i in range(8)], [i // 4 for i in range(8)])
        for r in range(2):
            assert shards[r]["adv"] == pytest.approx(full_adv[r::2].tolist(), abs=1e-6)


# ------------------------------------------------------------------------------------------ docs
def test_custom_module_doc_example_runs_two_steps() -> None:
    text = (REPO / "docs" / "custom_module.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1
    namespace: dict = {"__name__": "__main__"}
    exec(compile(blocks[0], "docs/custom_module.md", "exec"), namespace)
    trainer, module = namespace["trainer"], namespace["module"]
    assert trainer.global_step == 2
    assert module.policy_model is module.model and module.baseline != 0.0
    assert "train/reward_mean" in trainer.callback_metrics


def test_mask_truncated_drops_length_cut_responses_from_the_loss_and_the_fraction_is_measured() -> None:
    samples = synthetic_samples(0)
    for s in samples[::2]:
        s.finish_reason = "length"
    batch = collate_samples(samples, pad_token_id=0)
    assert batch.truncated.tolist() == [1.0, 0.0] * (len(samples) // 2)
    kept = GRPOModule(model=tiny_llama(), mask_truncated=False).loss_mask(batch)
    masked = GRPOModule(model=tiny_llama(), mask_truncated=True).loss_mask(batch)
    assert masked[::2].sum() == 0 and torch.equal(masked[1::2], kept[1::2]) and kept[::2].sum() > 0


def test_a_multi_turn_episodes_tool_tokens_contribute_no_gradient() -> None:
    """``Sample.loss_mask`` reaches the loss: the gradient w.r.t. each token's log-prob is 0 on tool/environment
    tokens and not 0 on model tokens."""
    module = GRPOModule(model=tiny_llama())
    mask = [1, 1, 1, 0, 0, 0, 1, 1]
    samples = [
        Sample(f"u{i}", "g", "p", [5, 6, 7], [10 + i, 11, 12, 20, 21, 22, 13, 14], [-1.0] * 8, reward=float(i))
        for i in range(2)
    ]
    for s in samples:
        s.loss_mask = list(mask)
    batch = collate_samples(samples, pad_token_id=0)
    assert batch.response_mask[0, 3:11].tolist() == [float(m) for m in mask]
    logp = module.token_logprobs(batch).detach().requires_grad_(True)
    batch.rollout_logprobs[:, 1:] = logp.detach()  # on-policy: ratio 1, nothing clipped
    module.token_logprobs = lambda b: logp  # the loss's own per-token log-probs, as a leaf to differentiate
    loss, sums = module.compute_loss(batch)
    (grad,) = torch.autograd.grad(loss, logp)
    response = grad[:, 2:10]  # position t scores token t + 1: the response's 8 tokens
    on = torch.tensor(mask, dtype=torch.bool)
    assert sums["tokens"].item() == 2 * sum(mask)
    assert (response[:, ~on] == 0).all() and (response[:, on] != 0).all()


# ------------------------------------------------------------------------------- token-budget micro-batches
class _GradTap(Callback):
    """The gradients (before clipping) and the logged metrics of every optimizer step."""

    def __init__(self) -> None:
        self.grads: list[list[torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads.append([p.grad.detach().clone() for p in pl_module.parameters()])


def _fit_with_budget(tmp_path: Path, budget: int | None, *, chunked: bool, **module_kw) -> tuple[list, dict, list]:
    module = GRPOModule(model=tiny_llama(hidden=32), max_tokens_per_forward=budget, **module_kw)
    if not chunked:
        module._chunked_head_ok = False  # the step as it was: the whole micro-batch's logits at once
    tap = _GradTap()
    kw = {"gradient_clip_val": 1.0} if module.automatic_optimization else {}
    trainer = _trainer(tmp_path / f"b{budget}{chunked}", 2, [tap], **kw)
    trainer.fit(module, datamodule=RolloutDataModule(source=_RecordingSource([])))
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items() if k.startswith("train/")}
    return tap.grads, metrics, [p.detach() for p in module.parameters()]


@pytest.mark.parametrize(
    "module_kw",
    [
        {},  # automatic optimisation, Trainer(gradient_clip_val=1.0)
        {"ppo_epochs": 2, "use_rollout_log_probs": False, "grad_clip": 1.0},  # manual
        {
            "off_policy_correction": OffPolicyCorrection("sequence", "mask", low=0.5, high=2.0),
            "use_rollout_log_probs": False,
        },
    ],
    ids=["automatic", "manual", "sequence-correction"],
)
def test_a_step_cut_into_token_budget_micro_batches_equals_the_whole_batch_step(tmp_path: Path, module_kw) -> None:
    """8 rows of 4-8 tokens: a budget of 12 tokens runs ~5 micro-batches with the chunked head; the gradients, the
    parameters after two steps and every train/* metric equal the one-forward step's with full logits."""
    whole_grads, whole_metrics, whole_params = _fit_with_budget(tmp_path, None, chunked=False, **module_kw)
    split_grads, split_metrics, split_params = _fit_with_budget(tmp_path, 12, chunked=True, **module_kw)
    assert len(whole_grads) == len(split_grads) >= 2
    for whole, split in zip(whole_grads, split_grads):
        for a, b in zip(whole, split):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    for a, b in zip(whole_params, split_params):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert split_metrics.keys() == whole_metrics.keys()
    for key, value in whole_metrics.items():
        assert split_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_a_small_budget_really_cuts_the_batch(tmp_path: Path) -> None:
    module = GRPOModule(model=tiny_llama(hidden=32), max_tokens_per_forward=12)
    batch = collate_samples(synthetic_samples(1))
    parts = module.micro_batches(batch)
    assert len(parts) > 2 and all(counts for _, counts in parts)
    assert sum(len(mb) for mb, _ in parts) == len(batch)
    assert all(len(mb) * mb.input_ids.shape[1] <= 12 or len(mb) == 1 for mb, _ in parts)
    assert GRPOModule(model=tiny_llama(hidden=32)).micro_batches(batch) == [(batch, True)]  # the default: one


def test_a_budget_below_the_longest_sequence_is_one_line_before_the_run() -> None:
    with pytest.raises(Exception, match=r"max_tokens_per_forward \(64\) is below .* raise model.max_tokens_per"):
        GRPOModule(model=tiny_llama(hidden=32), max_tokens_per_forward=64).fit_sequence_length(160)
    module = GRPOModule(model=tiny_llama(hidden=32))
    module.fit_sequence_length(100_000)
    assert module.tokens_per_forward == 100_000  # the derived default never splits one sequence
