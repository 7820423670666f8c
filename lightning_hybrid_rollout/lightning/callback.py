"""HybridRolloutCallback: runs the rollout side with the fit and drives the scheduler at Lightning hook boundaries, in
the order of design/scheduling.md §1 (docs/callback.md); only global rank 0 owns Ray, the replicas and the
controller, every rank takes part in the weight gather, offload and batch broadcast.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

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
from lightning_hybrid_rollout.hub import resolve_model_path
from lightning_hybrid_rollout.lightning.cycle_report import CycleReport, peak_rss_bytes
from lightning_hybrid_rollout.lightning.expected_warnings import ExpectedWarnings
from lightning_hybrid_rollout.lightning.lora import check_adapter_sync, check_lora_targets, engine_lora_config
from lightning_hybrid_rollout.lightning.overlap import OverlapSync
from lightning_hybrid_rollout.lightning.placement import rank_node_ips
from lightning_hybrid_rollout.lightning.recent import RecentList
from lightning_hybrid_rollout.lightning.rollout_log import RolloutLog
from lightning_hybrid_rollout.lightning.trainer_side import StepTimes, TrainerSide
from lightning_hybrid_rollout.lightning.workload import (
    Workload,
    attach_batch_source,
    fit_episode_budget,
    load_workload,
)
from lightning_hybrid_rollout.models.model_path import take_model_path
from lightning_hybrid_rollout.models.run_model import ensure_run_model
from lightning_hybrid_rollout.redaction import redact_logger_hyperparams
from lightning_hybrid_rollout.rewards import RewardConfig
from lightning_hybrid_rollout.rollout.drain import DrainReport
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.schedule import (
    DynamicResourceController,
    RateScheduleContext,
    ReplicaPool,
    create_policy,
)
from lightning_hybrid_rollout.schedule.cycle import CycleLedger, ProductionByRole, RunShape, Totals
from lightning_hybrid_rollout.sources import DatasetConfig

log = logging.getLogger(__name__)

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


class HybridRolloutCallback(Callback):
    """Fully-async RL with hybrid rollout replicas on the trainer's devices.

    Starts Ray, the standalone and hybrid vLLM replicas, the rollouter and the message queue with the fit, feeds the
    module's ``training_step(self, dataloader_iter)`` from the queue, and drives the policy and the
    :class:`~lightning_hybrid_rollout.schedule.DynamicResourceController` in verl's per-step order.

    Args:
        rollout: Rollout side: model, replicas, sampling (see :class:`~lightning_hybrid_rollout.config.RolloutConfig`).
        async_training: The seed's ``async_training`` section (policy, ratio, staleness, sync cadence, ...).
        dataset: Where the prompts come from (:class:`~lightning_hybrid_rollout.sources.DatasetConfig`): a local
            ``.jsonl``/``.json``/``.parquet``/``.csv`` file (or a list of them, or a ``save_to_disk`` directory) with
            a ``prompt_column`` of strings or chat messages; every other column reaches the reward functions. Or a
            custom source as ``{"class_path": ..., "init_args": ...}``. ``None``: the toy ``task``'s prompts.
        task: Name of a built-in toy task (``"arithmetic"``, ``"reverse"``, ``"copy"``): prompts and its reward,
            used when ``dataset`` is not given.
        task_kwargs: Extra keyword arguments for the task's constructor.
        reward_funcs: Reward functions in TRL's convention ``fn(prompts, completions, completion_ids, **columns)
            -> list[float | None]``, called once per prompt group: ``"package.module:function"``,
            ``"path/to/file.py:function"``, a built-in (``"math_verify"``, ``"exact_match"``), or
            ``{"class_path": ..., "init_args": ...}``. Empty: the toy task's own reward.
        reward_weights: One weight per reward function (default 1.0 each); a sample's reward is the weighted sum
            of the values that are not ``None``.
        reward_workers: Threads (or processes) that run the reward functions, off the rollouter's event loop.
        reward_timeout_s: Longest one reward-function call on one group may take.
        reward_error: What a reward function that raises, times out, or returns NaN or the wrong number of values
            does: ``"fail"`` stops the run with one line naming the function and the prompt; ``"zero"`` scores
            those samples 0 and counts them (``train/reward_errors``).
        tools: Tools the model may call, by import path (``"my_tools.py:add"``, ``"pkg.module:search"``): typed
            functions with a Google-style docstring, sync or async (TRL's convention). Any tool or ``environment``
            makes every sample a multi-turn episode (docs/agentic.md).
        environment: An environment class or factory by import path, one instance per episode: TRL's convention
            (``reset(**row)``, public methods as tools, ``get_reward()``) or Gymnasium's (``reset(seed, options)``,
            ``step(text)``). With it ``dataset`` is optional (each prompt is the reset text) and ``reward_funcs``
            too (the environment's reward alone; with both, their sum).
        environment_kwargs: Keyword arguments of the environment's constructor (or factory).
        tool_parser: The registered tool-call parser reading the model's calls (``"hermes"``).
        max_turns: The most model turns of one episode.
        max_episode_tokens: The most tokens of one episode's trained sequence, prompt included. Left out: the
            engines' ``rollout.max_model_len`` (or 4096, which the engines then take, when that is left out too).
        tool_timeout_s: The most seconds one tool call or environment call may take; past it the model reads an
            error and the call is counted in ``rollout/tool_errors``.
        tool_workers: Threads running sync tools and environment calls, shared by every episode of the run (async
            tools need none); a slow sync tool waits for a free one, so size it to the tool calls in flight at once.
        log_rollouts: Write the first N samples trained on each cycle to ``<run dir>/rollouts/cycle_<k>.jsonl``
            (messages, token ids, loss mask, log-probs, weight versions, reward); 0: none.
        build_model: If ``rollout.model_path`` holds no model yet, build a tiny local one there (CPU quickstart):
            ``True`` for the defaults, or a :class:`~lightning_hybrid_rollout.config.TinyModelConfig` (its size,
            seed and ``format_warmup_steps``). The trainer's wait limit is ``async_training.wait_timeout_s``.
        summary_every_n_cycles: Print one summary line (reward, samples/s, queue, hybrid state) after the first
            cycle and every N cycles (0: never); the per-cycle detail is in the trace, ``metrics.csv`` and the
            DEBUG log.
        trace: Write a Chrome trace-event file ``trace.json`` of replica states and trainer phases to the run dir.
        run_dir: Where Ray temp files, the trace and replica logs go (default: ``trainer.default_root_dir``).

    Example::

        trainer = Trainer(max_steps=40, callbacks=[HybridRolloutCallback(RolloutConfig(model_path="tiny"))])
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        async_training: AsyncTrainingConfig | None = None,
        dataset: DatasetConfig | dict[str, Any] | None = None,
        task: str = "arithmetic",
        task_kwargs: dict[str, Any] | None = None,
        reward_funcs: list[str | dict[str, Any]] | None = None,
        reward_weights: list[float] | None = None,
        reward_workers: int = 1,
        reward_timeout_s: float = 60.0,
        reward_error: Literal["fail", "zero"] = "fail",
        tools: list[str] | None = None,
        environment: str | None = None,
        environment_kwargs: dict[str, Any] | None = None,
        tool_parser: str = "hermes",
        max_turns: int = 8,
        max_episode_tokens: int | None = None,
        tool_timeout_s: float = 30.0,
        tool_workers: int = 16,
        log_rollouts: int = 0,
        build_model: bool | TinyModelConfig = False,
        summary_every_n_cycles: int = 10,
        trace: bool = True,
        run_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.rollout = rollout
        self.async_training = async_training if async_training is not None else AsyncTrainingConfig()
        validate_run_config(self.async_training, self.rollout)
        if not self.rollout.model_path:
            raise ConfigError(["rollout.model_path must be set: the directory of a Hugging Face causal LM"])
        self.dataset = (
            DatasetConfig(**dataset) if isinstance(dataset, dict) and "class_path" not in dataset else dataset
        )
        self.task_name = task
        self.task_kwargs = dict(task_kwargs or {})
        #: The reward functions' settings (loaded, with the data set's columns known, before anything starts).
        self.rewards = RewardConfig(
            reward_funcs=list(reward_funcs or []),
            reward_weights=None if reward_weights is None else list(reward_weights),
            reward_workers=reward_workers,
            reward_timeout_s=reward_timeout_s,
            reward_error=reward_error,
        )
        #: The multi-turn keys (tools and environment loaded, with the tokenizer, before anything starts).
        self.agentic = AgenticConfig(
            tools=tuple(tools or ()),
            environment=environment,
            environment_kwargs=dict(environment_kwargs or {}),
            tool_parser=tool_parser,
            max_turns=max_turns,
            max_episode_tokens=max_episode_tokens,
            tool_timeout_s=tool_timeout_s,
            tool_workers=tool_workers,
            log_rollouts=log_rollouts,
        )
        self._rollout_log: RolloutLog | None = None
        self._workload: Workload | None = None
        self._validation: Any = None
        #: The tiny model to build at ``rollout.model_path`` if it holds none (None: never build).
        self.build_model = TinyModelConfig.resolve(build_model)
        self.trace = trace
        self.run_dir = run_dir
        if summary_every_n_cycles < 0:
            raise ConfigError([f"summary_every_n_cycles must be >= 0 (0: never), got {summary_every_n_cycles}"])
        self.summary_every_n_cycles = summary_every_n_cycles
        #: The fit's per-step and per-cycle reporting (built at ``on_train_start``, with the fit's clock).
        self._report: CycleReport | None = None

        a = self.async_training
        self.policy = create_policy(
            a.dynamic_schedule_policy,
            deactivate_ratio=a.dynamic_schedule_deactivate_ratio,
            only_hybrid=a.only_hybrid,
            **a.dynamic_schedule_policy_kwargs,
        )
        # rank-0 runtime state
        self._runtime: Any = None
        self._controller: DynamicResourceController | None = None
        self._tokenizer: Any = None
        r = self.rollout
        per_replica = r.gpus_per_replica if r.gpus_per_replica > 0 else r.cpus_per_replica
        #: The per-cycle core (shared with the simulator): every context field and cycle metric comes from it.
        self._ledger = CycleLedger(
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
        self._pending_state: dict[str, Any] | None = None
        self._trainer: Trainer | None = None
        self._fallback_warned = False
        # checkpointed counters
        self.param_version = 0
        self.cycles_done = 0
        self.samples_consumed = 0
        self.generated_offset = 0
        #: Share of the last closed cycle's decoded tokens the group filter let into the queue (1.0 without a
        #: filter): the per-role production the policies see is scaled by it, so their rates are accepted rates.
        self._accepted_token_share = 1.0
        #: Samples of the current step's batch (``train/samples``).
        self._step_samples = 0
        #: Every switch since the run began, by kind: ``{"activate": {"count": n, "seconds": s}, "deactivate": ...}``
        #: (checkpointed; the console line's activations so far).
        self.switch_totals: dict[str, dict[str, float]] = {k: {"count": 0, "seconds": 0.0} for k in _SWITCH_KINDS}
        #: The newest switches, ``{"kind", "cycle", "duration_s"}`` each (not checkpointed).
        self.switch_events: list[dict[str, Any]] = RecentList(SWITCH_HISTORY_SIZE)
        #: The newest scheduler and trainer calls by name, oldest first (not checkpointed; tests read the order).
        self.call_log: list[str] = RecentList(CALL_LOG_SIZE)
        #: ``overlap_sync``'s ask-first, prepare-under-the-sync and undo (rank 0; :mod:`.overlap`).
        self._overlap = OverlapSync(
            clock=lambda: self._clock(), call_log=self.call_log, keep_events=SWITCH_HISTORY_SIZE
        )
        #: Offload/onload, the weight gather, the rank protocol (every rank); the hybrid pool's ``TrainerLink``.
        self._trainer_side = TrainerSide(self.call_log, weight_version=lambda: self.param_version)
        #: The adapter's engine fields when syncs send the LoRA adapter alone (set in setup), else None.
        self._engine_lora: dict[str, Any] | None = None
        self.last_cycle_metrics: dict[str, float] = {}
        #: The clock every cycle measurement is read from (``time.monotonic``; a test may give a virtual one).
        self._clock: Callable[[], float] = time.monotonic
        #: The current step's wall times (:class:`~.trainer_side.StepTimes`).
        self._step = StepTimes(clock=lambda: self._clock())
        #: Lightning's expected warnings, hidden from ``setup`` to the end of the fit (never at import).
        self._expected_warnings = ExpectedWarnings()

    # --------------------------------------------------------------------------------------------- properties

    @property
    def controller(self) -> DynamicResourceController | None:
        """The controller (global rank 0 only; None elsewhere and before fit)."""
        return self._controller

    @property
    def runtime(self) -> Any:
        """The rollout runtime (global rank 0 only)."""
        return self._runtime

    @property
    def overlap_events(self) -> list[dict[str, Any]]:
        """One entry per ``overlap_sync`` preparation: timings, seconds saved, whether the controller activated."""
        return self._overlap.events

    @property
    def hybrid_sync_skipped(self) -> int:
        """Sync decisions that left the hybrid replicas without the new weights (the start decision included)."""
        return self._ledger.hybrid_sync_skipped_total

    @property
    def state_key(self) -> str:
        return "HybridRolloutCallback"

    def _is_sync_boundary(self, global_step: int) -> bool:
        """Every ``trigger_parameter_sync_step`` steps, and after the first step with ``early_first_sync``."""
        a = self.async_training
        return global_step % a.trigger_parameter_sync_step == 0 or (a.early_first_sync and global_step == 1)

    def _is_cycle_start(self, trainer: Trainer) -> bool:
        return self._is_sync_boundary(trainer.global_step)

    def _is_cycle_end(self, trainer: Trainer) -> bool:
        return self._is_sync_boundary(trainer.global_step)

    # ----------------------------------------------------------------------------------------------- lifecycle

    def _save_run_config(self, run_dir: Path) -> None:
        """Write ``RUN_CONFIG_FILE`` (the ``rollout`` and ``async_training`` settings, secrets redacted) into the run
        dir, beside ``trace.json``: what ``lhr simulate --from-run`` reads back when no Lightning CLI ``config.yaml``
        is there (a ``Trainer`` built in Python)."""
        import json

        import yaml

        from lightning_hybrid_rollout.redaction import redact

        doc = {"rollout": self.rollout.to_dict(), "async_training": self.async_training.to_dict()}
        plain = json.loads(json.dumps(redact(doc), default=str))  # tuples to lists, anything else to text
        (run_dir / RUN_CONFIG_FILE).write_text(yaml.safe_dump(plain, sort_keys=False), encoding="utf-8")

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._expected_warnings.hide()  # until _shutdown: the fit's data and loop set-up raise them
        # a hub id resolves once on this rank's node (the replicas resolve it on theirs): the directory below is
        # what the module, the tokenizer and the checks load
        model_dir = self.rollout.model_path
        if self.build_model is None and stage in ("fit", "validate"):
            model_dir = resolve_model_path(model_dir, self.rollout.model_revision)
        take_model_path(
            pl_module,
            model_dir,
            build_model=self.build_model is not None,
            run_dir=self.run_dir or trainer.default_root_dir,
            check_disk=stage == "fit",
        )
        redact_logger_hyperparams(trainer.loggers)
        if stage not in ("fit", "validate"):
            return
        if stage == "fit":
            self._trainer = trainer
            run_dir = Path(self.run_dir or trainer.default_root_dir)
            self._run_dir = run_dir
            if trainer.is_global_zero:
                run_dir.mkdir(parents=True, exist_ok=True)
                from lightning_hybrid_rollout.tasks import get_task

                ensure_run_model(
                    _on_node(self.rollout, model_dir),
                    self.build_model,
                    lambda: get_task(self.task_name, **self.task_kwargs),
                )
            trainer.strategy.barrier("lhr_model_ready")
            lora_config = getattr(pl_module, "lora_config", None)
            if lora_config is not None:  # the adapter's target_modules against the model, before Ray (every rank)
                check_lora_targets(lora_config, model_dir)
                if self.rollout.lora_sync == "adapter":  # syncs send the adapter alone to LoRA engines
                    check_adapter_sync(lora_config, self.rollout.tensor_parallel_size)
                    self._trainer_side.adapter_only = True
                    self._engine_lora = engine_lora_config(lora_config)
        # an episode's budget and the engines' context: the one left out is derived from the other
        self.agentic, self.rollout = fit_episode_budget(self.agentic, self.rollout)
        fit_length = getattr(pl_module, "fit_sequence_length", None)
        if callable(fit_length):  # the module's token budget must hold the longest sequence (GRPOModule)
            fit_length(self.rollout.engine_max_model_len())
        # the data set, the prompts' lengths and the reward functions are checked before Ray starts (every rank:
        # each one answers its share of the held-out prompts)
        self._workload = load_workload(
            dataset=self.dataset,
            task=self.task_name,
            task_kwargs=self.task_kwargs,
            rewards=self.rewards,
            rollout=_on_node(self.rollout, model_dir),
            agentic=self.agentic,
        )
        self._tokenizer = self._workload.tokenizer
        from lightning_hybrid_rollout.lightning.attach_validation import attach_validation

        datamodule = getattr(trainer, "datamodule", None)
        self._validation = attach_validation(
            self._workload, datamodule, max_new_tokens=self.rollout.response_length, during_fit=stage == "fit"
        )
        if stage != "fit":
            return
        attach_batch_source(datamodule, self._next_batch, self._tokenizer.pad_token_id)
        node_ips = rank_node_ips(trainer.world_size)  # collective: hybrid replica i goes to rank i's node
        if trainer.is_global_zero:
            rank_zero_info(f"[lhr] policy {self.async_training.dynamic_schedule_policy}: {self._describe_policy()}")
            self._start_runtime(trainer, node_ips)

    def _describe_policy(self) -> str:
        """``Name(deactivate_ratio=..., only_hybrid=..., <each configured knob>=<the policy's value>)``."""
        names = ("deactivate_ratio", "only_hybrid", *self.async_training.dynamic_schedule_policy_kwargs)
        values = ", ".join(f"{k}={getattr(self.policy, k, '?')!r}" for k in names)
        return f"{type(self.policy).__name__}({values})"

    def _start_runtime(self, trainer: Trainer, node_ips: list[str] | None = None) -> None:
        from lightning_hybrid_rollout.lightning.runtime import RolloutRuntime

        self._save_run_config(self._run_dir)  # after every check: a refused run writes nothing
        self._runtime = RolloutRuntime(
            rollout=self.rollout,
            async_training=self.async_training,
            workload=self._workload,
            run_dir=self._run_dir,
            trace=self.trace,
            trainer=self._trainer_side,
        )
        self._runtime.hybrid_node_ips = node_ips
        self._runtime.lora = self._engine_lora
        self._runtime.start()
        self._controller = self._build_controller(self._runtime.pool)

    def _build_controller(self, pool: ReplicaPool) -> DynamicResourceController:
        """The controller over ``pool``, on the callback's clock, keeping the newest ``SWITCH_HISTORY_SIZE``
        switches."""
        return DynamicResourceController(
            pool,
            self.policy,
            clock=self._clock,
            enable_rebalance=self.async_training.dynamic_schedule_enable_rebalance,
            has_hybrid=self.rollout.hybrid_replicas > 0,
            history_size=SWITCH_HISTORY_SIZE,
        )

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.agentic.log_rollouts:
            self._rollout_log = RolloutLog(self._run_dir, self.agentic.log_rollouts)
        self._report = CycleReport(
            ledger=self._ledger,
            runtime=self._runtime,
            controller=self._controller,
            policy=self.policy,
            workload=self._workload,
            clock=lambda: self._clock(),
            summary_every_n_cycles=self.summary_every_n_cycles,
            has_hybrid=self.rollout.hybrid_replicas > 0,
            overlap=self._overlap if self.async_training.overlap_sync else None,
            rollout_log=self._rollout_log,
        )
        self._ledger.shape = dataclasses.replace(self._ledger.shape, hybrid_devices=trainer.world_size)
        ranks = self._trainer_side.start_fit(trainer)
        resumed = self._pending_state is not None
        pl_module.param_version = self.param_version
        # Engines loaded the model from disk (version 0). On resume, push the restored weights first.
        if resumed:
            self._gather_weights(trainer)
        if trainer.is_global_zero:
            if resumed:
                self._apply_loaded_state()
                self._runtime.push_standalone(self._trainer_side.weights, self.param_version)
            self._runtime.set_weight_version(self.param_version)
            self._runtime.start_generation()
            ranks.open()  # the start decision's (or the restore's) boundary
            if resumed:
                self._restore_pool_state()
            else:
                # Initial activation decision (step 0: update_after_step is a no-op there).
                self._after_sync(trainer, global_steps=0)
            ranks.close()
            self._runtime.pool.take_cycle_sync_s()  # a start-up push belongs to no cycle's weight_sync_time_s
            self._runtime.take_cycle_sync_bytes()  # nor to its weight_sync_bytes
        else:
            ranks.follow()
        self._pending_state = None

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sup = getattr(self._runtime, "supervisor", None)
        starting = f"; replacement of {', '.join(sup.starting)} still starting, stopped" if sup and sup.starting else ""
        rank_zero_info(
            f"[lhr] fit done: {trainer.global_step} steps, {self.samples_consumed} samples trained, trainer peak RSS "
            f"{peak_rss_bytes() / 1e9:.2f} GB{starting}"
        )
        self._shutdown()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # a SIGTERM shows as Lightning's SIGTERMException, or as the SystemExit of the handler Ray's driver installs
        interrupted = isinstance(exception, KeyboardInterrupt | SIGTERMException) or trainer.received_sigterm
        if interrupted and self._runtime is not None:
            self._save_checkpoint(trainer, "interrupted")
        self._shutdown()

    def _save_checkpoint(self, trainer: Trainer, reason: str) -> None:
        """A checkpoint now, when the fit checkpoints (a ``ModelCheckpoint``), next to its others; the rollouter's
        unfinished groups and buffered samples go in it like at any checkpoint, so a resume loses nothing."""
        ckpt = trainer.checkpoint_callback
        if ckpt is None or trainer.world_size > 1:  # several ranks: they are not all here to save together
            if ckpt is not None:
                log.warning(
                    "[lhr] %s: no checkpoint saved (%d ranks); resume from the last one", reason, trainer.world_size
                )
            return
        dirpath = getattr(ckpt, "dirpath", None) or str(Path(trainer.default_root_dir) / "checkpoints")
        path = Path(dirpath) / f"{reason}-step={trainer.global_step}.ckpt"
        try:
            trainer.save_checkpoint(path)
        except Exception as err:  # the fit is ending anyway: say so, do not hide the original error
            log.error("[lhr] %s: saving %s failed: %r", reason, path, err)
            return
        rank_zero_info(f"[lhr] {reason}: checkpoint saved to {path} (resume with ckpt_path)")

    def _supervise(self, *, probe: bool) -> None:
        """Replace failed replicas (rank 0); with none left and none starting, save a checkpoint and stop."""
        rt = self._runtime
        try:
            rt.supervise(self._trainer_side.weights, self.param_version, probe=probe)
        except ReplicaFailureError:
            if self._trainer is not None:
                self._save_checkpoint(self._trainer, "replica-failure")
            raise
        if rt.colocated_fallback and not self._fallback_warned:
            self._fallback_warned = True
            rank_zero_warn(
                "[lhr] every standalone replica is gone: generating on the hybrid replicas at every step (colocated) "
                "until a replacement joins"
            )

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        self._expected_warnings.show()
        self._trainer_side.weights = None
        try:
            if self._runtime is not None:
                runtime, self._runtime = self._runtime, None
                runtime.stop()
        finally:
            if self._validation is not None:
                validation, self._validation = self._validation, None
                validation.close()
            if self._workload is not None:
                workload, self._workload = self._workload, None
                workload.close()

    # --------------------------------------------------------------------------------------------- per step

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        pl_module.param_version = self.param_version
        cycle_start = self._is_cycle_start(trainer)
        self._step.begin(cycle_start)
        if cycle_start:
            if trainer.is_global_zero:
                self._before_step(trainer)
            trainer.strategy.barrier("lhr_deactivated")
            self._trainer_side.onload(trainer)
        self._step.start_training()

    def _before_step(self, trainer: Trainer) -> None:
        assert self._controller is not None
        t_wait = self._clock()
        wait = {"s": 0.0}

        def wait_for_samples(n: int) -> None:
            rt = self._runtime
            if rt.colocated_fallback:  # nothing generates once they sleep: wait for the cycle's batches
                a = self.async_training
                n = max(n, min(a.max_required_samples, a.required_samples * a.trigger_parameter_sync_step))
            t0, put0 = self._clock(), rt.samples_put()
            self._wait_queue(n)
            wait["s"] = self._clock() - t0
            self._ledger.add_deactivate_wait(wait["s"], rt.samples_put() - put0)
            self.call_log.append("deactivate_wait_samples")

        self.call_log.append("should_deactivate")
        res = self._controller.before_step(self.cycles_done + 1, self._context(), wait_for_samples)
        self._ledger.mark_deactivation(res.deactivated)
        if res.deactivated:
            self.call_log.append("deactivate")
            self._record_switch("deactivate", res.deactivate_duration_s)
            log.debug(
                "cycle %d: hybrid replicas deactivated after waiting %.2fs for %d samples (switch %.3fs)",
                self.cycles_done + 1,
                wait["s"],
                res.wait_samples,
                res.deactivate_duration_s,
            )
            rt = self._runtime
            rt.trace_phase("waiting", t_wait, t_wait + wait["s"], hybrid=True)
            t_sw = self._clock() - res.deactivate_duration_s
            drain = getattr(getattr(rt, "pool", None), "last_drain", None)  # the abort step's drained / aborted counts
            args = {f"drain.{k}": v for k, v in drain.to_dict().items()} if isinstance(drain, DrainReport) else {}
            rt.trace_phase("switching", t_sw, t_sw + res.deactivate_duration_s, op="deactivate", **args)

    def _wait_queue(self, n: int) -> None:
        rt = self._runtime
        deadline = self._clock() + self.async_training.wait_timeout_s
        probed = self._clock()
        lent = False
        try:
            while not rt.wait_for_samples(n, timeout=1.0):
                rt.check_health()
                trainer = self._trainer
                if trainer is not None and trainer.received_sigterm:
                    raise SIGTERMException()  # Lightning checks only between steps; this wait can be long
                probe = self._clock() - probed >= HEALTH_PROBE_EVERY_S
                if probe:
                    probed = self._clock()
                self._supervise(probe=probe)
                if not lent and self._must_lend_mid_cycle():
                    lent = self._lend_mid_cycle()
                if self._clock() > deadline:
                    raise TimeoutError(
                        f"waited {self.async_training.wait_timeout_s:.0f}s for {n} samples, the queue holds "
                        f"{rt.queue_size()}: the rollout replicas produce too slowly or have stalled (raise "
                        f"async_training.wait_timeout_s or check replica logs under {self._run_dir})"
                    )
        finally:
            if lent:  # back to sleep, the training state back, before the step goes on
                assert self._controller is not None and self._trainer is not None
                self._record_switch("deactivate", self._controller.deactivate(self.cycles_done))
                self._trainer_side.onload(self._trainer)

    def _must_lend_mid_cycle(self) -> bool:
        """Colocated fallback in the middle of a cycle: no standalone replica is left and the hybrid ones sleep, so
        nothing generates until the next sync, which needs these samples first."""
        controller, trainer = self._controller, self._trainer
        return bool(
            self._runtime.colocated_fallback
            and controller is not None
            and not controller.is_hybrid_active
            and trainer is not None
        )

    def _lend_mid_cycle(self) -> bool:
        """Lend the hybrid replicas now, in a boundary of their own (one rank only: the others wait in a collective
        of the step and cannot take part; with several ranks the cycle waits for a standalone replacement)."""
        assert self._controller is not None and self._trainer is not None
        if self._trainer.world_size > 1:
            return False
        ranks = self._trainer_side.protocol
        ranks.open()
        try:
            self._record_switch("activate", self._controller.activate(self.cycles_done))
        finally:
            ranks.close()
        log.info("cycle %d: no standalone replica left; the hybrid replicas generate mid-cycle", self.cycles_done + 1)
        return True

    def _next_batch(self) -> list[Sample]:
        """Source of the module's batches (global rank 0): ``required_samples`` samples from the queue."""
        rt = self._runtime
        n = self.async_training.required_samples
        t0 = self._clock()
        queue_before = rt.queue_size()
        self._wait_queue(n)
        samples = rt.take_samples(n, timeout=self.async_training.wait_timeout_s)
        rt.probe_decode_progress()  # training starts: the standalone replicas' tokens so far (returns at once)
        waited = self._clock() - t0
        self._step.fetch_s = waited
        hybrid_on = bool(self._controller is not None and self._controller.is_hybrid_active)
        rt.trace_phase("waiting", t0, t0 + waited, hybrid=hybrid_on)
        self._ledger.add_batch(waited, queue_before, len(samples), sum(s.response_length for s in samples))
        self.samples_consumed += len(samples)
        self._step_samples = len(samples)
        if self._rollout_log is not None:
            self._rollout_log.keep(samples)
        return samples

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = self._step
        step_s = self._clock() - step.start
        if trainer.is_global_zero:
            self._ledger.add_compute(max(0.0, step_s - step.fetch_s))
            self._runtime.probe_decode_progress()  # training ends (returns at once)
            self._runtime.trace_phase("training", step.start + step.fetch_s, self._clock())
            assert self._report is not None
            self._report.log_step(pl_module, self.samples_consumed, self._step_samples)
        if not self._is_cycle_end(trainer):
            self._end_step(trainer)
            return
        # ---- weight sync to standalone (always), then the activation decision
        self._gather_weights(trainer)
        self.param_version += 1
        pl_module.param_version = self.param_version
        sync_s = 0.0
        ranks, weights = self._trainer_side.protocol, self._trainer_side.weights
        if trainer.is_global_zero:
            self._supervise(probe=True)  # a replica that stopped answering is replaced, not waited for by the push
            ranks.open()  # this cycle end's boundary
            prepared = self.async_training.overlap_sync and self._overlap.will_activate(
                self._controller,
                self._runtime,
                self.cycles_done + 1,
                lambda: self._context(self._runtime.peek_role_window()),
            )
            if prepared:
                sync_s = self._overlap.prepare(self._runtime, ranks, weights, self.param_version, self.cycles_done + 1)
            else:
                t_sync = self._clock()
                sync_s = self._runtime.push_standalone(weights, self.param_version)
                self._runtime.trace_phase("weight_sync", t_sync, self._clock(), target="standalone")
            self.call_log.append("sync_standalone")
            stats = self._runtime.new_param_version(self.param_version)
            filtering = getattr(stats, "filtering", None)
            self._accepted_token_share = filtering.accepted_token_share if filtering is not None else 1.0
            self.cycles_done += 1
            self._supervise(probe=False)  # one that died under the push; replacements up by now join
            end = self._after_sync(trainer, global_steps=self.cycles_done, prepared=prepared)
            ranks.close()
            self._end_step(trainer)
            self._emit_cycle(trainer, stats, sync_s, end)
        else:
            self.cycles_done += 1
            ranks.follow()

    def _end_step(self, trainer: Trainer) -> None:
        """The step's wall times (rank 0; ``docs/metrics.md``): at a cycle's first step, allocated from asking for the
        batch and the step from its hook (the deactivation included); later steps from the previous step's end."""
        if trainer.is_global_zero:
            allocated_s, step_s = self._step.end()
            self._ledger.end_step(allocated_s=allocated_s, step_s=step_s)

    def _after_sync(self, trainer: Trainer, global_steps: int, prepared: bool = False) -> Any:
        """After the standalone sync (rank 0): the controller's activation decision and what follows.

        Args:
            trainer: The trainer.
            global_steps: Cycles done (0: the start decision).
            prepared: ``overlap_sync`` already offloaded (the boundary's ``"offload"`` went out) and woke + synced
                the hybrid replicas; if the controller does not activate them now, they go back to sleep.
        """
        assert self._controller is not None
        window = self._runtime.take_role_window()
        # the start decision: nothing measured yet; its production (and its activation's) belongs to no cycle
        ctx = self._context(window if global_steps > 0 else None)
        self.call_log.append("should_activate_after_step")
        end = self._controller.after_sync(global_steps, ctx)
        if global_steps == 0:
            self._runtime.take_role_window()
        if prepared:
            self._overlap.finish(self._controller, self._runtime, end, self.cycles_done)
        if self._runtime.colocated_fallback and not self._controller.is_hybrid_active:
            # no standalone replica left: the hybrid replicas are the only ones that can generate
            forced_s = self._controller.activate(global_steps)
            end = dataclasses.replace(end, activated=True, activate_duration_s=forced_s)
        if end.activated:  # activate, then (verl's order) rebalance: both end by now
            t_rebalance = self._clock() - end.rebalance_duration_s
            t_sw = t_rebalance - end.activate_duration_s
            self._runtime.trace_phase("switching", t_sw, t_rebalance, op="activate")
            if end.rebalanced:  # its own op, which the planner's fit reads as switch.rebalance_s
                self._runtime.trace_phase("switching", t_rebalance, self._clock(), op="rebalance_requests")
            self.call_log.append("activate")
            self._record_switch("activate", end.activate_duration_s)
            log.debug("cycle %d: hybrid replicas activated (%.3fs)", global_steps, end.activate_duration_s)
        if end.rebalanced:
            self.call_log.append("request_rebalance")
        synced = prepared and self._overlap.events[-1]["hybrid_error"] is None
        record = self._ledger.record_sync_decision if global_steps > 0 else self._ledger.record_start_decision
        record(self._controller.is_hybrid_active, synced)
        self.call_log.append("update_after_step")
        return end

    def _gather_weights(self, trainer: Trainer) -> None:
        """The cycle's full weights on rank 0 (collective; ``benchmarks/cpu_miniature.py`` times it by this name)."""
        self._trainer_side.gather_weights(trainer)

    # ------------------------------------------------------------------------------------------------- context

    def _context(self, window: Any = None) -> RateScheduleContext:
        """The decision context from the per-cycle core (rank 0): the run's counters and the cycle so far.

        Args:
            window: The cycle's production window (``RuntimeQueries.take_role_window()``), or None (not measured).
        """
        rt = self._runtime
        totals = Totals(
            total_generated_samples=self.generated_offset + rt.generated_samples(),
            expected_samples=self.samples_consumed,
            queue_size=rt.queue_size(),
        )
        production = None
        if window is not None:  # the tokens of dropped groups do not count: the policies see the accepted rate
            share = self._accepted_token_share
            accepted = {role: tokens * share for role, tokens in window.decoded_tokens.items()}
            production = ProductionByRole.from_roles(window.serving_s, accepted)
        return self._ledger.context(totals, production)

    def _record_switch(self, kind: str, duration_s: float) -> None:
        self.switch_events.append({"kind": kind, "cycle": self.cycles_done, "duration_s": duration_s})
        totals = self.switch_totals[kind]
        totals["count"] += 1
        totals["seconds"] += duration_s

    # ------------------------------------------------------------------------------------------------- metrics

    def _emit_cycle(self, trainer: Trainer, stats: Any, sync_s: float, end: Any) -> None:
        """Measure the cycle's end, close the cycle and report it (rank 0; :class:`~.cycle_report.CycleReport`)."""
        report = self._report
        assert report is not None
        side = self._trainer_side
        measured = report.cycle_end(stats, sync_s, end, self.param_version, side.last_offload_s, side.last_onload_s)
        activations = int(self.switch_totals["activate"]["count"])
        self.last_cycle_metrics = report.emit(trainer, measured, self.cycles_done, self.samples_consumed, activations)

    # ---------------------------------------------------------------------------------------------- checkpoint

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": _STATE_VERSION,
            "param_version": self.param_version,
            "cycles_done": self.cycles_done,
            "samples_consumed": self.samples_consumed,
            "hybrid_sync_skipped": self.hybrid_sync_skipped,
            "cycle_ledger": self._ledger.state_dict(),
            "switch_totals": {k: dict(v) for k, v in self.switch_totals.items()},
            "policy": self.policy.state_dict(),
        }
        if self._controller is not None:
            state["controller"] = self._controller.state_dict()
        if self._runtime is not None:
            state["generated_samples"] = self.generated_offset + self._runtime.generated_samples()
            # unfinished groups, buffered samples and the prompt stream's position, in one atomic step
            state["rollouter"] = self._runtime.rollouter_state()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.param_version = int(state_dict["param_version"])
        self.cycles_done = int(state_dict["cycles_done"])
        self.samples_consumed = int(state_dict["samples_consumed"])
        self._ledger.load_state_dict(
            state_dict.get("cycle_ledger", {"hybrid_sync_skipped_total": state_dict.get("hybrid_sync_skipped", 0)})
        )
        self.switch_totals = _switch_totals(state_dict)
        self.policy.load_state_dict(state_dict["policy"])
        self._pending_state = dict(state_dict)

    def _apply_loaded_state(self) -> None:
        state = self._pending_state or {}
        if self._controller is not None and "controller" in state:
            self._controller.load_state_dict(state["controller"])
        generated = int(state.get("generated_samples", self.samples_consumed))
        if "rollouter" in state:
            # the rollouter's counters continue; unfinished groups continue from their prefixes, the prompt
            # stream where it stopped (no prompt repeated or skipped)
            self._runtime.restore_rollouter(state["rollouter"])
            self.generated_offset = generated - self._runtime.generated_samples()
        elif "buffered_samples" in state:  # a checkpoint of an earlier version: buffered samples only
            self._runtime.restore_queue(state["buffered_samples"])
            self.generated_offset = generated
        rank_zero_info(
            f"[lhr] resumed at param version {self.param_version}, cycle {self.cycles_done}, "
            f"{self._runtime.queue_size()} buffered samples restored, ratio {self.policy.deactivate_ratio:.3f}"
        )

    def _restore_pool_state(self) -> None:
        """Fresh replicas start parked: bring the pool to the restored controller state without re-deciding.

        Runs inside the start boundary: a wake asks the rank protocol for the devices (every rank offloads).
        """
        assert self._controller is not None
        if self._controller.is_hybrid_active:
            pool: ReplicaPool = self._runtime.pool
            pool.wake_up_replicas()
            pool.sync_weights()
            pool.add_replicas()
            pool.resume_generation_replicas()


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


def _on_node(rollout: RolloutConfig, model_dir: str) -> RolloutConfig:
    """``rollout`` with ``model_path`` the directory this node loads (a hub id's snapshot), for the local steps."""
    if model_dir == rollout.model_path:
        return rollout
    return dataclasses.replace(rollout, model_path=model_dir, model_revision=None)
