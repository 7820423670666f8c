"""Shared pieces of the hybrid-strategy tests: a tiny Llama LightningModule, state snapshots, comparisons.

Imported by ``test_strategy.py`` (in process) and by ``_strategy_worker.py`` (the multi-process runs).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

VOCAB = 64
SEQ = 16


def tiny_llama(seed: int = 0, hidden: int = 64, layers: int = 2, vocab: int = VOCAB):
    """A random HF ``LlamaForCausalLM`` (hidden 64, 2 layers, vocab 64 by default); no hub access."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


class TokenDataset(Dataset):
    """Fixed random token sequences (deterministic for a given seed)."""

    def __init__(self, n: int = 32, seed: int = 123) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> Tensor:
        return self.ids[i]


def token_loader(n: int = 32, batch_size: int = 4) -> DataLoader:
    return DataLoader(TokenDataset(n), batch_size=batch_size, shuffle=False)


class TinyLMModule(pl.LightningModule):
    """Next-token LM loss on a tiny Llama exposed as ``policy_model``; AdamW (a real optimizer state)."""

    def __init__(self, seed: int = 0, hidden: int = 64, layers: int = 2, lr: float = 1e-2, vocab: int = VOCAB) -> None:
        super().__init__()
        self.policy_model = tiny_llama(seed, hidden, layers, vocab)
        self.lr = lr
        self.losses: list[float] = []

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        out = self.policy_model(input_ids=batch, labels=batch)
        self.losses.append(float(out.loss.detach()))
        return out.loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)


def _local(t: Tensor) -> Tensor:
    if hasattr(t, "ds_tensor"):  # DeepSpeed ZeRO-3 parameter: the local partition is the real storage
        t = t.ds_tensor
    to_local = getattr(t, "to_local", None)
    if callable(to_local):  # DTensor
        t = to_local()
    return t.detach()


def _inner_optimizers(strategy: Any) -> list[torch.optim.Optimizer]:
    out = []
    for opt in strategy.optimizers:
        opt = getattr(opt, "_optimizer", opt)
        opt = getattr(opt, "optimizer", opt)  # DeepSpeed ZeRO wrapper -> the client optimizer
        out.append(opt)
    return out


def training_state_tensors(strategy: Any) -> dict[str, Tensor]:
    """Every tensor of the training state, by a stable name, *without* copying (local shards for sharded ones)."""
    out: dict[str, Tensor] = {}
    module = strategy.lightning_module
    for name, p in module.named_parameters():
        out[f"param/{name}"] = _local(p)
        if p.grad is not None:
            out[f"grad/{name}"] = _local(p.grad)
    for name, grad, _ in getattr(strategy, "_hybrid_parked_grads", ()):  # offloaded: parked apart, .grad is None
        out[f"grad/{name}"] = _local(grad)
    for name, b in module.named_buffers():
        out[f"buffer/{name}"] = b.detach()
    for i, opt in enumerate(_inner_optimizers(strategy)):
        for j, state in enumerate(opt.state.values()):
            for key, value in state.items():
                if isinstance(value, Tensor) and "offload" not in key:  # DeepSpeed keeps its staging buffers here
                    out[f"opt{i}/{j}/{key}"] = _local(value)
    engine_optimizer = getattr(getattr(strategy, "model", None), "optimizer", None)
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):  # DeepSpeed fp32 masters
        for k, flat in enumerate(getattr(engine_optimizer, attr, None) or []):
            out[f"master/{attr}/{k}"] = flat.detach()
    return out


def snapshot(strategy: Any) -> dict[str, Tensor]:
    """Deep copies of :func:`training_state_tensors` (on CPU)."""
    return {k: v.clone().cpu() for k, v in training_state_tensors(strategy).items()}


def compare_snapshots(a: dict[str, Tensor], b: dict[str, Tensor]) -> list[str]:
    """Names whose tensors differ in presence, dtype, shape or any bit."""
    bad = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
            bad.append(k)
    return bad


def compare_state_dicts(got: dict[str, Tensor], want: dict[str, Tensor]) -> dict[str, Any]:
    """Names (in order) and values of two state dicts; the JSON-friendly verdict the tests assert on."""
    mismatched = [k for k in want if k in got and not torch.equal(got[k].cpu(), want[k].cpu())]
    return {
        "names_equal": list(got) == list(want),
        "missing": [k for k in want if k not in got][:5],
        "extra": [k for k in got if k not in want][:5],
        "mismatched": mismatched[:5],
        "equal": list(got) == list(want) and not mismatched,
    }


def gather_full(strategy: Any, bucket_bytes: int) -> tuple[dict[str, Tensor], int]:
    """All buckets of ``iter_full_weights`` merged into one dict, and the number of buckets."""
    full: dict[str, Tensor] = {}
    n = 0
    for bucket in strategy.iter_full_weights(bucket_bytes):
        n += 1
        for name, tensor in bucket:
            assert name not in full, f"duplicate name {name}"
            full[name] = tensor
    return full, n
