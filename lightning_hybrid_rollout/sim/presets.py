"""Named scenarios (``lhr simulate --preset NAME``). See docs/simulator.md for where each number comes from.

Each is the plain data of a scenario YAML file: the workload in the scenario's ``async_training`` section and each run's
policy and options in its own (the keys of :class:`~lightning_hybrid_rollout.config.AsyncTrainingConfig`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from lightning_hybrid_rollout.schedule import policy_starting_ratio
from lightning_hybrid_rollout.sim.renames import PRESET_RENAMES, resolve
from lightning_hybrid_rollout.sim.scenario import Scenario

__all__ = ["PRESETS", "get_preset", "preset_names"]


def _verl_32_devices() -> dict:
    return {
        "name": "verl_32_devices",
        "description": "verl's 32-device experiment: static 16+16 and 8+24 vs dynamic 16+16 with hybrid replicas "
        "(scheduling.md §5)",
        "steps": 40,
        "async_training": {"mini_batch_size": 128, "trigger_parameter_sync_step": 4, "staleness_threshold": 0.5},
        "concurrent_samples_per_replica": 16,
        "seed": 0,
        "lengths": {
            "mean_tokens": 8000,
            "sigma": 0.6,
            "max_tokens": 20480,
            "drift_per_step": 0.0065,
            "prompt_tokens": 512,
        },
        "replica": {"devices": 4, "tokens_per_s": 40.0, "batch_slowdown": 0.03, "kv_cache_tokens": 120000},
        "hybrid_replica": {"devices": 4, "tokens_per_s": 40.0, "batch_slowdown": 0.03, "kv_cache_tokens": 56000},
        "trainer": {"device_s_per_token": 0.0042},
        "switch": {
            "standalone_sync_s": 20.0,
            "standalone_commit_s": 5.0,
            "hybrid_sync_s": 10.0,
            "wake_s": 12.0,
            "sleep_s": 10.0,
        },
        "runs": [
            {"name": "static_16_16", "train_devices": 16, "rollout_devices": 16},
            {"name": "static_8_24", "train_devices": 8, "rollout_devices": 24},
            _dynamic("dynamic_default", 16, 16, "default", dynamic_schedule_deactivate_ratio=0.3),
            _dynamic("dynamic_rate_matched", 16, 16, "rate_matched"),
            _dynamic("dynamic_rate_matched_overlap", 16, 16, "rate_matched", overlap_sync=True),
            _dynamic("dynamic_default_overlap", 16, 16, "default", overlap_sync=True),
            *_improved_runs(16, 16),
            _verl_v1(16, 16),
        ],
    }


def _dynamic(name: str, train: int, rollout: int, policy: str, **async_training: object) -> dict:
    """A run with hybrid replicas: ``policy`` and the run's other ``async_training`` changes."""
    return {
        "name": name,
        "train_devices": train,
        "rollout_devices": rollout,
        "hybrid": True,
        "async_training": {"dynamic_schedule_policy": policy, **async_training},
    }


def _verl_v1(train: int, rollout: int) -> dict:
    """verl v1 ``separate_async``'s switch rule (``hysteresis_ratio``) from its own starting ratio (verl's 0.4,
    :func:`~lightning_hybrid_rollout.schedule.policy_starting_ratio`): a baseline."""
    start = policy_starting_ratio("hysteresis_ratio")
    return _dynamic(
        "dynamic_hysteresis_ratio", train, rollout, "hysteresis_ratio", dynamic_schedule_deactivate_ratio=start
    )


def _improved_runs(train: int, rollout: int) -> list[dict]:
    """``rate_matched`` + ``overlap_sync`` + rebalance off + the runtime options (docs/simulator.md)."""
    base = {"overlap_sync": True, "dynamic_schedule_enable_rebalance": False, "early_first_sync": True}
    return [
        _dynamic("dynamic_rate_matched_overlap_early", train, rollout, "rate_matched", **base),
        _dynamic(
            "dynamic_rate_matched_overlap_early_staged",
            train,
            rollout,
            "rate_matched",
            **base,
            staged_standalone_sync=True,
        ),
        _dynamic(
            "dynamic_rate_matched_overlap_early_keep",
            train,
            rollout,
            "rate_matched",
            **base,
            standalone_sync_mode="keep",
        ),
        # both sync options at once (the runtime's standalone push takes ``staged`` and ``keep`` together): the
        # replicas pause only for the commit, and the commit freezes their requests instead of aborting them
        _dynamic(
            "dynamic_rate_matched_overlap_early_staged_keep",
            train,
            rollout,
            "rate_matched",
            **base,
            staged_standalone_sync=True,
            standalone_sync_mode="keep",
        ),
    ]


