"""``dynamic_resource/weight_sync_bytes``: the payload bytes of every weight push of a cycle, logged once per cycle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.cycle_report import WEIGHT_SYNC_BYTES
from lightning_hybrid_rollout.run.runtime import RolloutRuntime
from tests.lightning._cycle_report_harness import cycle_report, recording_trainer


class _Router:
    """The runtime's weight push, answering each push with a report of ``nbytes`` bytes."""

    def __init__(self, nbytes: list[int]) -> None:
        self.nbytes = nbytes

    async def push(self, weights: Any, replicas: Any, version: int, **options: Any) -> Any:
        return SimpleNamespace(bytes=self.nbytes.pop(0))


def test_each_cycle_logs_the_bytes_of_the_pushes_it_made(tmp_path: Path) -> None:
    runtime = RolloutRuntime(RolloutConfig(model_path="m"), AsyncTrainingConfig(), None, tmp_path, trace=False)
    runtime.weights = _Router([1000, 24, 7])
    runtime.trace_cycle = lambda cycle, t, values: None  # type: ignore[method-assign]
    runtime.prefix_cache_hit_rate = lambda: 0.0  # type: ignore[method-assign]
    runtime.replica_restarts = lambda: 0  # type: ignore[method-assign]
    replica = SimpleNamespace(replica_id="r0", is_alive=True)
    logged: list[dict[str, float]] = []
    trainer = recording_trainer(logged)
    report = cycle_report(runtime)
    push = runtime.push_async
    asyncio.run(push([("w", 0)], [replica], 1))  # cycle 1: a standalone and a hybrid push
    asyncio.run(push([("w", 0)], [replica], 1))
    report.emit(trainer, None, 1, 0, 0)  # type: ignore[arg-type]
    report.emit(trainer, None, 2, 0, 0)  # type: ignore[arg-type]  # cycle 2: no push
    asyncio.run(push([("w", 0)], [replica], 2))
    asyncio.run(push([], [replica], 3))  # nothing to push: no bytes
    report.emit(trainer, None, 3, 0, 0)  # type: ignore[arg-type]
    assert [v[WEIGHT_SYNC_BYTES] for v in logged] == [1024.0, 0.0, 7.0]
