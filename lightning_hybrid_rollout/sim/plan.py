"""``lhr plan``: every way to run a scenario's workload on N devices (every split, with and without hybrid replicas,
every registered policy, the runtime-option sets of :data:`OPTION_SETS`), simulated and ranked by predicted time
(docs/choosing_a_split.md, "Plan from a pilot run").

Example::

    from lightning_hybrid_rollout.sim import get_preset
    from lightning_hybrid_rollout.sim.plan import plan

    result = plan(get_preset("verl_32_devices"), 32, jobs=2)
    best = result.rows[0]
    print(best.name, best.time_s / 3600, best.efficiency, best.speedup_vs_static)
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_hybrid_rollout.errors import HybridRolloutError, PlanError
from lightning_hybrid_rollout.schedule import available_policies, policy_starting_ratio
from lightning_hybrid_rollout.schedule.cycle import ACTIVE_HYBRID_REPLICAS
from lightning_hybrid_rollout.sim.calibration import Calibration
from lightning_hybrid_rollout.sim.renames import OPTION_SET_RENAMES, resolve
from lightning_hybrid_rollout.sim.results import RunResult
from lightning_hybrid_rollout.sim.runner import run_once
from lightning_hybrid_rollout.sim.scenario import RunSpec, Scenario

logger = logging.getLogger(__name__)

__all__ = [
    "OPTION_SETS",
    "OptionSet",
    "Plan",
    "PlanError",
    "PlanRow",
    "Staleness",
    "base_scenario",
    "breakdown_groups",
    "candidate_runs",
    "candidate_scenario",
    "plan",
    "rank",
    "scale_sync",
    "simulate_candidates",
    "with_base_scenario",
    "with_lora",
]


@dataclass(frozen=True)
class OptionSet:
    """A named set of runtime options: a run's ``async_training`` changes, for hybrid and for static splits.

    Args:
        name: Shown in the plan's ``options`` column.
        hybrid: The changes of a run with hybrid replicas.
        static: The changes of a run without (only the options that act on standalone replicas).
        suffix: Appended to the run name (empty for the default set).
    """

    name: str
    hybrid: dict[str, Any]
    static: dict[str, Any]
    suffix: str


#: The runtime-option sets every split and policy is simulated with (see the module docstring for why two):
#: ``defaults``, every runtime option off (the config's defaults, rebalance on; its old name ``seed`` is a deprecated
#: alias, :data:`~lightning_hybrid_rollout.sim.renames.OPTION_SET_RENAMES`), and ``all``.
OPTION_SETS: dict[str, OptionSet] = {
    "defaults": OptionSet(
        "defaults",
        hybrid={
            "overlap_sync": False,
            "early_first_sync": False,
            "staged_standalone_sync": False,
            "standalone_sync_mode": "abort",
            "dynamic_schedule_enable_rebalance": True,
        },
        static={"early_first_sync": False, "staged_standalone_sync": False, "standalone_sync_mode": "abort"},
        suffix="",
    ),
    "all": OptionSet(
        "all",
        hybrid={
            "overlap_sync": True,
            "early_first_sync": True,
            "staged_standalone_sync": True,
            "standalone_sync_mode": "keep",
            "dynamic_schedule_enable_rebalance": False,
        },
        static={"early_first_sync": False, "staged_standalone_sync": True, "standalone_sync_mode": "keep"},
        suffix="_overlap_early_staged_keep",
    ),
}

_STATIC_SUFFIX = {"all": "_staged_keep"}


def _option_sets(names: Iterable[str] | None) -> list[OptionSet]:
    if names is None:
        return list(OPTION_SETS.values())
    out = []
    for name in names:
        name = resolve("option set", name, OPTION_SET_RENAMES, stacklevel=4)
        if name not in OPTION_SETS:
            raise PlanError(f"unknown option set {name!r}; option sets: {', '.join(OPTION_SETS)}")
        out.append(OPTION_SETS[name])
    return out


def _policies(names: Iterable[str] | None) -> list[str]:
    known = available_policies()
    if names is None:
        return known
    chosen = list(names)
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise PlanError(f"unknown polic{'y' if len(unknown) == 1 else 'ies'} {unknown}; registered: {', '.join(known)}")
    return chosen


def candidate_runs(
    scenario: Scenario,
    devices: int,
    *,
    policies: Iterable[str] | None = None,
    option_sets: Iterable[str] | None = None,
    partial_lending: bool = False,
) -> list[RunSpec]:
    """Every candidate run of ``scenario``'s workload on ``devices`` devices (see the module docstring).

    Args:
        scenario: The workload and hardware model (its own ``runs`` are ignored).
        devices: ``N``, all devices (>= 2: a split without hybrid replicas needs a trainer and a rollout device).
        policies: Policy names for the runs with hybrid replicas (default: every registered one).
        option_sets: Names of :data:`OPTION_SETS` (default: all).
        partial_lending: Also try each ``rate_matched`` run lending k of n hybrid replicas (``..._k_of_n``, its
            ``partial_lending: true``); the row's :attr:`PlanRow.lent_replicas` says which k it chose.

    Raises:
        PlanError: ``devices < 2``, an unknown policy or option set, or no split fitting the replica sizes.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2:
        raise PlanError(
            f"--devices must be an integer >= 2, got {devices!r}: a split without hybrid replicas needs at least one "
            f"trainer device and one rollout device"
        )
    sets = _option_sets(option_sets)
    names = _policies(policies)
    d, h = scenario.replica.devices, scenario.hybrid_model.devices
    own_policy = scenario.async_training.dynamic_schedule_policy
    own_kwargs = dict(scenario.async_training.dynamic_schedule_policy_kwargs)
    own_ratio = scenario.async_training.dynamic_schedule_deactivate_ratio
    runs: list[RunSpec] = []
    for opts in sets:
        for s in range(d, devices, d):
            t = devices - s
            suffix = _STATIC_SUFFIX.get(opts.name, opts.suffix)
            runs.append(RunSpec(f"static_{t}_{s}{suffix}", t, s, async_training=dict(opts.static)))
    for opts in sets:
        for s in range(0, devices, d):
            t = devices - s
            if t < h or t % h:
                continue
            for policy in names:
                changes: dict[str, Any] = {
                    "dynamic_schedule_policy": policy,
                    "dynamic_schedule_policy_kwargs": own_kwargs if policy == own_policy else {},
                    **opts.hybrid,
                }
                start = None if policy == own_policy else policy_starting_ratio(policy)
                if start is not None and start != own_ratio:
                    changes["dynamic_schedule_deactivate_ratio"] = start
                runs.append(
                    RunSpec(f"dynamic_{t}_{s}_{policy}{opts.suffix}", t, s, hybrid=True, async_training=changes)
                )
                if partial_lending and policy == "rate_matched" and t // h > 1:
                    kwargs = {**changes["dynamic_schedule_policy_kwargs"], "partial_lending": True}
                    k_of_n = {**changes, "dynamic_schedule_policy_kwargs": kwargs}
                    name = f"dynamic_{t}_{s}_{policy}_k_of_n{opts.suffix}"
                    runs.append(RunSpec(name, t, s, hybrid=True, async_training=k_of_n))
    if not runs:
        raise PlanError(
            f"no split of {devices} devices fits the replicas: standalone replicas take {d} devices "
            f"(replica.devices), hybrid ones {h} (hybrid_replica.devices); give --devices a multiple of them"
        )
    return runs


