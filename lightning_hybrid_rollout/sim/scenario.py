"""Scenario description for the simulator: plain data (a YAML file or a preset) with the workload, the hardware model,
the switch costs and the runs, which differ only in their :class:`RunSpec` (docs/simulator.md, "Scenario files").

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
import itertools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.config import AsyncTrainingConfig, ConfigError, DerivedCounts
from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ScenarioError as ScenarioError  # re-exported
from lightning_hybrid_rollout.sim.lending import LendingModel

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


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ScenarioError(msg)


def _num(value: Any, name: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{name} must be a number, got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > minimum if strict else v >= minimum)
    _check(ok, f"{name} must be a finite number {'>' if strict else '>='} {minimum}, got {value!r}")
    return v


def _int(value: Any, name: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScenarioError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _from_mapping(cls: type, data: Mapping[str, Any] | None, where: str) -> Any:
    if data is None:
        return cls()
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where} must be a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(names)}")
    required = sorted(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data
    )
    if required:
        raise ScenarioError(f"{where}: missing required key(s) {required}")
    return cls(**dict(data))


@dataclass
class LengthModel:
    """Response lengths: log-normal around a mean that can drift with the param version, clipped.

    ``mean(version) = mean_tokens × (1 + drift_per_step × version) × schedule(version)``, where ``schedule`` linearly
    interpolates the ``mean_schedule`` points ``[[version, factor], ...]`` (1.0 when empty; held constant outside
    the points); a length is ``clip(round(mean(version) × exp(sigma·z − sigma²/2)), min_tokens, max_tokens)`` with
    ``z`` standard normal (so the unclipped mean is ``mean(version)``). The ``z`` of the i-th admitted sample is the
    same in every run of a scenario (common random numbers), so runs differ by their schedule, not by luck.

    Args:
        mean_tokens: Mean decode length at version 0.
        sigma: Log-normal shape (0 = every sample has the mean length).
        min_tokens: Lower clip.
        max_tokens: Upper clip (the response length limit).
        drift_per_step: Relative growth of the mean per param version (0.01 = +1% per version).
        prompt_tokens: Prompt length (trained over, never generated).
        mean_schedule: Optional ``[[version, factor], ...]`` multiplier of the mean (versions increasing).
    """

    mean_tokens: float = 4000.0
    sigma: float = 0.6
    min_tokens: int = 16
    max_tokens: int = 20480
    drift_per_step: float = 0.0
    prompt_tokens: int = 512
    mean_schedule: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mean_tokens = _num(self.mean_tokens, "lengths.mean_tokens", strict=True)
        self.sigma = _num(self.sigma, "lengths.sigma")
        self.min_tokens = _int(self.min_tokens, "lengths.min_tokens", minimum=1)
        self.max_tokens = _int(self.max_tokens, "lengths.max_tokens", minimum=1)
        _check(
            self.max_tokens >= self.min_tokens,
            f"lengths.max_tokens ({self.max_tokens}) must be >= lengths.min_tokens ({self.min_tokens})",
        )
        self.drift_per_step = _num(self.drift_per_step, "lengths.drift_per_step", minimum=-1.0)
        self.prompt_tokens = _int(self.prompt_tokens, "lengths.prompt_tokens")
        points = []
        for i, point in enumerate(self.mean_schedule or []):
            _check(
                isinstance(point, (list, tuple)) and len(point) == 2,
                f"lengths.mean_schedule[{i}] must be [version, factor], got {point!r}",
            )
            v = _num(point[0], f"lengths.mean_schedule[{i}][0]")
            f = _num(point[1], f"lengths.mean_schedule[{i}][1]", strict=True)
            _check(
                not points or v > points[-1][0],
                f"lengths.mean_schedule versions must increase, got {v} after {points[-1][0] if points else None}",
            )
            points.append([v, f])
        self.mean_schedule = points

    def context_at(self, version: float) -> float:
        """Average context (tokens) of an in-flight sample at ``version``: ``prompt + 0.7 × mean length``."""
        return self.prompt_tokens + 0.7 * self.mean_at(version)

    def schedule_at(self, version: float) -> float:
        """The ``mean_schedule`` factor at ``version`` (linear interpolation; 1.0 without points)."""
        pts = self.mean_schedule
        if not pts:
            return 1.0
        if version <= pts[0][0]:
            return pts[0][1]
        for (v0, f0), (v1, f1) in itertools.pairwise(pts):
            if version <= v1:
                return f0 + (f1 - f0) * (version - v0) / (v1 - v0)
        return pts[-1][1]

    def mean_at(self, version: float) -> float:
        """The (unclipped) mean length at ``version``; never below ``min_tokens``."""
        drift = 1.0 + self.drift_per_step * version
        return max(float(self.min_tokens), self.mean_tokens * drift * self.schedule_at(version))

    def length(self, z: float, version: float) -> int:
        """The length for standard-normal draw ``z`` at ``version``."""
        mean = self.mean_at(version)
        raw = mean * math.exp(self.sigma * z - 0.5 * self.sigma * self.sigma)
        return int(min(self.max_tokens, max(self.min_tokens, round(raw))))


@dataclass
class ReplicaModel:
    """One inference replica: devices, concurrency cap and decode speed.

    A replica with ``n`` samples in flight decodes ``X(min(n, limit))`` tokens/s in total, shared equally by the
    ``n`` samples, with ``X(m) = m × tokens_per_s / (1 + batch_slowdown × (m − 1))``: more samples in a batch give
    more throughput but each one decodes slower (decode is memory-bandwidth bound). ``limit`` is the concurrency
    cap, lowered by the KV cache when ``kv_cache_tokens`` is set: at most ``kv_cache_tokens / context`` samples run
    at once, where ``context = prompt_tokens + 0.7 × mean length`` approximates the average context of an in-flight
    sample (long samples stay in flight longer; on average they are half decoded). Samples beyond the limit (e.g.
    aborted requests retried onto the replica) wait their turn: the throughput stays ``X(limit)``.

    Args:
        devices: Devices one replica occupies (tensor parallel size).
        tokens_per_s: Decode speed of a single sample alone on the replica.
        batch_slowdown: ``beta`` above (0 = ideal: throughput linear in concurrency).
        concurrency: ``cap``; None = the scenario's ``concurrent_samples_per_replica``.
        kv_cache_tokens: KV-cache capacity in tokens of context (None = unlimited).
        speed_while_training: The fraction of its speed the replica keeps while the trainer trains (1 = unaffected,
            as on separate GPUs; a CPU host where the training shares the memory and caches measures ~0.8-0.95).
            The simulator applies it for the whole step, ``trainer.step_overhead_s`` included (a real run's
            overhead lies outside its ``training`` spans: a few ms per step on the CPU miniature).
            ``lhr simulate --from-run`` fits it from the standalone replicas' ``generated_tokens`` counters.
    """

    devices: int = 4
    tokens_per_s: float = 60.0
    batch_slowdown: float = 0.02
    concurrency: int | None = None
    kv_cache_tokens: float | None = None
    speed_while_training: float = 1.0

    def __post_init__(self) -> None:
        self.devices = _int(self.devices, "replica.devices", minimum=1)
        self.tokens_per_s = _num(self.tokens_per_s, "replica.tokens_per_s", strict=True)
        self.batch_slowdown = _num(self.batch_slowdown, "replica.batch_slowdown")
        if self.concurrency is not None:
            self.concurrency = _int(self.concurrency, "replica.concurrency", minimum=1)
        if self.kv_cache_tokens is not None:
            self.kv_cache_tokens = _num(self.kv_cache_tokens, "replica.kv_cache_tokens", strict=True)
        self.speed_while_training = _num(self.speed_while_training, "replica.speed_while_training", strict=True)

    @property
    def best_speed(self) -> float:
        """The largest share of ``tokens_per_s`` the replica decodes at: ``speed_while_training`` where the trainer's
        training speeds it up (a run measured above 1), else 1. The balance bound credits every replica with it."""
        return max(1.0, self.speed_while_training)

    def run_limit(self, cap: int, context_tokens: float) -> int:
        """Samples that decode at once: ``cap``, or fewer if their KV cache (``context_tokens`` each) does not fit."""
        if self.kv_cache_tokens is None:
            return cap
        return max(1, min(cap, int(self.kv_cache_tokens // max(1.0, context_tokens))))

    def throughput(self, n: int, limit: int) -> float:
        """Total decode tokens/s of the replica with ``n`` samples in flight, at most ``limit`` decoding at once."""
        m = min(n, limit)
        if m <= 0:
            return 0.0
        return m * self.tokens_per_s / (1.0 + self.batch_slowdown * (m - 1))


@dataclass
class TrainerModel:
    """The trainer's compute: device-seconds per trained token (prompt + response), divided over its devices.

    Training a batch on ``d`` devices takes ``Σ (prompt_tokens + length) × device_s_per_token / d + step_overhead_s``.

    Args:
        device_s_per_token: Device-seconds of training compute per token.
        step_overhead_s: Fixed seconds per micro fit-step (all devices busy; counted in the balance bound).
    """

    device_s_per_token: float = 0.004
    step_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        self.device_s_per_token = _num(self.device_s_per_token, "trainer.device_s_per_token", strict=True)
        self.step_overhead_s = _num(self.step_overhead_s, "trainer.step_overhead_s")


@dataclass
class SwitchCosts:
    """Seconds each operation blocks the trainer (and, where it applies, the replicas concerned).

    Args:
        standalone_sync_s: Weight sync trainer → standalone replicas (their generation is paused meanwhile).
        standalone_commit_s: With a run's ``staged_standalone_sync`` only: the pause at the end of the standalone
            sync during which the replicas load the staged weights (at most ``standalone_sync_s``).
        hybrid_sync_s: Weight sync trainer → hybrid replicas (``pool.sync_weights``).
        wake_s: ``wake_up_replicas`` (weights, then KV cache back on the devices; the trainer offloads first).
        sleep_s: ``sleep_replicas`` (release KV cache, offload weights; the trainer onloads after).
        add_s: ``add_replicas``.
        resume_s: ``resume_generation_replicas``.
        remove_s: ``remove_replicas``.
        abort_s: ``abort_replicas``.
        rebalance_s: ``rebalance_requests``.
        resume_prefill_ratio: A request aborted with ``k`` tokens generated pays ``k × ratio`` extra decode-token
            equivalents when it resumes on another replica (re-prefill of prompt + prefix).
    """

    standalone_sync_s: float = 15.0
    standalone_commit_s: float = 4.0
    hybrid_sync_s: float = 6.0
    wake_s: float = 8.0
    sleep_s: float = 6.0
    add_s: float = 0.2
    resume_s: float = 0.2
    remove_s: float = 0.2
    abort_s: float = 0.5
    rebalance_s: float = 0.5
    resume_prefill_ratio: float = 0.02

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, _num(getattr(self, f.name), f"switch.{f.name}"))

    @classmethod
    def zero(cls) -> SwitchCosts:
        """Every switch and sync free."""
        return cls(**{f.name: 0.0 for f in dataclasses.fields(cls)})


@dataclass
class AgenticModel:
    """Multi-turn episodes: model turns (decode) alternating with tool calls (waits). Off by default (one turn).

    With it, a sample is an *episode*: ``turns`` model turns drawn uniformly from ``[min_turns, max_turns]``, each
    turn's length drawn from :class:`LengthModel` (which then describes one turn: its long tail is the per-turn
    tail), and between two turns a tool call whose latency is log-normal, ``clip(median × exp(sigma·z),
    0, max_s)``. A turn occupies a replica's batch slot and decodes like a single-turn sample; during a tool call
    the episode holds no decode capacity (its replica serves other episodes) but still holds its place in the
    rollouter's concurrency cap, as the runtime's episode loop does. The next turn goes to the least-loaded routable
    replica (no sticky routing, no prefix-cache reuse: its context is re-prefilled at no modelled cost). The episode
    reaches the queue when its last turn ends; its length is the sum of its turns' lengths and the trainer trains
    over ``prompt_tokens + length + tool_output_tokens × (turns − 1)`` tokens. All draws of the i-th admitted episode
    are the same in every run of a scenario (common random numbers).

    Args:
        min_turns: Fewest model turns of an episode (1 = an episode may be a single-turn sample).
        max_turns: Most model turns of an episode.
        tool_latency_median_s: Median seconds of one tool call.
        tool_latency_sigma: Log-normal shape of the tool latency (0 = every call takes the median).
        tool_latency_max_s: Upper clip of one tool call (a tool timeout).
        tool_output_tokens: Tokens a tool result adds to the context (prefilled and trained over, never decoded).
    """

    min_turns: int = 1
    max_turns: int = 1
    tool_latency_median_s: float = 0.0
    tool_latency_sigma: float = 0.0
    tool_latency_max_s: float = 60.0
    tool_output_tokens: int = 0

    def __post_init__(self) -> None:
        self.min_turns = _int(self.min_turns, "agentic.min_turns", minimum=1)
        self.max_turns = _int(self.max_turns, "agentic.max_turns", minimum=1)
        _check(
            self.max_turns >= self.min_turns,
            f"agentic.max_turns ({self.max_turns}) must be >= agentic.min_turns ({self.min_turns})",
        )
        self.tool_latency_median_s = _num(self.tool_latency_median_s, "agentic.tool_latency_median_s")
        self.tool_latency_sigma = _num(self.tool_latency_sigma, "agentic.tool_latency_sigma")
        self.tool_latency_max_s = _num(self.tool_latency_max_s, "agentic.tool_latency_max_s")
        self.tool_output_tokens = _int(self.tool_output_tokens, "agentic.tool_output_tokens")

    @property
    def mean_turns(self) -> float:
        """Mean model turns of an episode."""
        return 0.5 * (self.min_turns + self.max_turns)

    def tool_latency(self, z: float) -> float:
        """Seconds of a tool call for standard-normal draw ``z``."""
        return min(self.tool_latency_max_s, self.tool_latency_median_s * math.exp(self.tool_latency_sigma * z))


@dataclass
class LoraModel:
    """LoRA training with adapter-only weight sync: what it changes in the switch and sync costs.

    The runtime's ``rollout.lora_sync: adapter`` and ``rollout.lora_keep_base`` (docs/lora.md). A sync moves only
    the adapter (``adapter_fraction`` of the full weights' bytes), so the standalone and hybrid syncs
    (``switch.standalone_sync_s``, ``standalone_commit_s``, ``hybrid_sync_s``) take ``adapter_fraction`` of their
    full-weight seconds, plus ``adapter_load_s`` (registering the adapter in the engine). With ``keep_base``, hybrid
    replicas keep their frozen base weights on the trainer's devices while asleep (LoRA training leaves them
    untouched): waking up costs only the KV-cache allocation (``kv_fraction`` of ``switch.wake_s``) and going to
    sleep only its release (``kv_fraction`` of ``switch.sleep_s``), and the base weights stay counted against the
    trainer's memory (the simulator does not model the memory itself).

    Args:
        enabled: Whether the runs train a LoRA adapter (off = full-weight sync, the switch costs as given).
        adapter_fraction: Adapter bytes over full-weight bytes (e.g. rank 64 on a 7B model: ~0.02).
        adapter_load_s: Seconds to load a synced adapter into an engine, paid by every sync.
        keep_base: Hybrid replicas keep their base weights while asleep (wake/sleep move no weights).
        kv_fraction: The share of ``switch.wake_s`` / ``switch.sleep_s`` that is KV-cache allocation / release
            (what is left with ``keep_base``).
    """

    enabled: bool = False
    adapter_fraction: float = 0.02
    adapter_load_s: float = 0.5
    keep_base: bool = True
    kv_fraction: float = 0.25

    def __post_init__(self) -> None:
        self.enabled = bool(self.enabled)
        self.keep_base = bool(self.keep_base)
        self.adapter_fraction = _num(self.adapter_fraction, "lora.adapter_fraction")
        _check(self.adapter_fraction <= 1.0, f"lora.adapter_fraction must be <= 1, got {self.adapter_fraction}")
        self.adapter_load_s = _num(self.adapter_load_s, "lora.adapter_load_s")
        self.kv_fraction = _num(self.kv_fraction, "lora.kv_fraction")
        _check(self.kv_fraction <= 1.0, f"lora.kv_fraction must be <= 1, got {self.kv_fraction}")

    def apply(self, switch: SwitchCosts) -> SwitchCosts:
        """The switch costs a LoRA run pays (``switch`` itself when disabled)."""
        if not self.enabled:
            return switch

        def sync(seconds: float) -> float:
            return seconds * self.adapter_fraction + self.adapter_load_s

        changes = {
            "standalone_sync_s": sync(switch.standalone_sync_s),
            "standalone_commit_s": sync(switch.standalone_commit_s),
            "hybrid_sync_s": sync(switch.hybrid_sync_s),
        }
        if self.keep_base:
            changes["wake_s"] = switch.wake_s * self.kv_fraction
            changes["sleep_s"] = switch.sleep_s * self.kv_fraction
        return dataclasses.replace(switch, **changes)


@dataclass
class RunSpec:
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

    Args:
        name: Unique within the scenario (e.g. ``static_16_16``, ``dynamic_default``).
        train_devices: Devices the trainer owns (and lends to hybrid replicas, if ``hybrid``).
        rollout_devices: Devices of standalone replicas (a multiple of the replica size; 0 = colocated, which sets
            the config's ``only_hybrid``).
        hybrid: Whether hybrid replicas live on the trainer's devices.
        async_training: This run's changes to the scenario's ``async_training`` section (keys of :data:`RUN_KEYS`).
        standalone_sync_aborts: Fidelity option of the simulator, on by default (the run's
            ``async_training.standalone_sync_mode: keep`` turns the aborts off the way the runtime does): when the
            standalone replicas pause for their weight sync (``VLLMEngine.begin_weight_update`` →
            ``_abort_all``) their requests in flight are aborted and the rollouter re-sends them with their generated
            prefix (partial rollout), paying the re-prefill (``switch.resume_prefill_ratio``). The pause, and so the
            abort, starts the sync with verl's sequencing and comes at the commit with ``staged_standalone_sync``
            (the replicas keep generating while the buckets are staged). Off: the pause keeps the requests (vLLM
            ``pause_generation(mode="keep")``), what ``standalone_sync_mode: keep`` does.

    Example::

        from lightning_hybrid_rollout.sim.scenario import RunSpec

        run = RunSpec("dynamic", 16, 16, hybrid=True, async_training={"dynamic_schedule_policy": "rate_matched"})
        assert run.policy == "rate_matched" and run.sequencing == "sequential" and run.enable_rebalance
    """

    name: str
    train_devices: int
    rollout_devices: int
    hybrid: bool = False
    async_training: dict[str, Any] = field(default_factory=dict)
    standalone_sync_aborts: bool = True

    def __post_init__(self) -> None:
        _check(
            isinstance(self.name, str) and bool(self.name), f"run name must be a non-empty string, got {self.name!r}"
        )
        where = f"runs[{self.name}]"
        self.train_devices = _int(self.train_devices, f"{where}.train_devices", minimum=1)
        self.rollout_devices = _int(self.rollout_devices, f"{where}.rollout_devices")
        self.hybrid = bool(self.hybrid)
        self.standalone_sync_aborts = bool(self.standalone_sync_aborts)
        if not self.hybrid:
            _check(
                self.rollout_devices > 0,
                f"{where}: without hybrid replicas rollout_devices must be > 0 (nothing would generate)",
            )
        _check(
            isinstance(self.async_training, Mapping),
            f"{where}.async_training must be a mapping of async_training keys to values, got {self.async_training!r}",
        )
        self.async_training = copy.deepcopy(dict(self.async_training))
        for key in self.async_training:
            _check(isinstance(key, str) and key in _CONFIG_KEYS, _unknown_key(f"{where}.async_training", key))
            _check(key in RUN_KEYS, f"{where}.async_training.{key} is not a run's own key: {_not_per_run(key)}.")
        self._config: AsyncTrainingConfig | None = None

    def _bound(self, base: AsyncTrainingConfig) -> RunSpec:
        """A copy of this run whose :attr:`config` is ``base`` with this run's changes (validated)."""
        run = dataclasses.replace(self)
        run._config = run._resolve(base)
        return run

    def _resolve(self, base: AsyncTrainingConfig) -> AsyncTrainingConfig:
        try:
            cfg = dataclasses.replace(base, **self.async_training, only_hybrid=self.rollout_devices == 0)
        except ConfigError as err:
            raise ScenarioError(f"runs[{self.name}]: {err}") from None
        _check(
            not self.hybrid or cfg.use_dynamic_resource_scheduling,
            f"runs[{self.name}]: hybrid: true needs async_training.use_dynamic_resource_scheduling true, got false. "
            f"Without scheduling the hybrid replicas never generate: set it true, or hybrid: false for plain "
            f"fully-async.",
        )
        return cfg

    # ------------------------------------------------------------------------------- views of the config

    @property
    def config(self) -> AsyncTrainingConfig:
        """The run's ``async_training``: the scenario's with this run's changes (``only_hybrid`` = colocated)."""
        if self._config is None:
            self._config = self._resolve(AsyncTrainingConfig())
        return self._config

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


