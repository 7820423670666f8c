"""Shared fixtures of the simulator tests: small scenarios that simulate in milliseconds."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_hybrid_rollout.schedule import DefaultDynamicSchedulePolicy, DynamicScheduleContext, base
from lightning_hybrid_rollout.sim import Scenario


class LendOne(DefaultDynamicSchedulePolicy):
    """The default policy lending one hybrid replica per activation (k of n = 1)."""

    def activate_replica_count(self, global_steps: int, ctx: DynamicScheduleContext, num_hybrid_replicas: int) -> int:
        return 1


@pytest.fixture
def lend_one(monkeypatch: pytest.MonkeyPatch) -> str:
    """:class:`LendOne` registered for the test as ``test_lend_one``; returns its name."""
    monkeypatch.setattr(base, "_REGISTRY", {**base._REGISTRY, "test_lend_one": LendOne})
    return "test_lend_one"


def dynamic_run(name: str, policy: str, train: int = 2, rollout: int = 2, **async_training: Any) -> dict[str, Any]:
    """A run with hybrid replicas: its policy and its other ``async_training`` changes (the config's keys)."""
    return {
        "name": name,
        "train_devices": train,
        "rollout_devices": rollout,
        "hybrid": True,
        "async_training": {"dynamic_schedule_policy": policy, **async_training},
    }


def tiny_scenario(**overrides: Any) -> Scenario:
    """A 2+2-device scenario with short responses: four runs, a few cycles, well under a second."""
    data: dict[str, Any] = {
        "name": "tiny",
        "steps": 6,
        "async_training": {"mini_batch_size": 8, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.5},
        "concurrent_samples_per_replica": 4,
        "lengths": {"mean_tokens": 200, "sigma": 0.5, "max_tokens": 2000, "prompt_tokens": 20},
        "replica": {"devices": 1, "tokens_per_s": 40.0, "batch_slowdown": 0.05},
        "trainer": {"device_s_per_token": 0.004},
        "switch": {"standalone_sync_s": 1.0, "hybrid_sync_s": 0.5, "wake_s": 0.5, "sleep_s": 0.5},
        "runs": [
            {"name": "static_2_2", "train_devices": 2, "rollout_devices": 2},
            dynamic_run("dynamic_default", "default"),
            dynamic_run("dynamic_rate_matched", "rate_matched"),
            dynamic_run("dynamic_rate_matched_overlap", "rate_matched", overlap_sync=True),
        ],
    }
    data.update(overrides)
    return Scenario.from_dict(data)


@pytest.fixture
def tiny() -> Scenario:
    """See :func:`tiny_scenario`."""
    return tiny_scenario()
