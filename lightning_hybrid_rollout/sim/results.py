"""What a simulated run produced: the trainer-timeline breakdown, the gap accounting and the result records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BREAKDOWN_HELP", "BREAKDOWN_KEYS", "GAP_HELP", "GAP_KEYS", "RunResult", "ScenarioResult"]

#: The trainer-timeline buckets of a run's time breakdown (they sum to ``time_s``).
BREAKDOWN_KEYS: tuple[str, ...] = (
    "training_compute",
    "startup_fill",
    "waiting_hybrid_generating",
    "waiting_idle",
    "waiting_staleness_bound",
    "hybrid_switching",
    "weight_sync_standalone",
    "weight_sync_hybrid",
)
#: Where a run's time beyond the balance term went (:meth:`RunResult.gap_s`, ``lhr simulate --gap``).
GAP_HELP: dict[str, str] = {
    "trainer_startup_fill": "trainer devices idle before the first batch (x rho)",
    "trainer_waiting_idle": "trainer devices idle waiting for samples, hybrid asleep (x rho)",
    "trainer_waiting_staleness_bound": "trainer devices idle while admission was blocked (x rho)",
    "trainer_hybrid_switching": "trainer devices switching: wake, sleep, add/remove/abort, rebalance (x rho)",
    "trainer_weight_sync_standalone": "trainer devices blocked by the standalone weight sync (x rho)",
    "trainer_weight_sync_hybrid": "trainer devices syncing hybrid weights (x rho)",
    "hybrid_below_own_peak": "hybrid replicas generating with fewer samples than their KV limit",
    "hybrid_ratio_below_rho_unavoidable": "samples whose own hybrid/standalone ratio is below rho (in the bound)",
    "hybrid_peak_below_rho": "hybrid replicas' peak below rho, beyond what the samples' own ratios explain",
    "standalone_paused_for_sync": "standalone replicas paused by their weight sync",
    "standalone_not_serving_other": "standalone replicas not serving for another reason",
    "standalone_below_peak": "standalone replicas with fewer samples than their limit (admission open)",
    "standalone_below_peak_admission_blocked": "standalone replicas under-filled while admission was blocked",
    "slowed_while_training": "replicas decoding below their best speed: slower while the trainer trains "
    "(replica.speed_while_training < 1), or outside its training spans (> 1)",
    "reprefill_after_standalone_sync_aborts": "re-prefill of samples aborted by the standalone weight sync",
    "reprefill_after_standalone_aborts": "re-prefill of samples aborted on standalone replicas (rebalance)",
    "reprefill_after_hybrid_aborts": "re-prefill of samples aborted on hybrid replicas (deactivation, rebalance)",
    "drain_queued_untrained": "samples still queued at the end (generated, never trained)",
    "drain_in_flight_untrained": "decoded part of samples still in flight at the end",
    "residual": "decoding at a version whose best rate differs from the one G credits",
}
GAP_KEYS: tuple[str, ...] = tuple(GAP_HELP)

BREAKDOWN_HELP: dict[str, str] = {
    "training_compute": "the trainer computing (the only bucket the balance bound also pays, with generation)",
    "startup_fill": "waiting for the very first batch (pipeline fill; hybrid replicas may help)",
    "waiting_hybrid_generating": "waiting for samples while hybrid replicas generate on the trainer's devices",
    "waiting_idle": "waiting for samples with the trainer's devices idle (hybrid asleep or absent)",
    "waiting_staleness_bound": "idle waiting while admission was blocked by the staleness budget / queue bound",
    "hybrid_switching": "hybrid wake-up, sleep, add/remove/resume/abort and rebalance",
    "weight_sync_standalone": "weight sync to standalone replicas (paused, their requests in flight aborted)",
    "weight_sync_hybrid": "weight sync to hybrid replicas (only when the policy activates them)",
}


@dataclass
class RunResult:
    """Everything one simulated run produced.

    Args:
        name, policy, train_devices, rollout_devices, hybrid: From the :class:`RunSpec` (policy None when static).
        time_s: Virtual seconds until the last step's weight sync finished.
        work_bound_s: This run's own balance bound: (its trained samples' generation + training device-seconds)
            / devices.
        breakdown_s: Trainer-timeline buckets (:data:`BREAKDOWN_KEYS`), summing to ``time_s``.
        resource_utilization: design/scheduling.md §4.3 over the whole run (same formula, run totals).
        steps: Per sync cycle: the ``dynamic_resource/*`` metrics plus ``sim/*`` extras.
        activations, deactivations: Completed hybrid switches.
        generated, consumed, queued, outstanding, admitted: Sample counts at the end.
        efficiency: ``balance_bound_s / time_s`` (filled in by :func:`simulate`).
        version_lag_mean, version_lag_max: Over the trained samples, the trainer's param version minus the oldest
            weight version the sample was generated under: the runtime's ``train/staleness_mean`` / ``_max``
            (``param_version - weight_version_min``), 0 for on-policy samples.
        trace_path: The run's trace file, if one was written.
        gap_s: Where the run's time beyond its balance term went (:data:`GAP_KEYS`, see :meth:`_Run._gap`);
            not part of the JSON output.
    """

    name: str
    policy: str | None
    train_devices: int
    rollout_devices: int
    hybrid: bool
    time_s: float
    work_bound_s: float
    breakdown_s: dict[str, float]
    resource_utilization: float
    steps: list[dict[str, float]] = field(default_factory=list)
    activations: int = 0
    deactivations: int = 0
    generated: int = 0
    consumed: int = 0
    queued: int = 0
    outstanding: int = 0
    admitted: int = 0
    efficiency: float = 0.0
    version_lag_mean: float = 0.0
    version_lag_max: int = 0
    trace_path: str | None = None
    gap_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The run's entry in ``lhr simulate --json`` (exactly the documented keys)."""
        return {
            "name": self.name,
            "policy": self.policy,
            "train_devices": self.train_devices,
            "rollout_devices": self.rollout_devices,
            "hybrid": self.hybrid,
            "time_s": self.time_s,
            "efficiency": self.efficiency,
            "resource_utilization": self.resource_utilization,
            "breakdown_s": dict(self.breakdown_s),
            "version_lag_mean": self.version_lag_mean,
            "version_lag_max": self.version_lag_max,
        }


@dataclass
class ScenarioResult:
    """All runs of a scenario and its balance bound.

    Args:
        scenario: Scenario name.
        balance_bound_s: The least of the runs' own balance bounds (so no run can beat it).
        runs: The runs, in scenario order.
    """

    scenario: str
    balance_bound_s: float
    runs: list[RunResult]

    def run(self, name: str) -> RunResult:
        """The run called ``name``."""
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"no run {name!r}; runs: {[r.name for r in self.runs]}")

    def to_json(self) -> dict[str, Any]:
        """The ``lhr simulate --json`` object."""
        return {
            "scenario": self.scenario,
            "balance_bound_s": self.balance_bound_s,
            "runs": [r.to_json() for r in self.runs],
        }