@dataclass
class Staleness:
    """How stale the samples of a plan run: per sync cycle, ``sim/staleness_samples`` (samples counted against the
    closing version, at most the rollouter's budget ``max_required_samples``) and ``sim/carried_samples`` (samples
    queued or in flight at the sync, so generated at least partly under older weights).

    Args:
        max_samples, mean_samples: Max and mean of ``sim/staleness_samples`` over the cycles.
        budget_samples: ``max_required_samples`` of the scenario (the admission bound per version).
        carried_mean_samples: Mean of ``sim/carried_samples`` over the cycles.
        step_samples: ``step_required_samples`` (samples one cycle trains), to read the counts against.
        version_lag_mean, version_lag_max: Over the trained samples, param versions between the weights a sample was
            first generated under and the weights it trained (:attr:`RunResult.version_lag_mean`; a real run's
            ``train/staleness_mean`` / ``_max``).
    """

    max_samples: float
    mean_samples: float
    budget_samples: int
    carried_mean_samples: float
    step_samples: int
    version_lag_mean: float = 0.0
    version_lag_max: int = 0

    @classmethod
    def of(cls, scenario: Scenario, result: RunResult) -> Staleness:
        """The summary of ``result``'s per-cycle metrics."""
        used = [s.get("sim/staleness_samples", 0.0) for s in result.steps] or [0.0]
        carried = [s.get("sim/carried_samples", 0.0) for s in result.steps] or [0.0]
        return cls(
            max_samples=max(used),
            mean_samples=statistics.fmean(used),
            budget_samples=scenario.max_required_samples,
            carried_mean_samples=statistics.fmean(carried),
            step_samples=scenario.step_required_samples,
            version_lag_mean=result.version_lag_mean,
            version_lag_max=result.version_lag_max,
        )


