"""HybridRolloutCallback: runs the rollout side with the fit and drives the scheduler at Lightning hook boundaries, in
the order of design/scheduling.md §1 (docs/callback.md). Each hook hands off to the fit's
:class:`~lightning_hybrid_rollout.run.hybrid_run.HybridRun`; only global rank 0 owns Ray, the replicas and the
controller, every rank takes part in the weight gather, offload and batch broadcast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
from lightning_hybrid_rollout.config import AsyncTrainingConfig, ConfigError, RolloutConfig, TinyModelConfig
from lightning_hybrid_rollout.hub import resolve_model_path
from lightning_hybrid_rollout.lightning.cycle_report import CycleReport, peak_rss_bytes
from lightning_hybrid_rollout.lightning.expected_warnings import ExpectedWarnings
from lightning_hybrid_rollout.lightning.fit_port import LightningFit
from lightning_hybrid_rollout.lightning.trainer_side import TrainerSide
from lightning_hybrid_rollout.models.model_path import take_model_path
from lightning_hybrid_rollout.redaction import redact_logger_hyperparams
from lightning_hybrid_rollout.rewards import RewardConfig
from lightning_hybrid_rollout.run.flat_keys import fold_flat_keys
from lightning_hybrid_rollout.run.hybrid_run import CycleClose, HybridRun
from lightning_hybrid_rollout.run.placement import rank_node_ips
from lightning_hybrid_rollout.run.workload import attach_batch_source
from lightning_hybrid_rollout.sources import DatasetConfig
from lightning_hybrid_rollout.training.lora import check_lora_sync
from lightning_hybrid_rollout.validation.attach import attach_validation


class HybridRolloutCallback(Callback):
    """Fully-async RL with hybrid rollout replicas on the trainer's devices.

    Starts Ray, the standalone and hybrid vLLM replicas, the rollouter and the message queue with the fit, feeds the
    module's ``training_step(self, dataloader_iter)`` from the queue, and drives the policy and the
    :class:`~lightning_hybrid_rollout.schedule.DynamicResourceController` in verl's per-step order.

    Args:
        rollout: Rollout side: model, replicas, sampling (see :class:`~lightning_hybrid_rollout.config.RolloutConfig`).
        async_training: verl's ``async_training`` section (policy, ratio, staleness, sync cadence, ...).
        dataset: Where the prompts come from (:class:`~lightning_hybrid_rollout.sources.DatasetConfig`): a local
            ``.jsonl``/``.json``/``.parquet``/``.csv`` file (or a list of them, or a ``save_to_disk`` directory) or a
            hub id, with a ``prompt_column`` of strings or chat messages; every other column reaches the reward
            functions. Or a custom source as ``{"class_path": ..., "init_args": ...}``. ``None``: the toy ``task``'s.
        task: Name of a built-in toy task (``"arithmetic"``, ``"reverse"``, ``"copy"``): prompts and its reward,
            used when ``dataset`` is not given.
        task_kwargs: Extra keyword arguments for the task's constructor.
        rewards: The reward functions in TRL's convention and how they run
            (:class:`~lightning_hybrid_rollout.rewards.RewardConfig`: ``reward_funcs``, ``reward_weights``,
            ``reward_workers``, ``reward_pool``, ``reward_timeout_s``, ``reward_error``). Left out: the task's reward.
        agentic: Multi-turn episodes (:class:`~lightning_hybrid_rollout.agentic.runtime.AgenticConfig`: ``tools``,
            ``environment``, ``environment_kwargs``, ``tool_parser``, ``max_turns``, ``max_episode_tokens``,
            ``tool_timeout_s``, ``tool_workers``; docs/agentic.md). Left out: single-turn samples.
        log_rollouts: Write the first N samples trained on each cycle to ``<run dir>/rollouts/cycle_<k>.jsonl``
            (messages, token ids, loss mask, log-probs, weight versions, reward); 0: none.
        build_model: If ``rollout.model_path`` holds no model yet, build a tiny local one there (CPU quickstart):
            ``True`` for the defaults, or a :class:`~lightning_hybrid_rollout.config.TinyModelConfig`.
        summary_every_n_cycles: Print one summary line (reward, samples/s, queue, hybrid state) after the first
            cycle and every N cycles (0: never); the per-cycle detail is in the trace, ``metrics.csv`` and the log.
        trace: Write a Chrome trace-event file ``trace.json`` of replica states and trainer phases to the run dir.
        run_dir: Where Ray temp files, the trace and replica logs go (default: ``trainer.default_root_dir``).
        **flat_keys: The reward and multi-turn keys of earlier releases (``reward_funcs``, ``max_turns``, ...),
            folded into ``rewards``/``agentic`` with a deprecation line; they go in a later release.

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
        rewards: RewardConfig | dict[str, Any] | None = None,
        agentic: AgenticConfig | dict[str, Any] | None = None,
        log_rollouts: int = 0,
        build_model: bool | TinyModelConfig = False,
        summary_every_n_cycles: int = 10,
        trace: bool = True,
        run_dir: str | None = None,
        **flat_keys: Any,
    ) -> None:
        super().__init__()
        if summary_every_n_cycles < 0:
            raise ConfigError([f"summary_every_n_cycles must be >= 0 (0: never), got {summary_every_n_cycles}"])
        reward_cfg, agentic_cfg = fold_flat_keys(rewards, agentic, flat_keys)
        #: The fit's rollout side and scheduler (Lightning-free; :mod:`~lightning_hybrid_rollout.run.hybrid_run`).
        self.run = HybridRun(
            rollout=rollout,
            async_training=async_training if async_training is not None else AsyncTrainingConfig(),
            dataset=dataset,
            task=task,
            task_kwargs=dict(task_kwargs or {}),
            rewards=reward_cfg,
            agentic=agentic_cfg,
            log_rollouts=log_rollouts,
            build_model=TinyModelConfig.resolve(build_model),
            trace=trace,
        )
        self.summary_every_n_cycles = summary_every_n_cycles
        self.run_dir = run_dir
        #: Offload/onload, the weight gather, the rank protocol (every rank); the hybrid pool's ``TrainerLink``.
        self._trainer_side = TrainerSide(self.run.call_log, weight_version=lambda: self.run.param_version)
        self._engine_lora: dict[str, Any] | None = None
        self._report: CycleReport | None = None
        self._validation: Any = None
        self._fit: LightningFit | None = None
        #: Lightning's expected warnings, hidden from ``setup`` to the end of the fit (never at import).
        self._expected_warnings = ExpectedWarnings()

    @property
    def controller(self) -> Any:
        """The controller (global rank 0 only; None elsewhere and before fit)."""
        return self.run.controller

    @property
    def runtime(self) -> Any:
        """The rollout runtime (global rank 0 only)."""
        return self.run.runtime

    @property
    def policy(self) -> Any:
        """The schedule policy."""
        return self.run.policy

    @property
    def state_key(self) -> str:
        return "HybridRolloutCallback"

    # ----------------------------------------------------------------------------------------------- lifecycle

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._expected_warnings.hide()  # until _shutdown: the fit's data and loop set-up raise them
        run = self.run
        # a hub id resolves once on this rank's node (the replicas resolve it on theirs)
        model_dir = run.rollout.model_path
        if run.build_model is None and stage in ("fit", "validate"):
            model_dir = resolve_model_path(model_dir, run.rollout.model_revision)
        root = self.run_dir or trainer.default_root_dir
        take_model_path(
            pl_module, model_dir, build_model=run.build_model is not None, run_dir=root, check_disk=stage == "fit"
        )
        redact_logger_hyperparams(trainer.loggers)
        if stage not in ("fit", "validate"):
            return
        if stage == "fit":
            self._fit = LightningFit(trainer, self._trainer_side)
            if trainer.is_global_zero:
                run.prepare_model(model_dir, Path(root), self._fit)
            trainer.strategy.barrier("lhr_model_ready")
            lora, r = getattr(pl_module, "lora_config", None), run.rollout  # checked before Ray, on every rank
            self._engine_lora = check_lora_sync(lora, model_dir, r.lora_sync, r.tensor_parallel_size)
            self._trainer_side.adapter_only = self._engine_lora is not None  # syncs send the adapter alone
        workload = run.load_workload(model_dir, getattr(pl_module, "fit_sequence_length", None))
        datamodule = getattr(trainer, "datamodule", None)
        self._validation = attach_validation(
            workload, datamodule, max_new_tokens=run.rollout.response_length, during_fit=stage == "fit"
        )
        if stage != "fit":
            return
        attach_batch_source(datamodule, run.next_batch, workload.tokenizer.pad_token_id)
        node_ips = rank_node_ips(trainer.world_size)  # collective: hybrid replica i goes to rank i's node
        if trainer.is_global_zero:
            rank_zero_info(f"[lhr] policy {run.async_training.dynamic_schedule_policy}: {run.describe_policy()}")
            run.start_runtime(self._fit, self._trainer_side, node_ips, self._engine_lora)  # type: ignore[arg-type]

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        run = self.run
        self._report = CycleReport.for_run(run, self.summary_every_n_cycles)
        self._fit = self._fit or LightningFit(trainer, self._trainer_side)
        ranks = self._trainer_side.start_fit(trainer)
        pl_module.param_version = run.param_version
        if run.resumed:  # engines loaded the model from disk (version 0): the restored weights go out first
            self._gather_weights(trainer)
        if trainer.is_global_zero:
            run.start_fit(self._fit, trainer.world_size)
        else:
            run.follow_start(ranks)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        rank_zero_info(self.run.fit_done_line(trainer.global_step, peak_rss_bytes() / 1e9))
        self._shutdown()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # a SIGTERM shows as Lightning's SIGTERMException, or as the SystemExit of the handler Ray's driver installs
        interrupted = isinstance(exception, KeyboardInterrupt | SIGTERMException) or trainer.received_sigterm
        if interrupted and self.run.runtime is not None:
            LightningFit(trainer, self._trainer_side).save_checkpoint("interrupted")
        self._shutdown()

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        self._expected_warnings.show()
        self._trainer_side.weights = None
        try:
            self.run.stop()
        finally:
            if self._validation is not None:
                validation, self._validation = self._validation, None
                validation.close()

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:  # validation runs on the trainer's devices: lent hybrid replicas sleep first
            self.run.take_back_for_validation()
        trainer.strategy.barrier("lhr_validating")
        self._trainer_side.onload(trainer)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and self._report is not None and self._fit is not None:  # in-fit: lend again
            self.run.lend_after_validation(self._fit, trainer.is_global_zero)

    # --------------------------------------------------------------------------------------------- per step

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        run = self.run
        pl_module.param_version = run.param_version
        cycle_start = run.is_sync_boundary(trainer.global_step)
        run.step.begin(cycle_start)
        if cycle_start:
            if trainer.is_global_zero:
                run.before_step()
            trainer.strategy.barrier("lhr_deactivated")
            self._trainer_side.onload(trainer)
        run.step.start_training()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        run = self.run
        if trainer.is_global_zero:
            run.end_training()
            assert self._report is not None
            self._report.log_step(pl_module, run.samples_consumed, run.step_samples)
        if not run.is_sync_boundary(trainer.global_step):
            if trainer.is_global_zero:
                run.end_step()
            return
        self._gather_weights(trainer)  # weight sync to standalone (always), then the activation decision
        assert self._fit is not None
        if trainer.is_global_zero:
            closed = run.end_cycle()
            pl_module.param_version = run.param_version
            self._emit_cycle(trainer, closed)
        else:
            run.follow_cycle(self._fit)
            pl_module.param_version = run.param_version

    def _gather_weights(self, trainer: Trainer) -> None:
        """The cycle's full weights on rank 0 (collective; ``benchmarks/cpu_miniature.py`` times it by this name)."""
        self._trainer_side.gather_weights(trainer)

    def _emit_cycle(self, trainer: Trainer, closed: CycleClose) -> None:
        """Measure the cycle's end, close the cycle and report it (rank 0; :class:`~.cycle_report.CycleReport`)."""
        report, side, run = self._report, self._trainer_side, self.run
        assert report is not None
        measured = report.cycle_end(
            closed.stats, closed.sync_s, closed.end, run.param_version, side.last_offload_s, side.last_onload_s
        )
        activations = int(run.switch_totals["activate"]["count"])
        run.last_cycle_metrics = report.emit(trainer, measured, run.cycles_done, run.samples_consumed, activations)

    # ---------------------------------------------------------------------------------------------- checkpoint

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.run.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.run.load_state_dict(state_dict)
