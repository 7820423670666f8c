"""HybridRun: one fit's rollout side and scheduler, without Lightning.

The run owns what :class:`~lightning_hybrid_rollout.lightning.callback.HybridRolloutCallback` hands it at each hook:
the model's preparation and the workload (every rank), then on global rank 0 the rollout runtime (Ray, replicas,
queue, rollouter), the controller and its policy, the per-cycle core (``schedule.cycle.CycleLedger``), replica
health and the run's checkpointed counters. It reaches the fit only through a :class:`FitPort` (world size,
interruption, checkpoints, onload, the rank protocol, the cycle's weights, console lines), so a test or another
trainer drives the very same code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
from lightning_hybrid_rollout.config import (
    RUN_CONFIG_FILE,
    AsyncTrainingConfig,
    ConfigError,
    RolloutConfig,
    TinyModelConfig,
    validate_run_config,
)
from lightning_hybrid_rollout.errors import ReplicaFailureError
from lightning_hybrid_rollout.models.run_model import ensure_run_model
from lightning_hybrid_rollout.rewards import RewardConfig
from lightning_hybrid_rollout.rollout.drain import DrainReport
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.run.overlap import OverlapSync
from lightning_hybrid_rollout.run.rank_protocol import BoundaryProtocol
from lightning_hybrid_rollout.run.recent import RecentList
from lightning_hybrid_rollout.run.rollout_log import RolloutLog
from lightning_hybrid_rollout.run.step_times import StepTimes
from lightning_hybrid_rollout.run.workload import Workload, fit_episode_budget, load_workload
from lightning_hybrid_rollout.schedule import (
    DynamicResourceController,
    RateScheduleContext,
    ReplicaPool,
    create_policy,
)
from lightning_hybrid_rollout.schedule.cycle import CycleLedger, ProductionByRole, RunShape, Totals
from lightning_hybrid_rollout.sources import DatasetConfig

log = logging.getLogger(__name__)

__all__ = ["CALL_LOG_SIZE", "HEALTH_PROBE_EVERY_S", "SWITCH_HISTORY_SIZE", "CycleClose", "FitPort", "HybridRun"]

_STATE_VERSION = 2  # 2: switch_totals instead of every switch event
_SWITCH_KINDS = ("activate", "deactivate")
HEALTH_PROBE_EVERY_S = 5.0
"""While the trainer waits for samples, each replica answers a health check this often (an unanswered one is
treated as dead after ``rollout.replica_health_timeout_s``)."""
#: How many of the newest entries ``call_log`` keeps (a fit of any length keeps flat memory).
CALL_LOG_SIZE = 256
#: How many of the newest switches ``switch_events``, ``overlap_events`` and the controller's ``switch_history``
#: keep (the controller's goes into every checkpoint: a week-long run keeps its checkpoint's size flat).
SWITCH_HISTORY_SIZE = 32


class FitPort(Protocol):
    """What the run asks of the fit it serves (the callback's implementation wraps Lightning's ``Trainer``)."""

    @property
    def world_size(self) -> int:
        """The number of trainer ranks."""
        ...

    @property
    def protocol(self) -> BoundaryProtocol:
        """The ranks' protocol at a sync boundary (built at the fit's start)."""
        ...

    @property
    def weights(self) -> list[tuple[str, Any]] | None:
        """The cycle's full weights on rank 0 (gathered at the cycle's end)."""
        ...

    def check_interrupted(self) -> None:
        """Raise the fit's interruption if a SIGTERM arrived (a wait for samples can be long)."""
        ...

    def save_checkpoint(self, reason: str) -> None:
        """Save a checkpoint now, named after ``reason`` (a no-op when the fit does not checkpoint)."""
        ...

    def onload(self) -> None:
        """Bring this rank's training state back onto its devices (a no-op unless it is offloaded)."""
        ...

    def info(self, message: str) -> None:
        """One console line from rank 0."""
        ...

    def warn(self, message: str) -> None:
        """One warning from rank 0."""
        ...


@dataclasses.dataclass(frozen=True)
class CycleClose:
    """What a closed cycle hands its report (rank 0): the rollouter's cycle stats, the standalone sync's seconds and
    the controller's activation decision."""

    stats: Any
    sync_s: float
    end: Any


