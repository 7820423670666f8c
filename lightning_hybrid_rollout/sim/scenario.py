"""Scenario description for the simulator: plain data (a YAML file or a preset) with the workload, the hardware model,
the switch costs and the runs, which differ only in their :class:`RunSpec` (docs/simulator.md, "Scenario files").

Every section is a config section of the runtime's idiom (:class:`~lightning_hybrid_rollout.config.base.ConfigBase`):
each field's rule declared on the field, one line per bad value naming ``section.field``, raised as a
:class:`ScenarioError`. The sections' models live beside this module (re-exported here):
:mod:`~lightning_hybrid_rollout.sim.sample_models` (``lengths``, ``agentic``),
:mod:`~lightning_hybrid_rollout.sim.hardware_models` (``replica``, ``hybrid_replica``, ``trainer``),
:mod:`~lightning_hybrid_rollout.sim.switch_costs` (``switch``, ``lora``) and
:mod:`~lightning_hybrid_rollout.sim.lending` (``lending``).

Example::

    from lightning_hybrid_rollout.sim.scenario import Scenario

    sc = Scenario.from_dict({"name": "tiny", "steps": 3, "async_training": {"mini_batch_size": 8}, "runs": [
        {"name": "static_4_4", "train_devices": 4, "rollout_devices": 4},
        {"name": "dynamic_4_4", "train_devices": 4, "rollout_devices": 4, "hybrid": True,
         "async_training": {"dynamic_schedule_policy": "rate_matched", "overlap_sync": True}}]})
    assert sc.step_required_samples == sc.required_samples * sc.trigger_parameter_sync_step == 32
    assert sc.run("dynamic_4_4").sequencing == "overlap_sync" and sc.run("static_4_4").policy is None
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from lightning_hybrid_rollout.config import AsyncTrainingConfig, ConfigError, DerivedCounts
from lightning_hybrid_rollout.config.base import Checker, ConfigBase
from lightning_hybrid_rollout.config.fields import boolean, custom, field_rule, integer, section, text
from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ScenarioError as ScenarioError  # re-exported
from lightning_hybrid_rollout.sim.hardware_models import ReplicaModel, TrainerModel
from lightning_hybrid_rollout.sim.lending import LendingModel
from lightning_hybrid_rollout.sim.sample_models import AgenticModel, LengthModel
from lightning_hybrid_rollout.sim.switch_costs import LoraModel, SwitchCosts

__all__ = [
    "RUN_KEYS",
    "SEQUENCINGS",
    "AgenticModel",
    "LengthModel",
    "LoraModel",
    "ReplicaModel",
    "RunSpec",
    "Scenario",
    "ScenarioError",
    "SwitchCosts",
    "TrainerModel",
]

#: Named sequencings of the trainer's sync boundary: :attr:`RunSpec.sequencing` (``async_training.overlap_sync``):
#: ``sequential``, the standalone sync, then the policy's decision, then the hybrid wake and sync, one after another;
#: ``overlap_sync``, the hybrid half concurrent with the standalone sync (``"seed"``: the deprecated name of
#: ``sequential``, :data:`~lightning_hybrid_rollout.sim.renames.SEQUENCING_RENAMES`).
SEQUENCINGS: tuple[str, ...] = ("sequential", "overlap_sync")


# ----------------------------------------------------------------------------------------- async_training keys

_CONFIG_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AsyncTrainingConfig))

#: The ``async_training`` keys a run may change (the others describe the workload: one value per scenario).
RUN_KEYS: tuple[str, ...] = (
    "use_dynamic_resource_scheduling",
    "dynamic_schedule_policy",
    "dynamic_schedule_deactivate_ratio",
    "dynamic_schedule_policy_kwargs",
    "dynamic_schedule_enable_rebalance",
    "overlap_sync",
    "early_first_sync",
    "staged_standalone_sync",
    "standalone_sync_mode",
)

#: The workload keys: the same for every run of a scenario (the trainer's batches, the cadence, the staleness).
_WORKLOAD_KEYS: tuple[str, ...] = (
    "mini_batch_size",
    "require_batches",
    "trigger_parameter_sync_step",
    "staleness_threshold",
)

_SCENARIO_WIDE = "the simulator models it for the whole scenario: set it in the scenario's async_training section"

#: The config keys the simulator does not let differ from their defaults, and why.
_UNMODELLED: dict[str, str] = {
    "only_hybrid": "it follows each run's split (rollout_devices: 0 is colocated): drop the key",
    "partial_rollout": "the simulator models partial rollout only (aborted requests resume from their prefix)",
}


def _not_per_run(key: str) -> str:
    if key in _WORKLOAD_KEYS:
        return _SCENARIO_WIDE
    return _UNMODELLED.get(key, "the simulator does not model it")


def _unknown_key(where: str, key: Any) -> str:
    hint = did_you_mean(key, RUN_KEYS)
    return f"{where} has no key {key!r}.{hint} A run may set: {', '.join(RUN_KEYS)}."


def _run_changes_problems(_run: Any, key: str, changes: Any) -> list[str]:
    """Problems of a run's ``async_training``: a mapping of :data:`RUN_KEYS` only."""
    if not isinstance(changes, Mapping):
        return [
            f"{key} must be a mapping of async_training keys to values, got {changes!r}. Write e.g. "
            f"`async_training: {{overlap_sync: true}}`."
        ]
    problems = []
    for name in changes:
        if not (isinstance(name, str) and name in _CONFIG_KEYS):
            problems.append(_unknown_key(key, name))
        elif name not in RUN_KEYS:
            problems.append(f"{key}.{name} is not a run's own key: {_not_per_run(name)}.")
    return problems


