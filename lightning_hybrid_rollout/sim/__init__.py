"""Discrete-event simulator of fully-async RL with hybrid rollout replicas, on a virtual clock.

It runs the REAL :class:`~lightning_hybrid_rollout.schedule.DynamicResourceController` and policies against a
simulated replica pool, rollouter and trainer, so a policy or a device split can be evaluated at cluster scale on a
laptop. See ``docs/simulator.md`` for the model and the calibration, ``lhr simulate --help`` for the CLI.

Example::

    from lightning_hybrid_rollout.sim import get_preset, simulate

    result = simulate(get_preset("verl_32_devices"))
    best = min(result.runs, key=lambda r: r.time_s)
"""

from lightning_hybrid_rollout.schedule import rate_matched_policy as _rate_matched  # noqa: F401  (registers it)
from lightning_hybrid_rollout.sim.presets import PRESETS, get_preset, preset_names
from lightning_hybrid_rollout.sim.runner import (
    BREAKDOWN_KEYS,
    GAP_KEYS,
    RunResult,
    ScenarioResult,
    SimReplicaPool,
    balance_bound,
    run_once,
    simulate,
)
from lightning_hybrid_rollout.sim.scenario import (
    SEQUENCINGS,
    AgenticModel,
    LengthModel,
    LoraModel,
    ReplicaModel,
    RunSpec,
    Scenario,
    ScenarioError,
    SwitchCosts,
    TrainerModel,
)
from lightning_hybrid_rollout.sim.world import RolloutWorld, SimulationError

__all__ = [
    "BREAKDOWN_KEYS",
    "GAP_KEYS",
    "PRESETS",
    "SEQUENCINGS",
    "AgenticModel",
    "LengthModel",
    "LoraModel",
    "ReplicaModel",
    "RolloutWorld",
    "RunResult",
    "RunSpec",
    "Scenario",
    "ScenarioError",
    "ScenarioResult",
    "SimReplicaPool",
    "SimulationError",
    "SwitchCosts",
    "TrainerModel",
    "balance_bound",
    "get_preset",
    "preset_names",
    "run_once",
    "simulate",
]