@dataclass
class Scenario:
    """A workload, a hardware model, switch costs, and the runs to compare.

    Args:
        name: Scenario name (reported in the JSON).
        description: One paragraph for humans.
        steps: Param versions (sync cycles) each run trains.
        async_training: The runs' :class:`~lightning_hybrid_rollout.config.AsyncTrainingConfig` (a mapping is read
            with the config's own keys and checks). The workload part is the same for every run:
            :attr:`required_samples` (``mini_batch_size × require_batches``) samples per micro fit-step,
            ``trigger_parameter_sync_step`` micro fit-steps per sync cycle, and ``staleness_threshold``, which sets
            :attr:`max_required_samples` (the queue bound and the per-version admission budget) and
            :attr:`buffer_samples` (all from :func:`~lightning_hybrid_rollout.config.derived_counts`). The
            scheduling keys are every run's defaults; a run changes them in its own ``async_training``.
        concurrent_samples_per_replica: Default replica concurrency cap.
        group_size: Samples admitted and delivered together (responses of one prompt).
        seed: Random seed of the length draws.
        lengths: :class:`LengthModel`.
        replica: :class:`ReplicaModel` of standalone replicas.
        hybrid_replica: :class:`ReplicaModel` of hybrid replicas (None = same as ``replica``).
        trainer: :class:`TrainerModel`.
        switch: :class:`SwitchCosts` (full-weight costs; :attr:`costs` is what the runs pay).
        agentic: :class:`AgenticModel` (multi-turn episodes with tool calls; default: single-turn samples).
        lora: :class:`LoraModel` (adapter-only sync; default: off).
        lending: :class:`~lightning_hybrid_rollout.sim.lending.LendingModel` (per-replica and delta sync costs).
        runs: The runs.
    """

    name: str
    description: str = ""
    steps: int = 20
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    concurrent_samples_per_replica: int = 16
    group_size: int = 1
    seed: int = 0
    lengths: LengthModel = field(default_factory=LengthModel)
    replica: ReplicaModel = field(default_factory=ReplicaModel)
    hybrid_replica: ReplicaModel | None = None
    trainer: TrainerModel = field(default_factory=TrainerModel)
    switch: SwitchCosts = field(default_factory=SwitchCosts)
    agentic: AgenticModel = field(default_factory=AgenticModel)
    lora: LoraModel = field(default_factory=LoraModel)
    lending: LendingModel = field(default_factory=LendingModel)
    runs: list[RunSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check(
            isinstance(self.name, str) and bool(self.name),
            f"scenario name must be a non-empty string, got {self.name!r}",
        )
        self.steps = _int(self.steps, "steps", minimum=1)
        self.async_training = _async_training(self.async_training)
        self.concurrent_samples_per_replica = _int(
            self.concurrent_samples_per_replica, "concurrent_samples_per_replica", minimum=1
        )
        self.group_size = _int(self.group_size, "group_size", minimum=1)
        self.seed = _int(self.seed, "seed")
        self.lengths = _from_mapping(LengthModel, self.lengths, "lengths")
        self.replica = _from_mapping(ReplicaModel, self.replica, "replica")
        if self.hybrid_replica is not None:
            self.hybrid_replica = _from_mapping(ReplicaModel, self.hybrid_replica, "hybrid_replica")
        self.trainer = _from_mapping(TrainerModel, self.trainer, "trainer")
        self.switch = _from_mapping(SwitchCosts, self.switch, "switch")
        self.agentic = _from_mapping(AgenticModel, self.agentic, "agentic")
        self.lora = _from_mapping(LoraModel, self.lora, "lora")
        self.lending = _from_mapping(LendingModel, self.lending, "lending")
        runs = []
        for i, r in enumerate(self.runs):
            run = r if isinstance(r, RunSpec) else _run_from_mapping(r, i)
            runs.append(run._bound(self.async_training))
        self.runs = runs
        names = [r.name for r in self.runs]
        _check(len(names) == len(set(names)), f"run names must be unique, got {names}")
        _check(
            self.required_samples % self.group_size == 0,
            f"required_samples (async_training.mini_batch_size × require_batches = {self.required_samples}) must be "
            f"a multiple of group_size ({self.group_size})",
        )
        for r in self.runs:
            self._check_run(r)

    def _check_run(self, r: RunSpec) -> None:
        d = self.replica.devices
        _check(
            r.rollout_devices % d == 0,
            f"runs[{r.name}].rollout_devices ({r.rollout_devices}) must be a multiple of replica.devices ({d})",
        )
        if r.hybrid:
            hd = self.hybrid_model.devices
            _check(
                r.train_devices % hd == 0,
                f"runs[{r.name}].train_devices ({r.train_devices}) must be a multiple of the hybrid replica's "
                f"devices ({hd}) to host hybrid replicas",
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
            ScenarioError: a bad value or an unknown key.
        """
        if not isinstance(data, Mapping):
            raise ScenarioError(f"a scenario must be a mapping, got {type(data).__name__}")
        return _from_mapping(cls, data, "scenario")

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


def _async_training(value: Any) -> AsyncTrainingConfig:
    """The scenario's section as an :class:`AsyncTrainingConfig` (its own checks), refusing what is not modelled."""
    if isinstance(value, Mapping):
        try:
            value = AsyncTrainingConfig.from_dict(value)
        except ConfigError as err:
            raise ScenarioError(str(err)) from None
    _check(
        isinstance(value, AsyncTrainingConfig),
        f"async_training must be a mapping of the config's keys or an AsyncTrainingConfig, got {value!r}",
    )
    default = AsyncTrainingConfig()
    for key in _CONFIG_KEYS:
        if key in RUN_KEYS or key in _WORKLOAD_KEYS or getattr(value, key) == getattr(default, key):
            continue
        why = _UNMODELLED.get(key, "the simulator does not model it: leave it at its default")
        seen, default_value = (json.dumps(v, default=str) for v in (getattr(value, key), getattr(default, key)))
        raise ScenarioError(f"async_training.{key} must be {default_value} in a scenario, got {seen}: {why}.")
    return value


def _run_from_mapping(data: Any, index: int) -> RunSpec:
    """A :class:`RunSpec` from plain data."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"runs[{index}] must be a mapping, got {type(data).__name__}")
    return _from_mapping(RunSpec, data, f"runs[{index}]")