def _workload_problems(_scenario: Any, key: str, value: Any) -> list[str]:
    """Problems of the scenario's ``async_training``: what the simulator does not model must stay at its default."""
    if not isinstance(value, AsyncTrainingConfig):
        return [
            f"{key} must be a mapping of the config's keys or an AsyncTrainingConfig, got {value!r}. Write e.g. "
            f"`async_training: {{mini_batch_size: 128}}`."
        ]
    default = AsyncTrainingConfig()
    problems = []
    for name in _CONFIG_KEYS:
        if name in RUN_KEYS or name in _WORKLOAD_KEYS or getattr(value, name) == getattr(default, name):
            continue
        why = _UNMODELLED.get(name, "the simulator does not model it: leave it at its default")
        seen, default_value = (json.dumps(v, default=str) for v in (getattr(value, name), getattr(default, name)))
        problems.append(f"{key}.{name} must be {default_value} in a scenario, got {seen}: {why}.")
    return problems


def _runs_problems(_scenario: Any, key: str, runs: Any) -> list[str]:
    if not isinstance(runs, (list, tuple)):
        return [f"{key} must be a list of runs, got {runs!r}. {_RUNS_EXAMPLE}"]
    return [
        f"{key}[{i}] must be a run (a mapping of its keys), got {run!r}. {_RUNS_EXAMPLE}"
        for i, run in enumerate(runs)
        if not isinstance(run, RunSpec)
    ]


def _hybrid_replica_problems(_scenario: Any, key: str, value: Any) -> list[str]:
    if value is None or isinstance(value, ReplicaModel):
        return []
    return [
        f"{key} must be null (the same as replica) or a mapping of replica keys, got {value!r}. Write e.g. "
        f"`hybrid_replica: {{devices: 4, tokens_per_s: 50}}`."
    ]


_RUNS_EXAMPLE = "Write e.g. `runs: [{name: static_16_16, train_devices: 16, rollout_devices: 16}]`."


def _run_from_mapping(data: Mapping[str, Any], index: int) -> RunSpec:
    """``runs[index]`` from plain data; its problem lines name the run (``runs[<name>].train_devices``, or
    ``runs[<index>]`` when it has no name) instead of the section (``runs.train_devices``)."""
    name = data.get("name")
    label = name if isinstance(name, str) and name else index
    try:
        return RunSpec.from_dict(data)
    except ScenarioError as err:
        raise ScenarioError([re.sub(r"^runs(?=[. ])", f"runs[{label}]", p) for p in err.problems]) from None


# ----------------------------------------------------------------------------------------------- the runs


