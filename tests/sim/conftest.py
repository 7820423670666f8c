"""Shared fixtures of the simulator tests: small scenarios that simulate in milliseconds."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_hybrid_rollout.sim import Scenario


def tiny_scenario(**overrides: Any) -> Scenario:
    """A 2+2-device scenario with short responses: four runs, a few cycles, well under a second."""
    data: dict[str, Any] = {
        "name": "tiny",
        "steps": 6,
        "required_samples": 8,
        "trigger_parameter_sync_step": 2,
        "staleness_threshold": 0.5,
        "concurrent_samples_per_replica": 4,
        "lengths": {"mean_tokens": 200, "sigma": 0.5, "max_tokens": 2000, "prompt_tokens": 20},
        "replica": {"devices": 1, "tokens_per_s": 40.0, "batch_slowdown": 0.05},
        "trainer": {"device_s_per_token": 0.004},
        "switch": {"standalone_sync_s": 1.0, "hybrid_sync_s": 0.5, "wake_s": 0.5, "sleep_s": 0.5},
        "runs": [
            {"name": "static_2_2", "train_devices": 2, "rollout_devices": 2},
            {"name": "dynamic_default", "train_devices": 2, "rollout_devices": 2, "hybrid": True, "policy": "default"},
            {
                "name": "dynamic_rate_matched",
                "train_devices": 2,
                "rollout_devices": 2,
                "hybrid": True,
                "policy": "rate_matched",
            },
            {
                "name": "dynamic_rate_matched_overlap",
                "train_devices": 2,
                "rollout_devices": 2,
                "hybrid": True,
                "policy": "rate_matched",
                "sequencing": "overlap_sync",
            },
        ],
    }
    data.update(overrides)
    return Scenario.from_dict(data)


@pytest.fixture
def tiny() -> Scenario:
    """See :func:`tiny_scenario`."""
    return tiny_scenario()