class HybridRun:
    """One fit's rollout side and scheduler (docs/callback.md): built by the callback, driven from its hooks.

    Args:
        rollout: The rollout side (:class:`~lightning_hybrid_rollout.config.RolloutConfig`).
        async_training: verl's ``async_training`` section.
        dataset: Where the prompts come from (a data set config, a custom source, or None: the toy ``task``).
        task: The built-in toy task used without a data set.
        task_kwargs: Keyword arguments of the task's constructor.
        rewards: The reward functions' section.
        agentic: The multi-turn section (tools, environment, budgets).
        log_rollouts: The first N samples trained on each cycle written as JSON lines (0: none).
        build_model: The tiny model to build at ``rollout.model_path`` if it holds none (None: never build).
        trace: Write the Chrome trace ``trace.json`` to the run dir.
        clock: The clock every cycle measurement is read from (a test may give a virtual one).
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        async_training: AsyncTrainingConfig,
        dataset: DatasetConfig | dict[str, Any] | None,
        task: str,
        task_kwargs: dict[str, Any],
        rewards: RewardConfig,
        agentic: AgenticConfig,
        log_rollouts: int = 0,
        build_model: TinyModelConfig | None = None,
        trace: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        validate_run_config(async_training, rollout)
        if not rollout.model_path:
            raise ConfigError(["rollout.model_path must be set: the directory of a Hugging Face causal LM"])
        if isinstance(log_rollouts, bool) or not isinstance(log_rollouts, int) or log_rollouts < 0:
            raise ConfigError([f"log_rollouts must be an integer >= 0 (0: none), got {log_rollouts!r}"])
        self.rollout, self.async_training, self.agentic, self.rewards = rollout, async_training, agentic, rewards
        self.dataset = (
            DatasetConfig(**dataset) if isinstance(dataset, dict) and "class_path" not in dataset else dataset
        )
        self.task_name, self.task_kwargs = task, dict(task_kwargs)
        self.log_rollouts, self.build_model, self.trace = log_rollouts, build_model, trace
        self.clock = clock
        a, r = async_training, rollout
        self.policy = create_policy(
            a.dynamic_schedule_policy,
            deactivate_ratio=a.dynamic_schedule_deactivate_ratio,
            only_hybrid=a.only_hybrid,
            **a.dynamic_schedule_policy_kwargs,
        )
        per_replica = r.gpus_per_replica if r.gpus_per_replica > 0 else r.cpus_per_replica
        #: The per-cycle core (shared with the simulator): every context field and cycle metric comes from it.
        self.ledger = CycleLedger(
            RunShape(
                required_samples=a.required_samples,
                trigger_parameter_sync_step=a.trigger_parameter_sync_step,
                buffer_samples=a.buffer_samples,
                only_hybrid=a.only_hybrid,
                num_standalone_replicas=r.standalone_replicas,
                num_hybrid_replicas=r.hybrid_replicas,
                standalone_devices=round(r.standalone_replicas * per_replica),
            )
        )
        self.workload: Workload | None = None
        self.runtime: Any = None
        self.controller: DynamicResourceController | None = None
        self.rollout_log: RolloutLog | None = None
        self.run_dir = Path(".")
        self._fit: FitPort | None = None
        self._pending_state: dict[str, Any] | None = None
        self._fallback_warned = False
        # the hybrid replicas in-fit validation took back, lent again after it (None: none were lent)
        self._lent_before_validation: tuple[int, ...] | None = None
        # checkpointed counters
        self.param_version = 0
        self.cycles_done = 0
        self.samples_consumed = 0
        self.generated_offset = 0
        #: Share of the last closed cycle's decoded tokens the group filter let into the queue (1.0 without a
        #: filter): the per-role production the policies see is scaled by it, so their rates are accepted rates.
        self.accepted_token_share = 1.0
        #: Samples of the current step's batch (``train/samples``).
        self.step_samples = 0
        #: Every switch since the run began, by kind: ``{"activate": {"count": n, "seconds": s}, "deactivate": ...}``
        #: (checkpointed; the console line's activations so far).
        self.switch_totals: dict[str, dict[str, float]] = {k: {"count": 0, "seconds": 0.0} for k in _SWITCH_KINDS}
        #: The newest switches, ``{"kind", "cycle", "duration_s"}`` each (not checkpointed).
        self.switch_events: list[dict[str, Any]] = RecentList(SWITCH_HISTORY_SIZE)
        #: The newest scheduler and trainer calls by name, oldest first (not checkpointed; tests read the order).
        self.call_log: list[str] = RecentList(CALL_LOG_SIZE)
        #: ``overlap_sync``'s ask-first, prepare-under-the-sync and undo (rank 0; :mod:`.overlap`).
        self.overlap = OverlapSync(clock=lambda: self.clock(), call_log=self.call_log, keep_events=SWITCH_HISTORY_SIZE)
        #: The last closed cycle's metrics, as reported.
        self.last_cycle_metrics: dict[str, float] = {}
        #: The current step's wall times.
        self.step = StepTimes(clock=lambda: self.clock())

    # ------------------------------------------------------------------------------------------------ set-up

    @property
    def hybrid_sync_skipped(self) -> int:
        """Sync decisions that left the hybrid replicas without the new weights (the start decision included)."""
        return self.ledger.hybrid_sync_skipped_total

    @property
    def resumed(self) -> bool:
        """A checkpoint was loaded and is not applied yet."""
        return self._pending_state is not None

    def is_sync_boundary(self, global_step: int) -> bool:
        """Every ``trigger_parameter_sync_step`` steps, and after the first step with ``early_first_sync``."""
        a = self.async_training
        return global_step % a.trigger_parameter_sync_step == 0 or (a.early_first_sync and global_step == 1)

    def describe_policy(self) -> str:
        """``Name(deactivate_ratio=..., only_hybrid=..., <each configured knob>=<the policy's value>)``."""
        names = ("deactivate_ratio", "only_hybrid", *self.async_training.dynamic_schedule_policy_kwargs)
        values = ", ".join(f"{k}={getattr(self.policy, k, '?')!r}" for k in names)
        return f"{type(self.policy).__name__}({values})"

    def prepare_model(self, model_dir: str, run_dir: Path, fit: FitPort) -> None:
        """Rank 0, before the fit: the run dir, and the tiny model built where ``build_model`` allows and none is."""
        from lightning_hybrid_rollout.tasks import get_task

        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        ensure_run_model(
            self.on_node(model_dir),
            self.build_model,
            lambda: get_task(self.task_name, **self.task_kwargs),
            announce=fit.info,
        )

    def load_workload(self, model_dir: str, fit_length: Callable[[int], Any] | None = None) -> Workload:
        """Every rank, before Ray: the episode budget fitted to the engines' context, the module's token budget
        checked (``fit_length``), then the data set, the prompts' lengths and the reward functions."""
        # the model's context read where this node loads it (a hub id's snapshot)
        self.agentic, self.rollout = fit_episode_budget(self.agentic, self.rollout, self.on_node(model_dir).model_path)
        if fit_length is not None:  # the module's token budget must hold the longest sequence (GRPOModule)
            fit_length(self.rollout.engine_max_model_len())
        self.workload = load_workload(
            dataset=self.dataset,
            task=self.task_name,
            task_kwargs=self.task_kwargs,
            rewards=self.rewards,
            rollout=self.on_node(model_dir),
            agentic=self.agentic,
        )
        return self.workload

    def on_node(self, model_dir: str) -> RolloutConfig:
        """``rollout`` with ``model_path`` the directory this node loads (a hub id's snapshot), for the local steps."""
        if model_dir == self.rollout.model_path:
            return self.rollout
        return dataclasses.replace(self.rollout, model_path=model_dir, model_revision=None)

    def save_run_config(self) -> None:
        """Write ``RUN_CONFIG_FILE`` (the ``rollout`` and ``async_training`` settings, secrets redacted) into the run
        dir, beside ``trace.json``: what ``lhr simulate --from-run`` reads back when no Lightning CLI ``config.yaml``
        is there (a ``Trainer`` built in Python)."""
        import yaml

        from lightning_hybrid_rollout.redaction import redact

        doc = {"rollout": self.rollout.to_dict(), "async_training": self.async_training.to_dict()}
        plain = json.loads(json.dumps(redact(doc), default=str))  # tuples to lists, anything else to text
        (self.run_dir / RUN_CONFIG_FILE).write_text(yaml.safe_dump(plain, sort_keys=False), encoding="utf-8")

    def start_runtime(
        self,
        fit: FitPort,
        trainer_link: Any,
        node_ips: list[str] | None = None,
        engine_lora: dict[str, Any] | None = None,
    ) -> None:
        """Rank 0, after every check: the run config saved, Ray, the replicas and the rollouter started, the
        controller built over the hybrid pool.

        Args:
            fit: The fit this run serves.
            trainer_link: The hybrid pool's ``TrainerLink`` (offload before a wake, the cycle's weights).
            node_ips: Trainer rank i's node, for hybrid replica i.
            engine_lora: The adapter's engine fields when syncs send the LoRA adapter alone.
        """
        from lightning_hybrid_rollout.run.runtime import RolloutRuntime

        self._fit = fit
        self.save_run_config()  # after every check: a refused run writes nothing
        if self.log_rollouts:
            self.rollout_log = RolloutLog(self.run_dir, self.log_rollouts)
        self.runtime = RolloutRuntime(
            rollout=self.rollout,
            async_training=self.async_training,
            workload=self.workload,
            run_dir=self.run_dir,
            trace=self.trace,
            trainer=trainer_link,
            hybrid_node_ips=node_ips,
            lora=engine_lora,
        )
        self.runtime.start()
        self.controller = self.build_controller(self.runtime.pool)

    def build_controller(self, pool: ReplicaPool) -> DynamicResourceController:
        """The controller over ``pool``, on the run's clock, keeping the newest ``SWITCH_HISTORY_SIZE`` switches."""
        return DynamicResourceController(
            pool,
            self.policy,
            clock=self.clock,
            enable_rebalance=self.async_training.dynamic_schedule_enable_rebalance,
            has_hybrid=self.rollout.hybrid_replicas > 0,
            history_size=SWITCH_HISTORY_SIZE,
            num_hybrid_replicas=self.rollout.hybrid_replicas or None,  # contexts as the simulator's
        )

    def start_fit(self, fit: FitPort, world_size: int) -> None:
        """At the fit's start (rank 0, the weights gathered on resume): generation starts, then the start decision
        (or, resumed, the restored state) inside the start boundary."""
        self._fit = fit
        self.ledger.shape = dataclasses.replace(self.ledger.shape, hybrid_devices=world_size)
        resumed = self.resumed
        rt = self.runtime
        if resumed:
            self._apply_loaded_state()
            rt.push_standalone(fit.weights, self.param_version)  # engines loaded version 0 from disk
        rt.set_weight_version(self.param_version)
        rt.start_generation()
        ranks = fit.protocol
        ranks.open()  # the start decision's (or the restore's) boundary
        if resumed:
            self._restore_pool_state()
        else:
            self.after_sync(global_steps=0)  # step 0: update_after_step is a no-op there
        ranks.close()
        rt.pool.take_cycle_sync_s()  # a start-up push belongs to no cycle's weight_sync_time_s
        rt.take_cycle_sync_bytes()  # nor to its weight_sync_bytes
        self._pending_state = None

    def follow_start(self, ranks: BoundaryProtocol) -> None:
        """At the fit's start on a rank other than 0: follow rank 0's start boundary."""
        ranks.follow()
        self._pending_state = None

    def stop(self) -> None:
        """Stop the runtime and close the workload (idempotent; every rank)."""
        try:
            if self.runtime is not None:
                runtime, self.runtime = self.runtime, None
                runtime.stop()
        finally:
            if self.workload is not None:
                workload, self.workload = self.workload, None
                workload.close()

    def fit_done_line(self, steps: int, peak_rss_gb: float) -> str:
        """The fit's last console line (what was trained, the trainer's peak memory, a replacement still starting)."""
        sup = getattr(self.runtime, "supervisor", None)
        starting = f"; replacement of {', '.join(sup.starting)} still starting, stopped" if sup and sup.starting else ""
        return (
            f"[lhr] fit done: {steps} steps, {self.samples_consumed} samples trained, trainer peak RSS "
            f"{peak_rss_gb:.2f} GB{starting}"
        )

    # --------------------------------------------------------------------------------------------- health

    def supervise(self, *, probe: bool) -> None:
        """Replace failed replicas (rank 0); with none left and none starting, save a checkpoint and stop."""
        rt, fit = self.runtime, self._fit
        assert fit is not None
        try:
            rt.supervise(fit.weights, self.param_version, probe=probe)
        except ReplicaFailureError:
            fit.save_checkpoint("replica-failure")
            raise
        if rt.colocated_fallback and not self._fallback_warned:
            self._fallback_warned = True
            fit.warn(
                "[lhr] every standalone replica is gone: generating on the hybrid replicas at every step (colocated) "
                "until a replacement joins"
            )

    # --------------------------------------------------------------------------------------------- per step

    def before_step(self) -> None:
        """A cycle's first step (rank 0): the controller's deactivation decision, its wait and its switch."""
        assert self.controller is not None
        t_wait = self.clock()
        wait = {"s": 0.0}

        def wait_for_samples(n: int) -> None:
            rt = self.runtime
            if rt.colocated_fallback:  # nothing generates once they sleep: wait for the cycle's batches
                a = self.async_training
                n = max(n, min(a.max_required_samples, a.required_samples * a.trigger_parameter_sync_step))
            t0, put0 = self.clock(), rt.samples_put()
            self.wait_queue(n)
            wait["s"] = self.clock() - t0
            self.ledger.add_deactivate_wait(wait["s"], rt.samples_put() - put0)
            self.call_log.append("deactivate_wait_samples")

        self.call_log.append("should_deactivate")
        res = self.controller.before_step(self.cycles_done + 1, self.context(), wait_for_samples)
        self.ledger.mark_deactivation(res.deactivated)
        if not res.deactivated:
            return
        self.call_log.append("deactivate")
        self._record_switch("deactivate", res.deactivate_duration_s)
        log.debug(
            "cycle %d: hybrid replicas deactivated after waiting %.2fs for %d samples (switch %.3fs)",
            self.cycles_done + 1,
            wait["s"],
            res.wait_samples,
            res.deactivate_duration_s,
        )
        rt = self.runtime
        rt.trace_phase("waiting", t_wait, t_wait + wait["s"], hybrid=True)
        t_sw = self.clock() - res.deactivate_duration_s
        drain = getattr(getattr(rt, "pool", None), "last_drain", None)  # the abort step's drained / aborted counts
        args = {f"drain.{k}": v for k, v in drain.to_dict().items()} if isinstance(drain, DrainReport) else {}
        rt.trace_phase("switching", t_sw, t_sw + res.deactivate_duration_s, op="deactivate", **args)

    def wait_queue(self, n: int) -> None:
        """Wait until the queue holds ``n`` samples, checking health, interruption and the deadline meanwhile."""
        rt, fit = self.runtime, self._fit
        assert fit is not None
        deadline = self.clock() + self.async_training.wait_timeout_s
        probed = self.clock()
        lent = False
        try:
            while not rt.wait_for_samples(n, timeout=1.0):
                rt.check_health()
                fit.check_interrupted()  # Lightning checks only between steps; this wait can be long
                probe = self.clock() - probed >= HEALTH_PROBE_EVERY_S
                if probe:
                    probed = self.clock()
                self.supervise(probe=probe)
                if not lent and self._must_lend_mid_cycle():
                    lent = self._lend_mid_cycle()
                if self.clock() > deadline:
                    raise TimeoutError(
                        f"waited {self.async_training.wait_timeout_s:.0f}s for {n} samples, the queue holds "
                        f"{rt.queue_size()}: the rollout replicas produce too slowly or have stalled (raise "
                        f"async_training.wait_timeout_s or check replica logs under {self.run_dir})"
                    )
        finally:
            if lent:  # back to sleep, the training state back, before the step goes on
                assert self.controller is not None
                self._record_switch("deactivate", self.controller.deactivate(self.cycles_done))
                fit.onload()

    def _must_lend_mid_cycle(self) -> bool:
        """Colocated fallback in the middle of a cycle: no standalone replica is left and the hybrid ones sleep, so
        nothing generates until the next sync, which needs these samples first."""
        controller = self.controller
        return bool(self.runtime.colocated_fallback and controller is not None and not controller.is_hybrid_active)

    def _lend_mid_cycle(self) -> bool:
        """Lend the hybrid replicas now, in a boundary of their own (one rank only: the others wait in a collective
        of the step and cannot take part; with several ranks the cycle waits for a standalone replacement)."""
        assert self.controller is not None and self._fit is not None
        if self._fit.world_size > 1:
            return False
        ranks = self._fit.protocol
        ranks.open()
        try:
            self._record_switch("activate", self.controller.activate(self.cycles_done))
        finally:
            ranks.close()
        log.info("cycle %d: no standalone replica left; the hybrid replicas generate mid-cycle", self.cycles_done + 1)
        return True

    def next_batch(self) -> list[Sample]:
        """Source of the module's batches (global rank 0): ``required_samples`` samples from the queue."""
        rt = self.runtime
        n = self.async_training.required_samples
        t0 = self.clock()
        queue_before = rt.queue_size()
        self.wait_queue(n)
        samples = rt.take_samples(n, timeout=self.async_training.wait_timeout_s)
        rt.probe_decode_progress()  # training starts: the standalone replicas' tokens so far (returns at once)
        waited = self.clock() - t0
        self.step.fetch_s = waited
        hybrid_on = bool(self.controller is not None and self.controller.is_hybrid_active)
        rt.trace_phase("waiting", t0, t0 + waited, hybrid=hybrid_on)
        self.ledger.add_batch(waited, queue_before, len(samples), sum(s.response_length for s in samples))
        self.samples_consumed += len(samples)
        self.step_samples = len(samples)
        if self.rollout_log is not None:
            self.rollout_log.keep(samples)
        return samples

    def end_training(self) -> None:
        """The step's compute is done (rank 0): its seconds measured, the replicas' tokens probed, the span traced."""
        step = self.step
        self.ledger.add_compute(max(0.0, self.clock() - step.start - step.fetch_s))
        self.runtime.probe_decode_progress()  # training ends (returns at once)
        self.runtime.trace_phase("training", step.start + step.fetch_s, self.clock())

    def end_step(self) -> None:
        """The step's wall times (rank 0; ``docs/metrics.md``): at a cycle's first step, allocated from asking for the
        batch and the step from its hook (the deactivation included); later steps from the previous step's end."""
        allocated_s, step_s = self.step.end()
        self.ledger.end_step(allocated_s=allocated_s, step_s=step_s)

    def end_cycle(self) -> CycleClose:
        """A cycle's last step, the weights gathered (rank 0): the standalone sync (or ``overlap_sync``'s prepared
        one), the activation decision, and the step's end, in verl's order."""
        fit = self._fit
        assert fit is not None
        self.param_version += 1
        rt, ranks = self.runtime, fit.protocol
        self.supervise(probe=True)  # a replica that stopped answering is replaced, not waited for by the push
        ranks.open()  # this cycle end's boundary
        prepared = self.async_training.overlap_sync and self.overlap.will_activate(
            self.controller, rt, self.cycles_done + 1, lambda: self.context(rt.peek_role_window())
        )
        if prepared:
            sync_s = self.overlap.prepare(rt, ranks, fit.weights, self.param_version, self.cycles_done + 1)
        else:
            t_sync = self.clock()
            sync_s = rt.push_standalone(fit.weights, self.param_version)
            rt.trace_phase("weight_sync", t_sync, self.clock(), target="standalone")
        self.call_log.append("sync_standalone")
        stats = rt.new_param_version(self.param_version)
        filtering = getattr(stats, "filtering", None)
        self.accepted_token_share = filtering.accepted_token_share if filtering is not None else 1.0
        self.cycles_done += 1
        self.supervise(probe=False)  # one that died under the push; replacements up by now join
        end = self.after_sync(global_steps=self.cycles_done, prepared=prepared)
        ranks.close()
        self.end_step()
        return CycleClose(stats, sync_s, end)

    def take_back_for_validation(self) -> None:
        """In-fit validation runs on the trainer's devices (rank 0): hybrid replicas lent now go to sleep first (their
        requests aborted and continued elsewhere, as at a deactivation); :meth:`lend_after_validation` lends them
        again."""
        controller = self.controller
        self._lent_before_validation = None
        if controller is None or self.runtime is None or not controller.is_hybrid_active:
            return  # not fitting (a sanity check, lhr validate, a fit already stopped) or nothing lent
        self._lent_before_validation = controller.active_replicas  # built with num_hybrid_replicas: their indices
        t0 = self.clock()
        duration = controller.deactivate(self.cycles_done)
        self._record_switch("deactivate", duration)
        self.runtime.trace_phase("switching", t0, self.clock(), op="deactivate", reason="validation")
        self.call_log.append("deactivate_for_validation")

    def lend_after_validation(self, fit: FitPort, rank_zero: bool) -> None:
        """After in-fit validation (every rank): the replicas :meth:`take_back_for_validation` put to sleep are lent
        again, inside a boundary of their own (every rank offloads first)."""
        if not rank_zero:
            fit.protocol.follow()
            return
        lent, self._lent_before_validation = self._lent_before_validation, None
        ranks = fit.protocol
        ranks.open()
        if lent and self.controller is not None:
            t0 = self.clock()
            duration = self.controller.activate(self.cycles_done, replicas=lent)
            self._record_switch("activate", duration)
            self.runtime.trace_phase("switching", t0, self.clock(), op="activate", reason="validation")
            self.call_log.append("activate_after_validation")
        ranks.close()

    def follow_cycle(self, fit: FitPort) -> None:
        """A cycle's last step on a rank other than 0: the version moves on, the rank follows rank 0's boundary."""
        self.param_version += 1
        self.cycles_done += 1
        fit.protocol.follow()

    def after_sync(self, global_steps: int, prepared: bool = False) -> Any:
        """After the standalone sync (rank 0): the controller's activation decision and what follows.

        Args:
            global_steps: Cycles done (0: the start decision).
            prepared: ``overlap_sync`` already offloaded (the boundary's ``"offload"`` went out) and woke + synced
                the hybrid replicas; if the controller does not activate them now, they go back to sleep.
        """
        assert self.controller is not None
        rt = self.runtime
        window = rt.take_role_window()
        # the start decision: nothing measured yet; its production (and its activation's) belongs to no cycle
        ctx = self.context(window if global_steps > 0 else None)
        self.call_log.append("should_activate_after_step")
        end = self.controller.after_sync(global_steps, ctx)
        if global_steps == 0:
            rt.take_role_window()
        if prepared:
            self.overlap.finish(self.controller, rt, end, self.cycles_done)
        if rt.colocated_fallback and not self.controller.is_hybrid_active:
            # no standalone replica left: the hybrid replicas are the only ones that can generate
            forced_s = self.controller.activate(global_steps)
            end = dataclasses.replace(
                end, activated=True, activate_duration_s=forced_s, active_replicas=self.controller.active_replica_count
            )
        if end.activated:  # activate, then (verl's order) rebalance: both end by now
            t_rebalance = self.clock() - end.rebalance_duration_s
            t_sw = t_rebalance - end.activate_duration_s
            rt.trace_phase("switching", t_sw, t_rebalance, op="activate")
            if end.rebalanced:  # its own op, which the planner's fit reads as switch.rebalance_s
                rt.trace_phase("switching", t_rebalance, self.clock(), op="rebalance_requests")
            self.call_log.append("activate")
            self._record_switch("activate", end.activate_duration_s)
            log.debug("cycle %d: hybrid replicas activated (%.3fs)", global_steps, end.activate_duration_s)
        if end.rebalanced:
            self.call_log.append("request_rebalance")
        synced = prepared and self.overlap.events[-1]["hybrid_error"] is None
        record = self.ledger.record_sync_decision if global_steps > 0 else self.ledger.record_start_decision
        record(self.controller.is_hybrid_active, synced)
        self.call_log.append("update_after_step")
        return end

    def context(self, window: Any = None) -> RateScheduleContext:
        """The decision context from the per-cycle core (rank 0): the run's counters and the cycle so far.

        Args:
            window: The cycle's production window (``RuntimeQueries.take_role_window()``), or None (not measured).
        """
        rt = self.runtime
        totals = Totals(
            total_generated_samples=self.generated_offset + rt.generated_samples(),
            expected_samples=self.samples_consumed,
            queue_size=rt.queue_size(),
        )
        production = None
        if window is not None:  # the tokens of dropped groups do not count: the policies see the accepted rate
            share = self.accepted_token_share
            accepted = {role: tokens * share for role, tokens in window.decoded_tokens.items()}
            production = ProductionByRole.from_roles(window.serving_s, accepted)
        return self.ledger.context(totals, production)

    def _record_switch(self, kind: str, duration_s: float) -> None:
        self.switch_events.append({"kind": kind, "cycle": self.cycles_done, "duration_s": duration_s})
        totals = self.switch_totals[kind]
        totals["count"] += 1
        totals["seconds"] += duration_s

    # ---------------------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The run's counters, the ledger, the policy, the controller and (rank 0) the rollouter's unfinished work."""
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "param_version": self.param_version,
            "cycles_done": self.cycles_done,
            "samples_consumed": self.samples_consumed,
            "hybrid_sync_skipped": self.hybrid_sync_skipped,
            "cycle_ledger": self.ledger.state_dict(),
            "switch_totals": {k: dict(v) for k, v in self.switch_totals.items()},
            "policy": self.policy.state_dict(),
        }
        if self.controller is not None:
            state["controller"] = self.controller.state_dict()
        if self.runtime is not None:
            state["generated_samples"] = self.generated_offset + self.runtime.generated_samples()
            # unfinished groups, buffered samples and the prompt stream's position, in one atomic step
            state["rollouter"] = self.runtime.rollouter_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The counters now; the controller's and the rollouter's state when the fit starts (:meth:`start_fit`)."""
        self.param_version = int(state_dict["param_version"])
        self.cycles_done = int(state_dict["cycles_done"])
        self.samples_consumed = int(state_dict["samples_consumed"])
        self.ledger.load_state_dict(
            state_dict.get("cycle_ledger", {"hybrid_sync_skipped_total": state_dict.get("hybrid_sync_skipped", 0)})
        )
        self.switch_totals = _switch_totals(state_dict)
        self.policy.load_state_dict(state_dict["policy"])
        self._pending_state = dict(state_dict)

    def _apply_loaded_state(self) -> None:
        state = self._pending_state or {}
        if self.controller is not None and "controller" in state:
            self.controller.load_state_dict(state["controller"])
        generated = int(state.get("generated_samples", self.samples_consumed))
        if "rollouter" in state:
            # the rollouter's counters continue; unfinished groups continue from their prefixes, the prompt
            # stream where it stopped (no prompt repeated or skipped)
            self.runtime.restore_rollouter(state["rollouter"])
            self.generated_offset = generated - self.runtime.generated_samples()
        elif "buffered_samples" in state:  # a checkpoint of an earlier version: buffered samples only
            self.runtime.restore_queue(state["buffered_samples"])
            self.generated_offset = generated
        assert self._fit is not None
        self._fit.info(
            f"[lhr] resumed at param version {self.param_version}, cycle {self.cycles_done}, "
            f"{self.runtime.queue_size()} buffered samples restored, ratio {self.policy.deactivate_ratio:.3f}"
        )

    def _restore_pool_state(self) -> None:
        """Fresh replicas start parked: bring the pool to the restored controller state without re-deciding.

        Runs inside the start boundary: a wake asks the rank protocol for the devices (every rank offloads).
        """
        c = self.controller
        assert c is not None
        if not c.is_hybrid_active:
            return
        pool: Any = self.runtime.pool
        lent = c.active_replicas
        # the checkpoint's lent subset (k of n), as the controller calls the pool; all: the no-argument calls
        subset = {} if lent is None or len(lent) >= (c.num_hybrid_replicas or 0) else {"replicas": lent}
        pool.wake_up_replicas(**subset)
        pool.sync_weights(**subset)
        pool.add_replicas(**subset)
        pool.resume_generation_replicas(**subset)


def _switch_totals(state: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The checkpoint's switch totals; a version-1 checkpoint's every switch event (``switch_events``) summed."""
    if "switch_totals" in state:
        saved = state["switch_totals"]
        return {k: {"count": int(saved[k]["count"]), "seconds": float(saved[k]["seconds"])} for k in _SWITCH_KINDS}
    totals: dict[str, dict[str, float]] = {k: {"count": 0, "seconds": 0.0} for k in _SWITCH_KINDS}
    for event in state.get("switch_events", []):
        if event.get("kind") in totals:
            totals[event["kind"]]["count"] += 1
            totals[event["kind"]]["seconds"] += float(event.get("duration_s", 0.0))
    return totals