@dataclass
class PlanRow:
    """One candidate of a plan, simulated.

    Args:
        rank: 1 = fastest; candidates that failed come last.
        name: The run's name (``static_T_S[...]`` / ``dynamic_T_S_<policy>[...]``).
        train_devices, rollout_devices, hybrid: The split.
        policy: The policy (None without hybrid replicas).
        options: The :data:`OPTION_SETS` name.
        async_training: The run's ``async_training`` changes (paste them into a scenario's ``runs:`` or a config).
        time_s: Predicted time.
        efficiency: The plan's balance bound / ``time_s``.
        speedup_vs_static: The best static candidate's time / ``time_s`` (None without a static candidate).
        breakdown_s: Where the trainer's time went (``BREAKDOWN_KEYS``, seconds).
        staleness: :class:`Staleness`.
        activations: Hybrid activations.
        hybrid_replicas: ``n``, the split's hybrid replicas (0 without).
        lent_replicas: The replicas lent per activated cycle, mean over those cycles (the ``k`` to configure: all
            ``n`` unless the policy lends a subset; None when never lent).
        work_bound_s: The run's own balance bound.
        error: Why the candidate could not be simulated (then the numbers are NaN / empty).
    """

    rank: int
    name: str
    train_devices: int
    rollout_devices: int
    hybrid: bool
    policy: str | None
    options: str
    async_training: dict[str, Any]
    time_s: float
    efficiency: float
    speedup_vs_static: float | None
    breakdown_s: dict[str, float]
    staleness: Staleness | None
    activations: int = 0
    hybrid_replicas: int = 0
    lent_replicas: float | None = None
    work_bound_s: float = float("nan")
    error: str | None = None

    @property
    def split(self) -> str:
        """``"T+S"``."""
        return f"{self.train_devices}+{self.rollout_devices}"

    def spec(self) -> RunSpec:
        """The candidate as a scenario run (what ``runs:`` of a scenario file would hold)."""
        return RunSpec(
            self.name, self.train_devices, self.rollout_devices, hybrid=self.hybrid, async_training=self.async_training
        )

    def to_json(self) -> dict[str, Any]:
        """The row's entry in ``lhr plan --json``."""
        ok = self.error is None
        return {
            "rank": self.rank,
            "name": self.name,
            "train_devices": self.train_devices,
            "rollout_devices": self.rollout_devices,
            "hybrid": self.hybrid,
            "policy": self.policy,
            "options": self.options,
            "async_training": dict(self.async_training),
            "time_s": self.time_s if ok else None,
            "efficiency": self.efficiency if ok else None,
            "speedup_vs_static": self.speedup_vs_static if ok else None,
            "breakdown_s": dict(self.breakdown_s),
            "staleness": dataclasses.asdict(self.staleness) if self.staleness is not None else None,
            "activations": self.activations,
            "hybrid_replicas": self.hybrid_replicas,
            "lent_replicas": self.lent_replicas,
            "error": self.error,
        }


