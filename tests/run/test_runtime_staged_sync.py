"""``async_training.staged_standalone_sync``: the runtime's standalone sync asks for a staged push and counts the
replicas as syncing from its commit only (the real staged push is tested in tests/rollout/test_weight_sync.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_hybrid_rollout.config import AsyncTrainingConfig, ConfigError, RolloutConfig
from lightning_hybrid_rollout.rollout.weights import push
from lightning_hybrid_rollout.run.runtime import RolloutRuntime


class _Rollouter:
    is_running = False

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def set_syncing_async(self, ids: list[str], syncing: bool) -> None:
        self.log.append(f"syncing={syncing}")


def _runtime(tmp_path: Path, staged: bool, log: list[str]) -> RolloutRuntime:
    a = AsyncTrainingConfig(mini_batch_size=8, staged_standalone_sync=staged)
    rt = RolloutRuntime(
        RolloutConfig(model_path="unused", hybrid_replicas=0, weight_encoding="full"),
        a,
        workload=None,
        run_dir=tmp_path,
        trace=False,
    )
    rt.standalone = [SimpleNamespace(replica_id="s0", role="standalone")]
    rt.rollouter = _Rollouter(log)  # type: ignore[assignment]
    return rt


@pytest.fixture
def fake_push(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    log: list[str] = []

    async def push_weights_async(named: Any, replicas: Any, version: int, **kwargs: Any) -> Any:
        log.append(f"push:start staged={kwargs.get('staged', False)}")
        await asyncio.sleep(0.01)  # the stage: replicas still serving
        if kwargs.get("on_commit") is not None:
            log.append("commit")
            await kwargs["on_commit"]()
        await asyncio.sleep(0.01)
        log.append("push:end")
        return SimpleNamespace(version=version, bytes=0)

    monkeypatch.setattr(push, "push_weights_async", push_weights_async)
    return log


@pytest.mark.parametrize("staged", [False, True])
def test_standalone_replicas_count_as_syncing_only_from_the_commit_when_staged(
    tmp_path: Path, fake_push: list[str], staged: bool
) -> None:
    rt = _runtime(tmp_path, staged, fake_push)
    try:
        rt.push_standalone([("w", object())], version=1)
    finally:
        rt.stop()
    if staged:
        assert fake_push == ["push:start staged=True", "commit", "syncing=True", "push:end", "syncing=False"]
    else:
        assert fake_push == ["syncing=True", "push:start staged=False", "push:end", "syncing=False"]


def test_staged_standalone_sync_defaults_off_and_is_checked() -> None:
    assert AsyncTrainingConfig().staged_standalone_sync is False
    with pytest.raises(ConfigError, match="staged_standalone_sync"):
        AsyncTrainingConfig(staged_standalone_sync="yes")  # type: ignore[arg-type]