def _dynamic_runs(train: int, rollout: int) -> list[dict]:
    return [
        _dynamic("dynamic_default", train, rollout, "default", dynamic_schedule_deactivate_ratio=0.3),
        _dynamic("dynamic_rate_matched", train, rollout, "rate_matched"),
        _dynamic("dynamic_rate_matched_overlap", train, rollout, "rate_matched", overlap_sync=True),
        *_improved_runs(train, rollout),
        _verl_v1(train, rollout),
    ]


def _drifting() -> dict:
    sc = _verl_32_devices()
    sc.update(
        name="drifting",
        description="the common RL length curve on a rollout-heavy split (24 trainer + 8 rollout devices): long "
        "rambling responses first, concise ones mid-run (4x shorter), then growing again as reasoning deepens; "
        "short responses batch well, long ones are KV-cache bound, so the need for hybrid help moves a lot",
        concurrent_samples_per_replica=32,
        lengths={
            "mean_tokens": 6000,
            "sigma": 0.6,
            "max_tokens": 20480,
            "prompt_tokens": 512,
            "mean_schedule": [[0, 1.5], [20, 0.4], [40, 1.0]],
        },
        replica={"devices": 4, "tokens_per_s": 40.0, "batch_slowdown": 0.03, "kv_cache_tokens": 80000},
        hybrid_replica={"devices": 4, "tokens_per_s": 40.0, "batch_slowdown": 0.03, "kv_cache_tokens": 40000},
        runs=[{"name": "static_24_8", "train_devices": 24, "rollout_devices": 8}, *_dynamic_runs(24, 8)],
    )
    return sc


def _rollout_bound() -> dict:
    sc = _verl_32_devices()
    sc.update(
        name="rollout_bound",
        description="24 trainer devices + 8 rollout devices: standalone replicas alone produce a third of what the "
        "trainer consumes, so hybrid replicas must generate in every cycle",
        runs=[{"name": "static_24_8", "train_devices": 24, "rollout_devices": 8}, *_dynamic_runs(24, 8)],
    )
    return sc


def _standalone_sufficient() -> dict:
    sc = _verl_32_devices()
    sc.update(
        name="standalone_sufficient",
        description="8 trainer devices + 24 rollout devices on verl's example workload: standalone replicas outproduce "
        "the trainer, hybrid help is never worth a switch (design/scheduling.md step 3)",
        runs=[{"name": "static_8_24", "train_devices": 8, "rollout_devices": 24}, *_dynamic_runs(8, 24)],
    )
    return sc


def _agentic() -> dict:
    sc = _verl_32_devices()
    sc.update(
        name="agentic",
        description="verl's example cluster and split on multi-turn agentic episodes: 2-6 model turns each (per-turn "
        "lengths long-tailed, mean 1,600 tokens), a tool call of 1-3 s (log-normal, median 1.7 s) between turns "
        "whose 300-token result is trained over; an episode holds no decode capacity while its tool runs",
        lengths={"mean_tokens": 1600, "sigma": 0.9, "max_tokens": 8192, "drift_per_step": 0.0065, "prompt_tokens": 512},
        agentic={
            "min_turns": 2,
            "max_turns": 6,
            "tool_latency_median_s": 1.7,
            "tool_latency_sigma": 0.3,
            "tool_latency_max_s": 30.0,
            "tool_output_tokens": 300,
        },
        runs=[
            {"name": "static_16_16", "train_devices": 16, "rollout_devices": 16},
            {"name": "static_8_24", "train_devices": 8, "rollout_devices": 24},
            *_dynamic_runs(16, 16),
            _dynamic("dynamic_fixed_ratio", 16, 16, "fixed_ratio"),
            _dynamic("dynamic_static_fully_async", 16, 16, "static_fully_async"),
        ],
    )
    return sc


PRESETS: dict[str, Callable[[], dict]] = {
    "verl_32_devices": _verl_32_devices,
    "rollout_bound": _rollout_bound,
    "drifting": _drifting,
    "standalone_sufficient": _standalone_sufficient,
    "agentic": _agentic,
}


def preset_names() -> list[str]:
    """The preset names."""
    return sorted(PRESETS)


def get_preset(name: str) -> Scenario:
    """A fresh :class:`Scenario` for preset ``name`` (an old name of
    :data:`~lightning_hybrid_rollout.sim.renames.PRESET_RENAMES`: its new one, with a :class:`DeprecationWarning`)."""
    try:
        factory = PRESETS[resolve("preset", name, PRESET_RENAMES)]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}") from None
    return Scenario.from_dict(copy.deepcopy(factory()))