@dataclass
class Plan:
    """A ranked plan: every candidate on ``devices`` devices, fastest first.

    Args:
        scenario: The scenario's name.
        devices: ``N``.
        balance_bound_s: The least of the candidates' own balance bounds.
        best_static: Name of the fastest candidate without hybrid replicas (None if there is none).
        rows: The candidates, ranked.
        wall_s: Seconds the simulations took.
    """

    scenario: str
    devices: int
    balance_bound_s: float
    best_static: str | None
    rows: list[PlanRow] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def best(self) -> PlanRow:
        """The fastest candidate."""
        return self.rows[0]

    def row(self, name: str) -> PlanRow:
        """The candidate called ``name``."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no candidate {name!r} in the plan")

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        """The ``lhr plan --json`` object (the first ``top`` rows, default all)."""
        rows = self.rows if top is None else self.rows[:top]
        return {
            "scenario": self.scenario,
            "devices": self.devices,
            "balance_bound_s": self.balance_bound_s,
            "best_static": self.best_static,
            "candidates": len(self.rows),
            "rows": [r.to_json() for r in rows],
        }


def base_scenario(source: Scenario | Calibration) -> Scenario:
    """The scenario of ``source``: itself, or the scenario a :class:`Calibration` fitted to its pilot run."""
    return source.scenario if isinstance(source, Calibration) else source


def with_base_scenario(source: Scenario | Calibration, scenario: Scenario) -> Scenario | Calibration:
    """``source`` with ``scenario`` in place of its :func:`base_scenario` (a Calibration keeps its fit's record)."""
    return dataclasses.replace(source, scenario=scenario) if isinstance(source, Calibration) else scenario


def candidate_scenario(source: Scenario | Calibration, spec: RunSpec) -> Scenario:
    """The one-run scenario ``spec`` is simulated in.

    A scenario runs every candidate as it is. A :class:`Calibration` (a pilot run's fit, ``lhr plan --from-run``)
    converts the standalone replicas' rate between a pilot whose hybrid replicas served and a candidate where they
    never do, or the other way round (:meth:`Calibration.scenario_for`, the conversion ``benchmarks/
    planner_fidelity.py`` measures against real runs): by the calibration's ``standalone_factor`` (``lhr plan
    --standalone-speed-with-hybrid``), else its host preset's (``--host-preset``), else
    ``STANDALONE_SPEED_WITH_HYBRID`` (1.0): the standalone replicas' speed beside a busy trainer device, which a
    candidate whose hybrid replicas serve keeps busy nearly throughout.

    Raises:
        CalibrationError: A candidate the calibration's conversion refuses.
    """
    if isinstance(source, Calibration):
        return source.scenario_for(spec)
    return source.with_runs([spec])


def _simulate_one(source: Scenario | Calibration, spec: RunSpec) -> RunResult | str:
    """One candidate, alone in its scenario; a candidate the simulator refuses gives its one-line reason."""
    try:
        sc = candidate_scenario(source, spec)
        return run_once(sc, sc.runs[0])
    except (HybridRolloutError, ValueError, TypeError) as err:  # a policy refusing the scenario, a stuck run
        return f"{type(err).__name__}: {err}"


def simulate_candidates(
    scenario: Scenario | Calibration, specs: Sequence[RunSpec], jobs: int = 1
) -> list[RunResult | str]:
    """Simulate each candidate (a one-run scenario each, :func:`candidate_scenario`), in ``jobs`` worker processes
    when ``jobs > 1``.

    Worker processes import the package afresh where the platform does not fork, so a policy registered by a
    script (not by an imported module or an entry point) is then unknown there: use ``jobs=1``.

    Args:
        scenario: The workload: a scenario, or a pilot run's :class:`Calibration`.
        specs: The candidates (:func:`candidate_runs`).
        jobs: Worker processes (1: in this process).

    Returns:
        Per candidate, in order: its :class:`RunResult`, or why it could not be simulated.
    """
    if jobs < 1:
        raise PlanError(f"--jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(specs) < 2:
        return [_simulate_one(scenario, s) for s in specs]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(jobs, len(specs))) as pool:
        return list(pool.map(_simulate_one, [scenario] * len(specs), specs, chunksize=1))


def _options_of(spec: RunSpec) -> str:
    for opts in OPTION_SETS.values():
        wanted = opts.hybrid if spec.hybrid else opts.static
        if all(spec.async_training.get(k) == v for k, v in wanted.items()):
            return opts.name
    return "-"


def _lent_replicas(result: RunResult) -> float | None:
    lent = [v for s in result.steps if (v := s.get(ACTIVE_HYBRID_REPLICAS)) is not None and v > 0]
    return statistics.fmean(lent) if lent else None


def rank(scenario: Scenario, devices: int, specs: Sequence[RunSpec], results: Sequence[RunResult | str]) -> Plan:
    """Rank simulated candidates: fastest first (failed ones last), with efficiency and speedup over static."""
    done = [r for r in results if isinstance(r, RunResult)]
    if not done:
        first = next((r for r in results if isinstance(r, str)), "no candidates")
        raise PlanError(f"no candidate could be simulated on {devices} devices; the first said: {first}")
    bound = min(r.work_bound_s for r in done)
    statics = [r for r in done if not r.hybrid]
    best_static = min(statics, key=lambda r: (r.time_s, r.name)) if statics else None
    rows = []
    for spec, res in zip(specs, results, strict=True):
        common = {
            "hybrid_replicas": spec.train_devices // scenario.hybrid_model.devices if spec.hybrid else 0,
            "name": spec.name,
            "train_devices": spec.train_devices,
            "rollout_devices": spec.rollout_devices,
            "hybrid": spec.hybrid,
            "policy": spec.policy,
            "options": _options_of(spec),
            "async_training": dict(spec.async_training),
        }
        if isinstance(res, str):
            nan = float("nan")
            rows.append(
                PlanRow(
                    0,
                    **common,
                    time_s=nan,
                    efficiency=nan,
                    speedup_vs_static=None,
                    breakdown_s={},
                    staleness=None,
                    error=res,
                )
            )
            continue
        rows.append(
            PlanRow(
                0,
                **common,
                time_s=res.time_s,
                efficiency=bound / res.time_s if res.time_s > 0 else 0.0,
                speedup_vs_static=best_static.time_s / res.time_s if best_static and res.time_s > 0 else None,
                breakdown_s=dict(res.breakdown_s),
                staleness=Staleness.of(scenario, res),
                activations=res.activations,
                lent_replicas=_lent_replicas(res),
                work_bound_s=res.work_bound_s,
            )
        )
    rows.sort(key=lambda r: (r.error is not None, r.time_s if r.error is None else 0.0, r.name))
    for i, r in enumerate(rows, 1):
        r.rank = i
    return Plan(scenario.name, devices, bound, best_static.name if best_static else None, rows)


def plan(
    scenario: Scenario | Calibration,
    devices: int,
    *,
    jobs: int = 1,
    policies: Iterable[str] | None = None,
    option_sets: Iterable[str] | None = None,
    partial_lending: bool = False,
) -> Plan:
    """Simulate every candidate run on ``devices`` devices (:func:`candidate_runs`) and rank them by time.

    Args:
        scenario: The workload and hardware model: a scenario (a preset, a YAML file), or a pilot run's
            :class:`Calibration` (``calibrate_run(RUN_DIR)``), whose candidates each get the pilot's standalone
            rate converted for them (:func:`candidate_scenario`).
        devices: ``N``.
        jobs: Worker processes for the simulations.
        policies: Policies to try with hybrid replicas (default: every registered one).
        option_sets: :data:`OPTION_SETS` names (default: all).
        partial_lending: Also try ``rate_matched`` lending k of n (:func:`candidate_runs`).

    Raises:
        PlanError: See :func:`candidate_runs`; or when no candidate could be simulated.
    """
    base = base_scenario(scenario)
    specs = candidate_runs(base, devices, policies=policies, option_sets=option_sets, partial_lending=partial_lending)
    t0 = time.perf_counter()
    results = simulate_candidates(scenario, specs, jobs)
    out = rank(base, devices, specs, results)
    out.wall_s = time.perf_counter() - t0
    return out


def scale_sync(scenario: Scenario, model_gb: float, sync_gbps: float) -> Scenario:
    """The scenario with its standalone weight sync as bytes over bandwidth: ``model_gb × 8 / sync_gbps`` seconds.

    The trainer sends the full weights (``model_gb`` gigabytes, e.g. 2 bytes per parameter in bf16) to the
    standalone replicas over a link of ``sync_gbps`` gigabits/s (a broadcast: the time does not grow with the number
    of replicas). The hybrid weight sync, the wake-up/sleep and the staged commit stay as the scenario has them:
    they move weights between a device and its own host, which a pilot on the same device type measures.

    Args:
        scenario: The scenario.
        model_gb: Bytes of the weights, in GB (1e9 bytes).
        sync_gbps: Bandwidth of the trainer → standalone-replica link, in Gbit/s.

    Raises:
        PlanError: A value that is not a positive number.
    """
    for name, value in (("--model-gb", model_gb), ("--sync-gbps", sync_gbps)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise PlanError(f"{name} must be a number > 0, got {value!r}")
    seconds = float(model_gb) * 8.0 / float(sync_gbps)
    return dataclasses.replace(scenario, switch=dataclasses.replace(scenario.switch, standalone_sync_s=seconds))


def with_lora(scenario: Scenario, adapter_fraction: float) -> Scenario:
    """``scenario`` training a LoRA adapter of ``adapter_fraction`` of the weights' bytes (``lhr plan --lora``): its
    ``lora`` section enabled with that fraction (its other fields kept), so syncs move only the adapter and hybrid
    replicas keep their base weights (:class:`~lightning_hybrid_rollout.sim.scenario.LoraModel`).

    Raises:
        PlanError: A fraction outside ``[0, 1]``.
    """
    if isinstance(adapter_fraction, bool) or not isinstance(adapter_fraction, (int, float)):
        raise PlanError(f"--lora must be a number in [0, 1], got {adapter_fraction!r}")
    if not 0.0 <= adapter_fraction <= 1.0:
        raise PlanError(f"--lora must be a number in [0, 1], got {adapter_fraction!r}")
    lora = dataclasses.replace(scenario.lora, enabled=True, adapter_fraction=float(adapter_fraction))
    return dataclasses.replace(scenario, lora=lora)


def breakdown_groups(row: PlanRow) -> dict[str, float]:
    """The trainer's time in four groups, as fractions of ``time_s``: ``train`` (computing), ``hybrid gen``
    (waiting while hybrid replicas generate), ``wait`` (start-up fill and idle waits) and ``switch+sync``
    (hybrid switches and weight syncs); any other bucket of ``BREAKDOWN_KEYS`` counts as ``wait``."""
    b, t = row.breakdown_s, row.time_s
    if not b or not t > 0:
        return {}
    train = b.get("training_compute", 0.0)
    hybrid = b.get("waiting_hybrid_generating", 0.0)
    switch = sum(b.get(k, 0.0) for k in ("hybrid_switching", "weight_sync_standalone", "weight_sync_hybrid"))
    rest = sum(b.values()) - train - hybrid - switch
    return {"train": train / t, "hybrid gen": hybrid / t, "wait": rest / t, "switch+sync": switch / t}
