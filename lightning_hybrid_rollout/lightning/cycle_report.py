"""CycleReport: what the callback reports per training step and per sync cycle (global rank 0).

- every step, through ``LightningModule.log``: ``rollout/mq_size_step``, ``train/samples``,
  ``train/prompts_skipped_too_long``, ``train/samples_per_s`` and the reward functions' values
  (``train/rewards/<name>_mean``, ``train/reward_errors``);
- every cycle: its end's measurements (:class:`~lightning_hybrid_rollout.schedule.cycle.CycleEnd`) closed in the
  :class:`~lightning_hybrid_rollout.schedule.cycle.CycleLedger`, the ``dynamic_resource/*`` values and
  ``rollout/prefix_cache_hit_rate`` (and, with ``rollout.filter_groups``, ``rollout/filtered_groups`` and
  ``rollout/filtered_fraction``; with multi-turn episodes ``rollout/turns_mean`` and the other
  :class:`~lightning_hybrid_rollout.agentic.runtime.EpisodeWindow` values) written once to the trainer's loggers, a
  trace counter, ``log_rollouts``' file, and every ``summary_every_n_cycles`` cycles one console line.

The callback builds one per fit (at ``on_train_start``) and passes its own counters to each call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_hybrid_rollout import metrics as M
from lightning_hybrid_rollout.run.overlap import OverlapSync
from lightning_hybrid_rollout.run.rollout_log import RolloutLog
from lightning_hybrid_rollout.run.workload import Workload
from lightning_hybrid_rollout.schedule import DynamicResourceController, DynamicSchedulePolicyBase
from lightning_hybrid_rollout.schedule.cycle import CycleEnd, CycleLedger

#: Per cycle: cached prompt tokens over prompt tokens of the segments the replicas returned (vLLM's prefix cache).
PREFIX_CACHE_HIT_RATE = "rollout/prefix_cache_hit_rate"
#: Per cycle: payload bytes of the weight pushes, one copy per push (full weights, or the LoRA adapter alone with
#: ``rollout.lora_sync: adapter``); the runtime's only, the simulator moves no bytes.
WEIGHT_SYNC_BYTES = "dynamic_resource/weight_sync_bytes"
#: Per cycle, with ``rollout.filter_groups``: groups the group filter dropped before the queue.
FILTERED_GROUPS = "rollout/filtered_groups"
#: Per cycle, with ``rollout.filter_groups``: dropped groups over finished (rewarded) groups.
FILTERED_FRACTION = "rollout/filtered_fraction"
#: Per step: samples in the step's batch (what the step trains on).
TRAIN_SAMPLES = "train/samples"


class CycleReport:
    """Per-step metrics, per-cycle ``dynamic_resource/*`` metrics and the console summary line of one fit.

    Args:
        ledger: The per-cycle core that turns a cycle's measurements into its metrics.
        runtime: The rollout runtime (``RolloutRuntime`` or a test double: its ``RuntimeQueries``, ``pool``,
            ``trace_cycle``).
        controller: The controller (None: no hybrid state to report).
        policy: The schedule policy (its ``deactivate_ratio``).
        workload: The run's workload (its reward runner's per-step values; None: none).
        clock: The clock every measurement is read from; the fit starts when the report is built.
        summary_every_n_cycles: A console line after the first cycle and every N cycles (0: never).
        has_hybrid: Whether the run has hybrid replicas (else no ``deactivate_ratio`` is emitted).
        overlap: The callback's ``overlap_sync`` (the seconds it saved per cycle); None: the option is off.
        rollout_log: ``log_rollouts``' writer (None: the option is off).
    """

    def __init__(
        self,
        *,
        ledger: CycleLedger,
        runtime: Any,
        controller: DynamicResourceController | None,
        policy: DynamicSchedulePolicyBase,
        workload: Workload | None,
        clock: Callable[[], float],
        summary_every_n_cycles: int,
        has_hybrid: bool,
        overlap: OverlapSync | None = None,
        rollout_log: RolloutLog | None = None,
    ) -> None:
        self.ledger = ledger
        self.runtime = runtime
        self.controller = controller
        self.policy = policy
        self.workload = workload
        self.clock = clock
        self.summary_every_n_cycles = summary_every_n_cycles
        self.has_hybrid = has_hybrid
        self.overlap = overlap
        self.rollout_log = rollout_log
        self.fit_start = clock()
        self._filtering: Any = None  # the group filter's window of the cycle being closed

    @classmethod
    def for_run(cls, run: Any, summary_every_n_cycles: int) -> CycleReport:
        """The report of a fit's :class:`~lightning_hybrid_rollout.run.hybrid_run.HybridRun` (rank 0, its runtime
        started).

        Args:
            run: The fit's run object.
            summary_every_n_cycles: A console line after the first cycle and every N cycles (0: never).
        """
        return cls(
            ledger=run.ledger,
            runtime=run.runtime,
            controller=run.controller,
            policy=run.policy,
            workload=run.workload,
            clock=lambda: run.clock(),
            summary_every_n_cycles=summary_every_n_cycles,
            has_hybrid=run.rollout.hybrid_replicas > 0,
            overlap=run.overlap if run.async_training.overlap_sync else None,
            rollout_log=run.rollout_log,
        )

    @property
    def hybrid_active(self) -> bool:
        """Whether the hybrid replicas are active now."""
        return bool(self.controller is not None and self.controller.is_hybrid_active)

    # ----------------------------------------------------------------------------------------------- per step

    @staticmethod
    def _log(pl_module: LightningModule, name: str, value: float, prog_bar: bool = False) -> None:
        pl_module.log(
            name, float(value), on_step=True, on_epoch=False, rank_zero_only=True, prog_bar=prog_bar, batch_size=1
        )

    def log_step(self, pl_module: LightningModule, samples_consumed: int, step_samples: int | None = None) -> None:
        """``rollout/mq_size_step``, ``train/samples`` (the step's batch), ``train/prompts_skipped_too_long`` (a
        running count), ``train/samples_per_s``, each reward function's mean over the samples scored since the last
        step (``train/rewards/<name>_mean``) and ``train/reward_errors``."""
        self._log(pl_module, "rollout/mq_size_step", float(self.runtime.queue_size()), prog_bar=False)
        if step_samples is not None:
            self._log(pl_module, TRAIN_SAMPLES, float(step_samples))
        self._log(pl_module, "train/prompts_skipped_too_long", float(self.runtime.prompts_skipped_too_long()))
        elapsed = self.clock() - self.fit_start
        if elapsed > 0:
            self._log(pl_module, "train/samples_per_s", samples_consumed / elapsed)
        if self.workload is not None and self.workload.runner is not None:  # None: the environment's reward alone
            for name, value in self.workload.runner.take_stats().items():
                self._log(pl_module, name, float(value))

    # ---------------------------------------------------------------------------------------------- per cycle

    def cycle_end(
        self, stats: Any, sync_s: float, end: Any, param_version: int, offload_s: float, onload_s: float
    ) -> CycleEnd:
        """The measurements at the end of the cycle (what the ledger did not accumulate itself).

        Args:
            stats: The rollouter's staleness stats of the cycle (``RuntimeQueries.new_param_version``).
            sync_s: Seconds of the standalone weight sync.
            end: The controller's ``StepEndResult`` of the cycle.
            param_version: The weight version the cycle published.
            offload_s: The trainer's last offload (seconds).
            onload_s: Its last onload (seconds).
        """
        self._filtering = getattr(stats, "filtering", None)
        saved_s: float | None = None
        if self.overlap is not None:
            saved_s = self.overlap.take_saved_s()
        return CycleEnd(
            rollout_history=list(getattr(stats, "history", []) or []),
            step_generated_samples=int(getattr(stats, "step_generated_samples", 0)),
            mq_size=float(self.runtime.queue_size()),
            standalone_sync_s=sync_s,
            hybrid_sync_s=self.runtime.pool.take_cycle_sync_s(),
            activate_duration_s=end.cycle_activate_duration_s,
            deactivate_duration_s=end.cycle_deactivate_duration_s,
            deactivate_ratio=float(self.policy.deactivate_ratio) if self.has_hybrid else None,
            param_version=param_version,
            offload_s=float(offload_s),
            onload_s=float(onload_s),
            overlap_saved_s=saved_s,
            hybrid_active=self.hybrid_active,
            # k of n lending: how many are lent now (None: the ledger counts all of them while active)
            active_hybrid_replicas=self.controller.active_replica_count if self.controller is not None else None,
        )

    def emit(
        self, trainer: Trainer, end: CycleEnd, cycle: int, samples_consumed: int, activations: int
    ) -> dict[str, float]:
        """Close the cycle in the ledger and log its ``dynamic_resource/*`` values; returns them.

        Logged straight to ``trainer.loggers`` at this step (as Lightning's own ``LearningRateMonitor`` does), so a
        per-cycle value is written once, not repeated on every later step. Only rank 0 measures, so no collective.

        Args:
            trainer: The trainer.
            end: The cycle's end (:meth:`cycle_end`).
            cycle: Cycles done, this one included.
            samples_consumed: Samples trained on since the run began.
            activations: Hybrid activations since the run began.
        """
        values = self.ledger.close(end)
        values[M.REPLICA_RESTARTS] = float(self.runtime.replica_restarts())
        values[PREFIX_CACHE_HIT_RATE] = self.runtime.prefix_cache_hit_rate()
        values[WEIGHT_SYNC_BYTES] = float(self.runtime.take_cycle_sync_bytes())
        if self._filtering is not None and getattr(self.workload, "group_filter", None) is not None:
            values[FILTERED_GROUPS] = float(self._filtering.filtered_groups)
            values[FILTERED_FRACTION] = float(self._filtering.filtered_fraction)
        episodes = getattr(self.workload, "episodes", None)
        if episodes is not None:
            values.update(episodes.take_window().metrics())
        if self.rollout_log is not None:
            self.rollout_log.write(cycle)
        for logger in trainer.loggers:
            logger.log_metrics(values, step=trainer.fit_loop.epoch_loop._batches_that_stepped)
        for name in (M.MQ_SIZE, M.HYBRID_ACTIVE, M.RESOURCE_UTILIZATION):
            trainer.callback_metrics[name] = torch.tensor(values[name])
        self.runtime.trace_cycle(cycle, self.clock(), values)
        every = self.summary_every_n_cycles
        if every and (cycle == 1 or cycle % every == 0):
            rank_zero_info(self.summary_line(trainer, cycle, samples_consumed, activations))
        return values

    def summary_line(self, trainer: Trainer, cycle: int, samples_consumed: int, activations: int) -> str:
        """One console line: where the run is and how often the hybrid replicas were activated so far."""
        metrics = trainer.callback_metrics
        reward = metrics.get("train/reward_mean")
        elapsed = max(1e-9, self.clock() - self.fit_start)
        text = f"[lhr] cycle {cycle} (step {trainer.global_step})"
        if reward is not None:
            text += f": reward {float(reward):.3f}"
        text += (
            f", {samples_consumed / elapsed:.1f} samples/s trained, queue {self.runtime.queue_size()}, "
            f"hybrid {'on' if self.hybrid_active else 'off'} "
            f"({activations} activations so far)"
        )
        text += f", trainer peak RSS {peak_rss_bytes() / 1e9:.1f} GB"
        skipped = self.runtime.prompts_skipped_too_long()
        return text + (f", {skipped} prompts skipped (too long)" if skipped else "")


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (the trainer's, on rank 0; Linux reports KiB, macOS bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
