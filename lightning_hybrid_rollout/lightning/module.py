"""GRPO (PPO-clip with group-normalised advantages) for Hugging Face causal LMs, as a LightningModule.

It honours the contract every trainable module does (``policy_model``, ``training_step(self, dataloader_iter)``,
``param_version``), described in docs/custom_module.md; the loss and its options are in docs/grpo.md.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_deprecation, rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from typing_extensions import override

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.lightning.data import RolloutBatch, next_rollout_batch
from lightning_hybrid_rollout.training.chunked_head import has_output_head, scored_head
from lightning_hybrid_rollout.training.lora import inject_lora, is_lora_model, lora_config_from
from lightning_hybrid_rollout.training.micro_batches import (
    default_tokens_per_forward,
    even_out,
    plan_micro_batches,
    same_count_on_every_rank,
)
from lightning_hybrid_rollout.training.off_policy import (
    OffPolicyCorrection,
    importance_weight_sums,
    importance_weights,
)
from lightning_hybrid_rollout.training.shared_prompt import (
    PromptBucket,
    check_shared_prompt,
    prompt_buckets,
    shared_prompt_logprobs,
    shares_prompts,
    target_logprobs,
)

_MAX_LOG_RATIO = 20.0
_PRE_UPDATE_SUMS = frozenset({"mismatch_kl", "is_weight", "is_weight_max", "is_masked"})
"""Sums of the trainer's policy before the step's update: taken from the first PPO epoch only."""
_MAX_SUMS = frozenset({"is_weight_max"})
"""Sums combined across micro-batches by ``max``."""


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    is_weights: Tensor | None = None,
    token_count: Tensor | float | None = None,
) -> tuple[Tensor, Tensor]:
    """Token-mean PPO-clip policy loss and clip fraction.

    ``ratio = exp(logprobs - old_logprobs)`` (log-ratio clamped to ±20 for safety);
    ``loss = sum_t mask_t * w_t * -min(ratio_t * A, clip(ratio_t, 1 - clip_eps, 1 + clip_eps_high) * A) / N``
    with ``N = sum(mask)`` (or ``token_count``), ``w`` the optional importance weights (1 by default).
    ``clip_fraction`` = share of masked tokens whose ratio lies outside ``[1 - clip_eps, 1 + clip_eps_high]``.

    Args:
        logprobs: ``[B, L]`` log-probs of the taken tokens under the current policy (with grad).
        old_logprobs: ``[B, L]`` log-probs under the behaviour ("old") policy.
        advantages: ``[B]`` per-sample or ``[B, L]`` per-token advantages.
        mask: ``[B, L]`` 1 on tokens that count, 0 elsewhere.
        clip_eps: Lower clip range (ratio >= 1 - clip_eps).
        clip_eps_high: Upper clip range (DAPO clip-higher); defaults to ``clip_eps``.
        is_weights: Optional ``[B, L]`` per-token weights (e.g. truncated importance sampling), no grad.
        token_count: Denominator of the token mean; defaults to ``mask.sum()`` (pass the full batch's count when
            summing micro-batch losses).

    Returns:
        ``(loss, clip_fraction)``, both scalars.

    Example::

        loss, clip_frac = ppo_clip_loss(logp, batch_old_logp, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = mask.to(logprobs.dtype)
    log_ratio = torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    adv = adv.to(logprobs.dtype)
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * adv
    per_token = -torch.min(surr1, surr2)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    denom = mask.sum() if token_count is None else torch.as_tensor(token_count, dtype=mask.dtype, device=mask.device)
    loss = (per_token * mask).sum() / denom.clamp_min(1.0)
    with torch.no_grad():
        outside = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)).to(mask.dtype)
        clip_fraction = (outside * mask).sum() / mask.sum().clamp_min(1.0)
    return loss, clip_fraction


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of ``KL(pi || ref)`` from tokens sampled by ``pi``: ``exp(d) - d - 1``, ``d = ref - pi``.

    Non-negative, unbiased, low variance (Schulman's "Approximating KL divergence").

    Args:
        logprobs: ``[B, L]`` log-probs under the policy.
        ref_logprobs: ``[B, L]`` log-probs under the reference (here: the rollout engine's).

    Returns:
        ``[B, L]`` per-token estimates.

    Example::

        kl = (kl_k3(logp, rollout_logp) * mask).sum() / mask.sum()
    """
    d = (ref_logprobs - logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.exp(d) - d - 1.0


def _add_sums(totals: dict[str, Tensor], sums: dict[str, Tensor], first_epoch: bool) -> None:
    """A micro-batch's token sums added to the step's (``max`` for the ``_MAX_SUMS``; the pre-update ones from the
    first PPO epoch only)."""
    for k, v in sums.items():
        if k in _PRE_UPDATE_SUMS and not first_epoch:
            continue  # the trainer's policy before the step's update: the first epoch's
        totals[k] = torch.maximum(totals[k], v) if k in _MAX_SUMS and k in totals else totals.get(k, 0) + v


def _takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model.forward`` accepts Hugging Face's ``logits_to_keep`` (every causal LM of transformers >= 4.50)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


class GRPOModule(LightningModule):
    """GRPO / PPO-clip trainer for a Hugging Face causal LM fed by rollout batches.

    Optimisation is automatic (clip with ``Trainer(gradient_clip_val=1.0)``) unless ``ppo_epochs > 1`` or
    ``micro_batch_size`` is set; then it is manual, clipping with ``grad_clip`` (docs/grpo.md).

    Args:
        model_path: Hugging Face model directory, loaded lazily (float32) in :meth:`configure_model`. Leave it out
            under a ``HybridRolloutCallback``: the module then takes ``rollout.model_path`` (one name for the
            trainer's and the engines' model; a different one is refused).
        model: An already-built causal LM (alternative to ``model_path``).
        lr: AdamW learning rate.
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        clip_eps: PPO clip range (lower side: ratio >= 1 - clip_eps).
        clip_eps_high: Upper clip range (DAPO clip-higher); defaults to ``clip_eps``.
        use_rollout_log_probs: If True, the "old" log-probs are the rollout engine's (no extra forward; stale
            samples are corrected by the PPO ratio itself). If False, they are recomputed with the current
            model before the update.
        off_policy_correction: With ``use_rollout_log_probs=False`` (decoupled PPO: the clip around the trainer's
            old policy): weight each token by ``pi_old / pi_rollout`` per token or per sequence, truncated or
            masked (:class:`~.off_policy.OffPolicyCorrection`, docs/grpo.md). ``None``: weight 1.
        truncated_is_cap: Deprecated spelling of ``off_policy_correction=OffPolicyCorrection("token", "truncate",
            cap=truncated_is_cap)``.
        kl_coef: Weight of the k3 KL estimate against the rollout log-probs in the loss (0: only logged).
        ppo_epochs: Optimizer passes over each batch (> 1 switches to manual optimisation).
        micro_batch_size: Rows per forward/backward at most (gradient accumulation; switches to manual
            optimisation). ``max_tokens_per_forward`` bounds them too.
        max_tokens_per_forward: The most tokens (rows x their longest row) one forward/backward takes: each
            mini-batch is cut into micro-batches within it and their gradients summed, the same loss and gradients
            as one forward (verl's ``ppo_max_token_len_per_gpu``). ``None``: derived from the model's config, about
            2 GiB of saved activations (:func:`~.micro_batches.default_tokens_per_forward`), and never below the
            run's longest sequence. The log-probs never hold the micro-batch's float32 logits at once
            (:mod:`~.chunked_head`).
        filter_groups: Zero the loss weight of samples whose group's rewards are all equal (their advantage is
            0; dropping them from the token-mean denominator is DAPO's "dynamic sampling" at loss level).
        mask_truncated: Zero the loss weight of responses cut at ``response_length`` (no end token: their reward
            judges an unfinished answer; DAPO's overlong filtering). ``train/truncated_fraction`` is logged always.
        temperature: Logits are divided by it; must match what the engine's log-probs were computed under.
        grad_clip: Max grad norm in manual mode (``Trainer(gradient_clip_val=...)`` is refused by Lightning
            there); in automatic mode used only if the Trainer sets none.
        shared_prompt_forward: Run each prompt a batch's rows share (a GRPO group's ``n`` samples) through the
            model once and its rows' responses on top of its cache (:mod:`~.shared_prompt`): the same log-probs
            and gradients, without ``n - 1`` of each group's prompt forwards and backwards, but two model calls
            per micro-batch instead of one. ``None`` (default): on for a model on the CPU, off on a GPU (where
            it measured slower); ``True``: on; ``False``: off. A model that cannot or disagrees on the first shared
            batch falls back to the plain forward with one warning. Single-process training only.
        peft: Train a LoRA adapter instead of the whole model: PEFT ``LoraConfig`` fields (``r``, ``lora_alpha``,
            ``lora_dropout``, ``target_modules``, ...), checked here; only the adapter trains, checkpoints hold the
            adapter and its optimizer state, the weight sync pushes the merged weights (docs/lora.md).

    Example::

        module = GRPOModule(model_path="runs/tiny-llama", lr=3e-4, clip_eps_high=0.28)
        trainer = Trainer(max_steps=100, gradient_clip_val=1.0, callbacks=[HybridRolloutCallback(...)])
        trainer.fit(module, datamodule=RolloutDataModule(pad_token_id=0))
    """

    def __init__(
        self,
        model_path: str | None = None,
        model: nn.Module | None = None,
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        clip_eps: float = 0.2,
        clip_eps_high: float | None = None,
        use_rollout_log_probs: bool = True,
        off_policy_correction: OffPolicyCorrection | None = None,
        truncated_is_cap: float | None = None,
        kl_coef: float = 0.0,
        ppo_epochs: int = 1,
        micro_batch_size: int | None = None,
        max_tokens_per_forward: int | None = None,
        filter_groups: bool = False,
        mask_truncated: bool = False,
        temperature: float = 1.0,
        grad_clip: float | None = None,
        shared_prompt_forward: bool | None = None,
        peft: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if model_path is not None and model is not None:
            raise ValueError("pass at most one of model_path or model")
        if ppo_epochs < 1:
            raise ValueError(f"ppo_epochs must be >= 1, got {ppo_epochs}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if max_tokens_per_forward is not None and (
            isinstance(max_tokens_per_forward, bool) or not isinstance(max_tokens_per_forward, int)
        ):
            raise ValueError(f"max_tokens_per_forward must be an integer or null, got {max_tokens_per_forward!r}")
        if max_tokens_per_forward is not None and max_tokens_per_forward < 1:
            raise ValueError(f"max_tokens_per_forward must be >= 1 (or null: derived), got {max_tokens_per_forward}")
        if truncated_is_cap is not None:
            if off_policy_correction is not None:
                raise ValueError("pass off_policy_correction or its deprecated spelling truncated_is_cap, not both")
            rank_zero_deprecation(
                "GRPOModule(truncated_is_cap=C) is deprecated: write "
                "off_policy_correction={level: token, mode: truncate, cap: C}"
            )
            off_policy_correction = OffPolicyCorrection("token", "truncate", cap=truncated_is_cap)
        if off_policy_correction is not None and use_rollout_log_probs:
            raise ValueError(
                "off_policy_correction needs use_rollout_log_probs=False: with the engine's log-probs as the old "
                "policy its weight is identically 1"
            )
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        lora_config = lora_config_from(peft) if peft is not None else None
        self.save_hyperparameters(ignore=["model"])
        self.lora_config = lora_config
        self.strict_loading = lora_config is None  # a LoRA checkpoint holds the adapter only (on_save_checkpoint)
        self.model: nn.Module | None = model
        self.off_policy_correction = off_policy_correction
        self.param_version: int = 0
        self.automatic_optimization = ppo_epochs == 1 and micro_batch_size is None
        self._shared_prompt_ok: bool | None = None  # None: not checked yet (on the first batch that shares prompts)
        self._chunked_head_ok: bool | None = None  # None: not checked yet (on the first batch)
        self._longest_sequence = 0  # the run's longest sequence (fit_sequence_length); the default budget covers it
        self._tokens_per_forward: int | None = None  # resolved on the first step

    # ------------------------------------------------------------------ model
    @property
    def policy_model(self) -> nn.Module:
        """The Hugging Face model whose weights are synced to the rollout engines."""
        if self.model is None:
            raise RuntimeError("the policy model is not built yet: it is loaded in configure_model() (trainer.fit)")
        return self.model

    def validation_step(self, batch: Sequence[Any], batch_idx: int) -> Tensor | None:
        """Answers to held-out prompts, scored by the run's reward functions.

        With the callback's validation set (:class:`~lightning_hybrid_rollout.validation.answers.ValidationSet`):
        up to ``rollout.response_length`` tokens, the run's stop tokens, ``val_n`` samples per prompt; the epoch's
        ``val/reward``, ``val/pass@1``, ``val/pass@<n>`` are logged at its end. An agentic run's set
        (:class:`~lightning_hybrid_rollout.validation.episodes.EpisodeValidationSet`) plays each prompt as one
        whole greedy episode against the run's environment and tools (``val/episode_reward``, ``val/turns``). With
        ``val_task``: greedy answers of 8 tokens scored by the task's reward (``val/reward``).

        Args:
            batch: ``ValidationItem`` s, or ``{"prompt": str, "metadata": dict}`` items for ``val_task``.
            batch_idx: Index of the batch.
        """
        validation_set = getattr(getattr(self.trainer, "datamodule", None), "validation_set", None)
        if validation_set is not None and batch and not isinstance(batch[0], dict):
            self._val_results.append(validation_set.generate_and_score(self.policy_model, list(batch), self.device))
            return None
        from transformers import AutoTokenizer

        from lightning_hybrid_rollout.tasks import get_task

        if getattr(self, "_val_tokenizer", None) is None:
            self._val_tokenizer = AutoTokenizer.from_pretrained(self.hparams.model_path)
        tok = self._val_tokenizer
        model = self.policy_model
        rewards = []
        for item in batch:
            ids = torch.tensor([tok.encode(item["prompt"])], device=self.device)
            out = model.generate(
                ids, max_new_tokens=8, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
            )
            text = tok.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=False)
            rewards.append(get_task(item["metadata"]["task"]).reward(text, item["metadata"]))
        reward = torch.tensor(sum(rewards) / max(1, len(rewards)), device=self.device)
        self.log("val/reward", reward, batch_size=len(rewards), prog_bar=True)
        return reward

    @override
    def on_validation_epoch_start(self) -> None:
        self._val_results: list[Any] = []

    @override
    def on_validation_epoch_end(self) -> None:
        results = getattr(self, "_val_results", [])
        if not results:
            return
        result_type = type(results[0])  # ValidationResult, or EpisodeValidationResult for an agentic run
        total = result_type.combine(results, n=results[0].n)
        if torch.distributed.is_available() and torch.distributed.is_initialized():  # each rank saw other batches
            parts: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(parts, total)
            total = result_type.combine(parts, n=total.n)
        self.log_dict(total.metrics(), rank_zero_only=True, prog_bar=False)
        self._val_results = []

    @override
    def configure_model(self) -> None:
        if self.model is None:
            self.model = self._load_model()
        if self.lora_config is not None and not is_lora_model(self.model):
            self.model = inject_lora(self.model, self.lora_config)
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            rank_zero_info(f"GRPOModule: LoRA r={self.lora_config.r}, {trainable} trainable parameters")

    def _load_model(self) -> nn.Module:
        import transformers
        from packaging.version import Version
        from transformers import AutoModelForCausalLM

        if self.hparams.model_path is None:
            raise ValueError(
                "GRPOModule has no model: pass model_path= or model=, or train it with a HybridRolloutCallback "
                "(the module then takes rollout.model_path)"
            )
        key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        model = AutoModelForCausalLM.from_pretrained(self.hparams.model_path, **{key: torch.float32})
        model.train()  # from_pretrained returns it in eval mode (Lightning would warn at the fit's start)
        rank_zero_info(f"GRPOModule: loaded {type(model).__name__} from {self.hparams.model_path}")
        return model

    # ------------------------------------------------------------------ LoRA: checkpoints and export
    @override
    def setup(self, stage: str) -> None:
        if self.lora_config is not None and hasattr(self.trainer.strategy, "exclude_frozen_parameters"):
            self.trainer.strategy.exclude_frozen_parameters = True  # DeepSpeed saves its engine's own state dict

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.lora_config is None or "state_dict" not in checkpoint:
            return
        trainable = {name for name, p in self.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.lora_config is None or "state_dict" not in checkpoint:
            return
        missing = [n for n, p in self.named_parameters() if p.requires_grad and n not in checkpoint["state_dict"]]
        if missing:
            raise ValueError(
                f"the checkpoint lacks {len(missing)} of the adapter's tensors (e.g. {missing[0]}): it was saved "
                "with another peft config (or none); resume with the peft config it was trained with"
            )

    def export_adapter(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write the LoRA adapter as a PEFT adapter directory (``PeftModel.from_pretrained(base, out_dir)``)."""
        from lightning_hybrid_rollout.training.lora import save_adapter

        if self.lora_config is None:
            raise ValueError("export_adapter needs a LoRA module (GRPOModule(peft={...})); use export_merged")
        return save_adapter(self.policy_model, self.lora_config, out_dir)

    def export_merged(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write the policy (LoRA merged in) as a plain Hugging Face model directory, with the tokenizer of
        ``model_path`` when there is one."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lightning_hybrid_rollout.training.lora import merged_state_dict

        out = Path(out_dir)
        policy = self.policy_model
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(policy.config)
        plain.load_state_dict(merged_state_dict(policy), assign=True, strict=True)
        plain.save_pretrained(str(out))
        if self.hparams.model_path:
            AutoTokenizer.from_pretrained(self.hparams.model_path).save_pretrained(str(out))
        return out

    @override
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, logits_to_keep: int = 0) -> Tensor:
        """Logits ``[B, T, V]`` of the policy model (``[B, logits_to_keep, V]``, the last positions, if > 0 and the
        model takes Hugging Face's ``logits_to_keep``; a model that does not gets all ``T``)."""
        model = self.policy_model
        if logits_to_keep > 0 and _takes_logits_to_keep(model):
            out = model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=logits_to_keep
            )
            return out.logits
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def token_logprobs(self, batch: RolloutBatch) -> Tensor:
        """Log-probs of ``input_ids[:, 1:]`` under the current model, ``[B, T - 1]`` (float32).

        Args:
            batch: The batch (on this module's device).

        Returns:
            ``logp[:, t]`` = log p(input_ids[:, t + 1] | input_ids[:, : t + 1]).

        Example::

            logp = self.token_logprobs(batch)  # align with batch.response_mask[:, 1:]

        With ``shared_prompt_forward`` on (by default for a model on the CPU) the rows that share a prompt share its
        forward (:func:`~.shared_prompt.shared_prompt_logprobs`); the result is the same up to float rounding.
        """
        if self._shared_prompt_ok is not False and self._shared_prompt_wanted(batch):
            buckets = prompt_buckets(batch)
            if shares_prompts(buckets):
                if self._shared_prompt_ok is None:
                    self._shared_prompt_ok = self._check_shared_prompt(batch, buckets)
                if self._shared_prompt_ok:
                    return shared_prompt_logprobs(
                        self.policy_model, batch, self.hparams.temperature, buckets, chunked=self._chunked_head(batch)
                    )
        return self._full_token_logprobs(batch, chunked=self._chunked_head(batch))

    def _full_token_logprobs(self, batch: RolloutBatch, chunked: bool = False) -> Tensor:
        """:meth:`token_logprobs` with every row's whole sequence through the model (the plain forward); with
        ``chunked``, the head scores the targets chunk by chunk (:func:`~.chunked_head.scored_head`)."""
        # Only the positions from the first response token on are scored: the prompt's logits (most of a short
        # answer's sequence, and a vocabulary-wide softmax each) are never computed. Columns before it are 0.
        width = batch.input_ids.shape[1]
        scored = batch.response_mask[:, 1:].sum(dim=0).nonzero()
        first = int(scored[0]) if len(scored) else width - 1
        targets = batch.input_ids[:, first + 1 :]
        if chunked:
            with scored_head(self.policy_model, targets, self.hparams.temperature):
                logp = self(batch.input_ids, batch.attention_mask, logits_to_keep=width - first)
        else:
            logits = self(batch.input_ids, batch.attention_mask, logits_to_keep=width - first)[:, -(width - first) : -1]
            logp = target_logprobs(logits, targets, self.hparams.temperature)
        return torch.nn.functional.pad(logp, (first, 0))

    def _chunked_head(self, batch: RolloutBatch) -> bool:
        """Whether the head scores in chunks: checked once, on the first batch's first rows, against the plain
        logits (a model whose head output is post-processed, e.g. soft-capped, falls back with one warning)."""
        if self._chunked_head_ok is None:
            model = self.policy_model
            if not (has_output_head(model) and _takes_logits_to_keep(model)):
                self._chunked_head_ok = False
            else:
                probe = batch.select(slice(0, min(2, len(batch))))
                with torch.no_grad():
                    plain = self._full_token_logprobs(probe)
                    chunked = self._full_token_logprobs(probe, chunked=True)
                self._chunked_head_ok = bool(torch.allclose(plain, chunked, rtol=1e-4, atol=1e-4))
                if not self._chunked_head_ok:
                    rank_zero_warn(
                        "GRPOModule: the chunked log-probs disagree with the model's logits (a head whose output is "
                        "post-processed?): scoring the full logits instead, which holds them for a whole micro-batch"
                    )
        return self._chunked_head_ok

    def _shared_prompt_wanted(self, batch: RolloutBatch) -> bool:
        """``shared_prompt_forward``, its default (``None``) read as: on for a batch on the CPU, off on a GPU."""
        wanted = self.hparams.get("shared_prompt_forward")
        return batch.input_ids.device.type == "cpu" if wanted is None else bool(wanted)

    def _check_shared_prompt(self, batch: RolloutBatch, buckets: list[PromptBucket]) -> bool:
        """Whether the shared-prompt forward may serve this fit: single process, and on ``batch`` it gives the
        plain forward's log-probs (within float rounding). Warns once when it may not."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            rank_zero_info("GRPOModule: shared_prompt_forward is off under several ranks (plain forward)")
            return False
        with torch.no_grad():
            plain = self._full_token_logprobs(batch)
        why = check_shared_prompt(self.policy_model, batch, buckets, plain, self.hparams.temperature)
        if why is not None:
            rank_zero_warn(
                f"GRPOModule: shared_prompt_forward is off: {why} (set shared_prompt_forward=False to skip this check)"
            )
        return why is None

    def loss_mask(self, batch: RolloutBatch) -> Tensor:
        """``[B, T - 1]`` weights of the tokens the loss trains (response tokens; filtered groups and, with
        ``mask_truncated``, truncated responses zeroed)."""
        mask = batch.response_mask[:, 1:]
        if self.hparams.filter_groups:
            mask = mask * (batch.group_reward_std > 0).to(mask.dtype).unsqueeze(-1)
        if self.hparams.get("mask_truncated", False):
            mask = mask * (1.0 - batch.truncated.to(mask.dtype)).unsqueeze(-1)
        return mask

    # ------------------------------------------------------------------- loss
    def compute_loss(
        self,
        batch: RolloutBatch,
        old_logprobs: Tensor | None = None,
        token_count: Tensor | float | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The GRPO loss of one (micro-)batch and detached token sums for the metrics.

        Args:
            batch: The (micro-)batch, on this module's device.
            old_logprobs: ``[B, T - 1]`` recomputed old log-probs (only with ``use_rollout_log_probs=False``
                and several PPO epochs); by default the rollout's, or the current ones detached.
            token_count: Token-mean denominator (the full batch's count when accumulating micro-batches).

        Returns:
            ``(loss, sums)``; ``sums`` has ``tokens``, ``clipped``, ``kl``, ``neg_logp``, ``mismatch_kl`` (sums
            over tokens) and, with an ``off_policy_correction``, those of
            :func:`~.off_policy.importance_weight_sums`.

        Example::

            loss, sums = module.compute_loss(batch.to(module.device))
        """
        hp = self.hparams
        logp = self.token_logprobs(batch)
        mask = self.loss_mask(batch)
        rollout_lp = batch.rollout_logprobs[:, 1:]
        # the trainer's policy before this update: recomputed, or the current one on the first epoch
        trainer_old = logp.detach() if old_logprobs is None else old_logprobs
        old = rollout_lp if hp.use_rollout_log_probs else trainer_old
        correction_sums: dict[str, Tensor] = {}
        is_weights = None
        if self.off_policy_correction is not None:
            iw = importance_weights(trainer_old, rollout_lp, mask, self.off_policy_correction)
            is_weights = iw.weights
            correction_sums = importance_weight_sums(iw, mask)
        tokens = mask.sum()
        denom = tokens if token_count is None else token_count
        pg_loss, clip_fraction = ppo_clip_loss(
            logp, old, batch.advantages, mask, hp.clip_eps, hp.clip_eps_high, is_weights, token_count=denom
        )
        kl_tok = kl_k3(logp, rollout_lp) * mask
        loss = pg_loss
        if hp.kl_coef:
            loss = loss + hp.kl_coef * kl_tok.sum() / torch.as_tensor(denom, device=mask.device).clamp_min(1.0)
        sums = {
            "tokens": tokens.detach(),
            "clipped": (clip_fraction * tokens).detach(),
            "kl": kl_tok.sum().detach(),
            "neg_logp": (-(logp.detach()) * mask).sum(),
            "mismatch_kl": (kl_k3(rollout_lp, trainer_old) * mask).sum(),
            **correction_sums,
        }
        return loss, sums

    # ------------------------------------------------------------------- step
    def fit_sequence_length(self, tokens: int) -> None:
        """The run's longest sequence (prompt + response, or a whole episode): the default token budget covers it,
        and an explicit ``max_tokens_per_forward`` below it is refused before the run starts (the callback calls this
        in its ``setup``).

        Raises:
            ConfigError: ``max_tokens_per_forward`` is set below ``tokens``.
        """
        budget = self.hparams.get("max_tokens_per_forward")
        if budget is not None and budget < tokens:
            raise ConfigError(
                f"model.max_tokens_per_forward ({budget}) is below the run's longest sequence ({tokens} tokens, the "
                f"engines' max_model_len): raise model.max_tokens_per_forward to at least {tokens}, or leave it out "
                "(derived from the model)"
            )
        self._longest_sequence = int(tokens)

    @property
    def tokens_per_forward(self) -> int:
        """The token budget of one forward: ``max_tokens_per_forward``, or the model's default (at least the run's
        longest sequence)."""
        if self._tokens_per_forward is None:
            budget = self.hparams.get("max_tokens_per_forward")
            if budget is None:
                config = getattr(self.policy_model, "config", None)
                budget = max(default_tokens_per_forward(config), self._longest_sequence)
                rank_zero_info(f"GRPOModule: max_tokens_per_forward={budget} (derived from the model)")
            self._tokens_per_forward = int(budget)
        return self._tokens_per_forward

    def micro_batches(self, batch: RolloutBatch) -> list[tuple[RolloutBatch, bool]]:
        """``batch`` cut by ``tokens_per_forward`` (and ``micro_batch_size`` rows), as many on every rank: each
        micro-batch and whether it counts (False: a rank with fewer rows repeats one at zero weight)."""
        lengths = batch.attention_mask.sum(dim=1).tolist()
        plan = plan_micro_batches(lengths, self.tokens_per_forward, self.hparams.micro_batch_size)
        parts = even_out(plan, same_count_on_every_rank(len(plan), batch.input_ids.device))
        return (
            [(batch, True)]
            if parts == [slice(0, len(batch))]
            else [
                (batch.select(part), True) if part is not None else (batch.select(slice(0, 1)), False) for part in parts
            ]
        )

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        # Lightning zeroes the gradients after training_step, before its backward; a step that backwards its
        # micro-batches itself needs them zeroed before (optimizer_zero_grad below does nothing)
        if self.automatic_optimization and batch_idx % self.trainer.accumulate_grad_batches == 0:
            for optimizer in self.trainer.optimizers:
                optimizer.zero_grad(set_to_none=True)
        return None

    @override
    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        if not self.automatic_optimization:
            optimizer.zero_grad()

    @override
    def training_step(self, dataloader_iter: Iterator[Any]) -> Tensor | None:
        """Take one batch from ``dataloader_iter`` (after ``on_train_batch_start``), update, log ``train/*``.

        The batch runs as micro-batches of at most ``max_tokens_per_forward`` tokens, their gradients summed (in
        automatic optimisation every micro-batch but the last is backwarded here, the last by Lightning).
        """
        batch = next_rollout_batch(dataloader_iter).to(self.device)
        if not self.automatic_optimization:
            self._manual_update(batch)
            return None
        micro = self.micro_batches(batch)
        if len(micro) == 1:
            loss, sums = self.compute_loss(batch)
            self._log_metrics(batch, loss.detach(), sums)
            return loss
        token_count = self.loss_mask(batch).sum()
        totals: dict[str, Tensor] = {}
        loss_sum = torch.zeros((), device=self.device)
        pending: Tensor | None = None
        for mb, counts in micro:
            if pending is not None:  # the previous micro-batch's graph is freed before this one is built
                self.trainer.strategy.backward(pending, None)
            loss, sums = self.compute_loss(mb, token_count=token_count)
            if counts:
                loss_sum = loss_sum + loss.detach()
                _add_sums(totals, sums, first_epoch=True)
            pending = loss if counts else loss * 0.0
        self._log_metrics(batch, loss_sum, totals)
        return pending

    def _manual_update(self, batch: RolloutBatch) -> None:
        hp = self.hparams
        opt = self.optimizers()
        micro = self.micro_batches(batch)
        token_count = self.loss_mask(batch).sum()
        old: list[Tensor | None] = [None] * len(micro)
        if not hp.use_rollout_log_probs and hp.ppo_epochs > 1:
            with torch.no_grad():
                old = [self.token_logprobs(mb) for mb, _ in micro]
        totals: dict[str, Tensor] = {}
        loss_sum = torch.zeros((), device=self.device)
        for epoch in range(hp.ppo_epochs):
            opt.zero_grad()
            for (mb, counts), old_mb in zip(micro, old):
                loss, sums = self.compute_loss(mb, old_logprobs=old_mb, token_count=token_count)
                if not counts:
                    self.manual_backward(loss * 0.0)
                    continue
                self.manual_backward(loss)
                loss_sum = loss_sum + loss.detach()
                _add_sums(totals, sums, first_epoch=epoch == 0)
            if hp.grad_clip:
                self.clip_gradients(opt, gradient_clip_val=hp.grad_clip, gradient_clip_algorithm="norm")
            opt.step()
        # token stats are summed over epochs: divide by the tokens summed the same way (the pre-update ones, summed
        # over the first epoch only, by a ppo_epochs-th of them)
        self._log_metrics(batch, loss_sum / hp.ppo_epochs, totals, pre_update_tokens=token_count)

    def _log_metrics(
        self, batch: RolloutBatch, loss: Tensor, sums: dict[str, Tensor], pre_update_tokens: Tensor | None = None
    ) -> None:
        tokens = sums["tokens"].clamp_min(1.0)
        first = tokens if pre_update_tokens is None else pre_update_tokens.clamp_min(1.0)
        staleness = (self.param_version - batch.weight_version_min).float()
        metrics = {
            "train/loss": loss,
            "train/reward_mean": batch.rewards.mean(),
            "train/clip_fraction": sums["clipped"] / tokens,
            "train/kl": sums["kl"] / tokens,
            "train/mismatch_kl": sums["mismatch_kl"] / first,
            "train/entropy": sums["neg_logp"] / tokens,
            "train/staleness_mean": staleness.mean(),
            "train/staleness_max": staleness.max(),
            "train/response_length_mean": batch.response_lengths.float().mean(),
            "train/truncated_fraction": batch.truncated.mean(),
        }
        if self.hparams.filter_groups:
            metrics["train/kept_fraction"] = (batch.group_reward_std > 0).float().mean()
        if "is_weight" in sums:
            metrics["train/is_weight_mean"] = sums["is_weight"] / first
            metrics["train/is_weight_max"] = sums["is_weight_max"]
            metrics["train/is_masked_fraction"] = sums["is_masked"] / first
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=len(batch))

    # -------------------------------------------------------------- optimizer
    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=hp.lr, betas=tuple(hp.betas), weight_decay=hp.weight_decay)

    @override
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        if gradient_clip_val is None and self.hparams.grad_clip:
            gradient_clip_val, gradient_clip_algorithm = self.hparams.grad_clip, "norm"
        self.clip_gradients(
            optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm
        )