@dataclass
class RunSpec(ConfigBase):
    """One run of a scenario: a device split, whether hybrid replicas exist, and its own ``async_training`` changes.

    Everything else a run's schedule depends on is the scenario's ``async_training``
    (:class:`~lightning_hybrid_rollout.config.AsyncTrainingConfig`): a run names only what it changes, by the
    config's own keys (:data:`RUN_KEYS`), and :attr:`config` is the result (the config a real run of this split
    would train with). The attributes the simulator reads (:attr:`policy`, :attr:`policy_kwargs`, :attr:`sequencing`,
    :attr:`enable_rebalance`, :attr:`early_first_sync`, :attr:`staged_standalone_sync`) are read-only views of it. A
    run takes the scenario's config when a :class:`Scenario` holds it (a loose one resolves against the defaults).

    How the simulator models the keys a run may set:

    * ``dynamic_schedule_policy``, ``dynamic_schedule_deactivate_ratio``, ``dynamic_schedule_policy_kwargs``: the
      policy, built as the runtime builds it (used only with ``hybrid``; reported as null otherwise).
    * ``dynamic_schedule_enable_rebalance``: the controller's rebalance after an activation.
    * ``overlap_sync`` (:attr:`sequencing` ``"overlap_sync"``; false = ``"sequential"``): false, the standalone sync,
      then wake → hybrid sync → add → resume, all on the trainer's critical path; true, the policy is asked before the
      standalone sync, as verl does, and if it will activate, the hybrid wake-up and then the hybrid weight sync run
      concurrently with the standalone sync; the controller's activation then finds the replicas awake with current
      weights and only adds and resumes them.
    * ``early_first_sync`` (runtime option, off = verl's cadence): the first weight sync comes after the first
      micro fit-step instead of after ``trigger_parameter_sync_step`` of them, and the second after the
      ``trigger_parameter_sync_step``-th, so later syncs fall where they always do: the same micro-steps and one
      more sync (version). A policy that measures before it activates decides after one measured step instead of a
      whole cycle. The length model follows training progress (micro-steps), not versions.
    * ``staged_standalone_sync`` (runtime option, off = verl's sync, standalone generation paused for all of
      ``switch.standalone_sync_s``): the weights are staged on the standalone replicas' side while they keep
      generating; they pause only for the last ``switch.standalone_commit_s`` of the sync to load them (the commit;
      with ``standalone_sync_aborts`` their requests are aborted there). The trainer is blocked for
      ``standalone_sync_s`` either way.
    * ``use_dynamic_resource_scheduling``: must stay true for a ``hybrid`` run (as the config's own check).

    Example::

        from lightning_hybrid_rollout.sim.scenario import RunSpec

        run = RunSpec("dynamic", 16, 16, hybrid=True, async_training={"dynamic_schedule_policy": "rate_matched"})
        assert run.policy == "rate_matched" and run.sequencing == "sequential" and run.enable_rebalance
    """

    SECTION: ClassVar[str] = "runs"
    ERROR = ScenarioError

    name: str = text(fix="Name the run, e.g. static_16_16 or dynamic_default.")
    """Unique within the scenario (e.g. ``static_16_16``, ``dynamic_default``)."""

    train_devices: int = integer(at_least=1, fix="Give the trainer's devices, e.g. 16.")
    """Devices the trainer owns (and lends to hybrid replicas, if ``hybrid``)."""

    rollout_devices: int = integer(
        at_least=0, fix="Give the standalone replicas' devices (a multiple of replica.devices), or 0 for colocated."
    )
    """Devices of standalone replicas (a multiple of the replica size; 0 = colocated, which sets the config's
    ``only_hybrid``)."""

    hybrid: bool = boolean(False)
    """Whether hybrid replicas live on the trainer's devices."""

    async_training: dict[str, Any] = custom(
        default_factory=dict,
        requirement="a mapping of the async_training keys a run may set (RUN_KEYS) to values",
        check=_run_changes_problems,
    )
    """This run's changes to the scenario's ``async_training`` section (keys of :data:`RUN_KEYS`)."""

    standalone_sync_aborts: bool = boolean(True)
    """Fidelity option of the simulator, on by default (the run's ``async_training.standalone_sync_mode: keep``
    turns the aborts off the way the runtime does): when the standalone replicas pause for their weight sync
    (``VLLMEngine.begin_weight_update`` → ``_abort_all``) their requests in flight are aborted and the rollouter
    re-sends them with their generated prefix (partial rollout), paying the re-prefill
    (``switch.resume_prefill_ratio``). The pause, and so the abort, starts the sync with verl's sequencing and comes
    at the commit with ``staged_standalone_sync`` (the replicas keep generating while the buckets are staged). Off:
    the pause keeps the requests (vLLM ``pause_generation(mode="keep")``), what ``standalone_sync_mode: keep``
    does."""

    def prepare(self) -> None:
        if isinstance(self.async_training, Mapping):  # the run's own copy
            self.async_training = copy.deepcopy(dict(self.async_training))

    def check(self, c: Checker) -> None:
        if not self.hybrid and self.rollout_devices == 0:
            c.add(
                "rollout_devices",
                "> 0 without hybrid replicas",
                self.rollout_devices,
                "Nothing would generate: give the standalone replicas devices, or set hybrid: true (colocated).",
            )

    def _bound(self, base: AsyncTrainingConfig) -> RunSpec:
        """A copy of this run whose :attr:`config` is ``base`` with this run's changes (validated)."""
        run = dataclasses.replace(self)
        run._config = run._resolve(base)
        return run

    def _resolve(self, base: AsyncTrainingConfig) -> AsyncTrainingConfig:
        try:
            cfg = dataclasses.replace(base, **self.async_training, only_hybrid=self.rollout_devices == 0)
        except ConfigError as err:
            raise ScenarioError([f"runs[{self.name}]: {p}" for p in err.problems]) from None
        if self.hybrid and not cfg.use_dynamic_resource_scheduling:
            raise ScenarioError(
                f"runs[{self.name}]: hybrid: true needs async_training.use_dynamic_resource_scheduling true, got "
                f"false. Without scheduling the hybrid replicas never generate: set it true, or hybrid: false for "
                f"plain fully-async."
            )
        return cfg

    # ------------------------------------------------------------------------------- views of the config

    @property
    def config(self) -> AsyncTrainingConfig:
        """The run's ``async_training``: the scenario's with this run's changes (``only_hybrid`` = colocated)."""
        config: AsyncTrainingConfig | None = getattr(self, "_config", None)  # set by a scenario (``_bound``)
        if config is None:
            config = self._config = self._resolve(AsyncTrainingConfig())
        return config

    @property
    def policy(self) -> str | None:
        """``async_training.dynamic_schedule_policy`` with hybrid replicas; None without (nothing to schedule)."""
        return self.config.dynamic_schedule_policy if self.hybrid else None

    @property
    def policy_kwargs(self) -> dict[str, Any]:
        """The policy's constructor arguments besides ``only_hybrid``, as the runtime passes them:
        ``deactivate_ratio`` (``dynamic_schedule_deactivate_ratio``) and ``dynamic_schedule_policy_kwargs``."""
        cfg = self.config
        return {"deactivate_ratio": cfg.dynamic_schedule_deactivate_ratio, **cfg.dynamic_schedule_policy_kwargs}

    @property
    def enable_rebalance(self) -> bool:
        """``async_training.dynamic_schedule_enable_rebalance``."""
        return self.config.dynamic_schedule_enable_rebalance

    @property
    def sequencing(self) -> str:
        """``"overlap_sync"`` with ``async_training.overlap_sync``, else ``"sequential"`` (:data:`SEQUENCINGS`)."""
        return "overlap_sync" if self.config.overlap_sync else "sequential"

    @property
    def early_first_sync(self) -> bool:
        """``async_training.early_first_sync``."""
        return self.config.early_first_sync

    @property
    def staged_standalone_sync(self) -> bool:
        """``async_training.staged_standalone_sync``."""
        return self.config.staged_standalone_sync

    @property
    def sync_aborts(self) -> bool:
        """Whether the standalone weight sync aborts the requests in flight (re-prefilled afterwards): verl's
        ``standalone_sync_mode: abort`` with the fidelity option :attr:`standalone_sync_aborts` on; ``keep`` freezes
        them in place for the load instead (no re-prefill; the pause is the same load)."""
        return self.standalone_sync_aborts and self.config.standalone_sync_mode == "abort"

    @property
    def devices(self) -> int:
        """All devices of the run."""
        return self.train_devices + self.rollout_devices


# ------------------------------------------------------------------------------------------------ the scenario


@dataclass
class Scenario(ConfigBase):
    """A workload, a hardware model, switch costs, and the runs to compare.

    Each section may be given as a mapping of its keys (as in a YAML file) or as its model; a section left out, or
    null, is the model's defaults.
    """

    ERROR = ScenarioError  # its keys are the file's top-level keys (no SECTION)

    name: str = text(fix="Name the scenario, e.g. my_job.")
    """Scenario name (reported in the JSON)."""

    description: str | None = text("", empty_ok=True, nullable=True, fix="Write one paragraph, or leave it out.")
    """One paragraph for humans."""

    steps: int = integer(20, at_least=1, fix="Give the param versions (sync cycles) each run trains, e.g. 20.")
    """Param versions (sync cycles) each run trains."""

    async_training: AsyncTrainingConfig = custom(
        default_factory=AsyncTrainingConfig,
        requirement="a mapping of AsyncTrainingConfig's keys, with what the simulator does not model at its default",
        check=_workload_problems,
    )
    """The runs' :class:`~lightning_hybrid_rollout.config.AsyncTrainingConfig` (a mapping is read with the config's
    own keys and checks). The workload part is the same for every run: :attr:`required_samples` (``mini_batch_size ×
    require_batches``) samples per micro fit-step, ``trigger_parameter_sync_step`` micro fit-steps per sync cycle,
    and ``staleness_threshold``, which sets :attr:`max_required_samples` (the queue bound and the per-version
    admission budget) and :attr:`buffer_samples` (all from :func:`~lightning_hybrid_rollout.config.derived_counts`).
    The scheduling keys are every run's defaults; a run changes them in its own ``async_training``."""

    concurrent_samples_per_replica: int = integer(
        16, at_least=1, fix="Use a positive count such as 16 (verl's default)."
    )
    """Default replica concurrency cap."""

    group_size: int = integer(1, at_least=1, fix="Use 1, or the responses of one prompt (rollout.n), e.g. 8.")
    """Samples admitted and delivered together (responses of one prompt)."""

    seed: int = integer(0, at_least=0, fix="Use a non-negative integer.")
    """Random seed of the length draws."""

    lengths: LengthModel = section(LengthModel)
    """:class:`LengthModel`."""

    replica: ReplicaModel = section(ReplicaModel)
    """:class:`ReplicaModel` of standalone replicas."""

    hybrid_replica: ReplicaModel | None = custom(
        None, requirement="null (the same as replica) or a replica section", check=_hybrid_replica_problems
    )
    """:class:`ReplicaModel` of hybrid replicas (None = same as ``replica``)."""

    trainer: TrainerModel = section(TrainerModel)
    """:class:`TrainerModel`."""

    switch: SwitchCosts = section(SwitchCosts)
    """:class:`SwitchCosts` (full-weight costs; :attr:`costs` is what the runs pay)."""

    agentic: AgenticModel = section(AgenticModel)
    """:class:`AgenticModel` (multi-turn episodes with tool calls; default: single-turn samples)."""

    lora: LoraModel = section(LoraModel)
    """:class:`LoraModel` (adapter-only sync; default: off)."""

    lending: LendingModel = section(LendingModel)
    """:class:`~lightning_hybrid_rollout.sim.lending.LendingModel` (per-replica and delta sync costs)."""

    runs: list[RunSpec] = custom(default_factory=list, requirement="a list of runs", check=_runs_problems)
    """The runs (each a :class:`RunSpec` or a mapping of its keys); they take this scenario's ``async_training``."""

    def prepare(self) -> None:
        """The sections given as mappings (or null: the defaults) built into their models, as ``from_dict`` does."""
        for f in dataclasses.fields(self):
            rule, value = field_rule(f), getattr(self, f.name)
            if rule is not None and rule.kind == "section" and rule.section_type is not None:
                if value is None:
                    setattr(self, f.name, rule.section_type())
                elif isinstance(value, Mapping):
                    setattr(self, f.name, rule.section_type.from_dict(value))
        if isinstance(self.hybrid_replica, Mapping):
            self.hybrid_replica = ReplicaModel.from_dict(self.hybrid_replica)
        if isinstance(self.async_training, Mapping):
            try:
                self.async_training = AsyncTrainingConfig.from_dict(self.async_training)
            except ConfigError as err:
                raise ScenarioError(err.problems) from None
        if isinstance(self.runs, (list, tuple)):
            self.runs = [_run_from_mapping(r, i) if isinstance(r, Mapping) else r for i, r in enumerate(self.runs)]

    def check(self, c: Checker) -> None:
        given, bound = self.runs, []
        for run in given:  # each run takes this scenario's async_training
            try:
                bound.append(run._bound(self.async_training))
            except ScenarioError as err:
                c.problems.extend(err.problems)
        self.runs = bound
        names = [r.name for r in given]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            c.add("runs", "a list of runs with unique names", names, f"Rename the copies of {', '.join(twice)}.")
        samples, group = self.required_samples, self.group_size
        if samples % group:
            c.problems.append(
                f"async_training.mini_batch_size × require_batches must be a multiple of {c.key('group_size')}="
                f"{group}, got {samples}. A step trains whole groups: use e.g. {max(1, round(samples / group)) * group}"
                f" samples per step, or another group_size."
            )
        d = self.replica.devices
        for r in given:
            if r.rollout_devices % d:
                c.problems.append(
                    f"runs[{r.name}].rollout_devices must be a multiple of replica.devices={d}, got "
                    f"{r.rollout_devices}. Standalone replicas take {d} devices each."
                )
            hd = self.hybrid_model.devices
            if r.hybrid and r.train_devices % hd:
                c.problems.append(
                    f"runs[{r.name}].train_devices must be a multiple of the hybrid replica's devices={hd} to host "
                    f"hybrid replicas, got {r.train_devices}. Use a multiple of {hd}, or hybrid: false."
                )

    # ---------------------------------------------------------------------------------------------- derived

    @property
    def derived_counts(self) -> DerivedCounts:
        """The workload's sample counts (``async_training.derived_counts``)."""
        return self.async_training.derived_counts

    @property
    def required_samples(self) -> int:
        """Samples per micro fit-step: ``async_training.required_samples`` (``mini_batch_size × require_batches``)."""
        return self.async_training.required_samples

    @property
    def trigger_parameter_sync_step(self) -> int:
        """Micro fit-steps per sync cycle: ``async_training.trigger_parameter_sync_step``."""
        return self.async_training.trigger_parameter_sync_step

    @property
    def staleness_threshold(self) -> float:
        """``async_training.staleness_threshold``."""
        return self.async_training.staleness_threshold

    @property
    def step_required_samples(self) -> int:
        """Samples per sync cycle: ``required_samples × trigger_parameter_sync_step``."""
        return self.async_training.step_required_samples

    @property
    def max_required_samples(self) -> int:
        """``int(required × (1 + staleness_threshold) × trigger)`` (verl's expression): queue bound and budget."""
        return self.async_training.max_required_samples

    @property
    def buffer_samples(self) -> int:
        """``int(step_required_samples × staleness_threshold)`` (``async_training.buffer_samples``)."""
        return self.async_training.buffer_samples

    @property
    def hybrid_model(self) -> ReplicaModel:
        """The hybrid replicas' model (``hybrid_replica`` or, if unset, ``replica``)."""
        return self.hybrid_replica if self.hybrid_replica is not None else self.replica

    @property
    def costs(self) -> SwitchCosts:
        """The switch and sync seconds the runs pay: :attr:`switch`, scaled by :attr:`lora` and :attr:`lending`."""
        return self.lending.apply(self.lora.apply(self.switch))

    @property
    def multi_turn(self) -> bool:
        """Whether an episode may have more than one model turn (:attr:`agentic`)."""
        return self.agentic.max_turns > 1

    def context_at(self, version: float) -> float:
        """Average context (tokens) of an in-flight turn at ``version``: :meth:`LengthModel.context_at`, plus, for
        multi-turn episodes, the earlier turns and tool results of an average turn (``(mean_turns − 1) / 2`` each)."""
        context = self.lengths.context_at(version)
        if self.multi_turn:
            earlier = 0.5 * (self.agentic.mean_turns - 1.0)
            context += earlier * (self.lengths.mean_at(version) + self.agentic.tool_output_tokens)
        return context

    def cap_of(self, model: ReplicaModel) -> int:
        """Concurrency cap of a replica of ``model``."""
        return model.concurrency if model.concurrency is not None else self.concurrent_samples_per_replica

    def run(self, name: str) -> RunSpec:
        """The run called ``name``."""
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"scenario {self.name!r} has no run {name!r}; runs: {[r.name for r in self.runs]}")

    def with_runs(self, runs: list[RunSpec]) -> Scenario:
        """A copy with other runs (each takes this scenario's ``async_training``)."""
        return dataclasses.replace(self, runs=list(runs))

    # ----------------------------------------------------------------------------------------------- (de)ser

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (what :meth:`from_dict` and the YAML loader accept): the scenario's whole
        ``async_training`` section, and each run's own changes to it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        """Build and validate a scenario from plain data.

        Args:
            data: A mapping with the fields of :class:`Scenario` (nested models as mappings).

        Raises:
            ScenarioError: a bad value or an unknown key (one line each).
        """
        return super().from_dict(data)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Scenario:
        """Load a scenario YAML file.

        Args:
            path: The file.
        """
        import yaml

        text = Path(path).read_text(encoding="utf-8")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ScenarioError(f"{path}: not valid YAML: {err}") from err
        try:
            return cls.from_dict(data)
        except TypeError as err:
            raise ScenarioError(f"{path}: {err}") from err
