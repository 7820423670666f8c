"""The per-cycle core: the runtime callback and the simulator record one sync cycle's measurements into one
:class:`CycleLedger`, which alone builds the policy's context and the cycle's ``dynamic_resource/*``
(docs/metrics.md). Pure: no clock, no I/O.

Example::

    from lightning_hybrid_rollout.schedule.cycle import CycleEnd, CycleLedger, RunShape, Totals

    ledger = CycleLedger(RunShape(required_samples=4, trigger_parameter_sync_step=1, buffer_samples=2))
    ledger.add_batch(wait_s=0.5, queue_before=1, samples=4, tokens=40)
    ledger.add_compute(1.0)
    ledger.end_step(allocated_s=2.0, step_s=2.0)
    ctx = ledger.context(Totals(total_generated_samples=6, expected_samples=4, queue_size=2))
    assert ctx.step_wait_samples == [3] and ctx.cycle_trained_tokens == 40
    ledger.record_sync_decision(hybrid_active=False, hybrid_synced=False)
    values = ledger.close(CycleEnd(mq_size=2))
    assert values["dynamic_resource/train_resource_utilization"] == 0.5
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_hybrid_rollout.metrics import formulas as F
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateScheduleContext

__all__ = ["ACTIVE_HYBRID_REPLICAS", "CycleEnd", "CycleLedger", "ProductionByRole", "RunShape", "Totals"]

#: Extra cycle metrics (ours, beside verl's §4 names in :mod:`lightning_hybrid_rollout.metrics.formulas`).
DEACTIVATE_RATIO = "dynamic_resource/deactivate_ratio"
PARAM_VERSION = "dynamic_resource/param_version"
OFFLOAD_S = "dynamic_resource/offload_s"
ONLOAD_S = "dynamic_resource/onload_s"
OVERLAP_SAVED_S = "dynamic_resource/overlap_saved_s"
#: Hybrid replicas lent after the cycle's ``after_sync`` (k of n; 0 when none is active).
ACTIVE_HYBRID_REPLICAS = "dynamic_resource/active_hybrid_replicas"


@dataclass(frozen=True)
class RunShape:
    """What stays fixed over a run (from ``AsyncTrainingConfig`` and the replica counts).

    Args:
        required_samples: Samples per optimizer step.
        trigger_parameter_sync_step: Optimizer steps per sync cycle.
        buffer_samples: The staleness budget's headroom (``config.derived_counts``).
        only_hybrid: No standalone replicas (colocated mode).
        num_standalone_replicas: Standalone replicas.
        num_hybrid_replicas: Hybrid replicas (0: none, the hybrid sync is never "skipped").
        hybrid_devices: Trainer devices the hybrid replicas borrow (``a`` of design/scheduling.md §4.3).
        standalone_devices: Devices of the standalone replicas (``b`` of design/scheduling.md §4.3).
    """

    required_samples: int
    trigger_parameter_sync_step: int
    buffer_samples: int = 0
    only_hybrid: bool = False
    num_standalone_replicas: int = 0
    num_hybrid_replicas: int = 0
    hybrid_devices: int = 0
    standalone_devices: int = 0


@dataclass(frozen=True)
class Totals:
    """The run's counters at a decision.

    Args:
        total_generated_samples: Samples the rollout side has produced since training began.
        expected_samples: Samples the trainer has consumed so far.
        queue_size: Samples in the message queue now.
    """

    total_generated_samples: int = 0
    expected_samples: int = 0
    queue_size: int = 0


@dataclass(frozen=True)
class ProductionByRole:
    """Per-role production of the cycle (the rollouter's role window; the simulator's production window).

    Args:
        standalone_serving_s: Seconds standalone replicas were serving.
        standalone_decoded_tokens: Tokens they decoded.
        hybrid_serving_s: Seconds hybrid replicas were serving (routable, awake).
        hybrid_decoded_tokens: Tokens they decoded (aborted segments included).
    """

    standalone_serving_s: float = 0.0
    standalone_decoded_tokens: float = 0.0
    hybrid_serving_s: float = 0.0
    hybrid_decoded_tokens: float = 0.0

    @classmethod
    def from_roles(cls, serving_s: Mapping[str, float], decoded_tokens: Mapping[str, float]) -> ProductionByRole:
        """From ``{"standalone": .., "hybrid": ..}`` mappings (a missing role counts 0)."""
        return cls(
            standalone_serving_s=float(serving_s.get("standalone", 0.0)),
            standalone_decoded_tokens=float(decoded_tokens.get("standalone", 0)),
            hybrid_serving_s=float(serving_s.get("hybrid", 0.0)),
            hybrid_decoded_tokens=float(decoded_tokens.get("hybrid", 0)),
        )


@dataclass(frozen=True)
class CycleEnd:
    """What the cycle's end measured, beside what the ledger accumulated.

    Args:
        rollout_history: The rollouter's window ``(t, active, cap)`` since the previous ``reset_staleness``.
        step_generated_samples: Samples fully generated in that window (design/scheduling.md §4.5).
        mq_size: Queue size at the cycle's end (design/scheduling.md §4.4).
        standalone_sync_s: Seconds of the standalone weight push.
        hybrid_sync_s: Seconds of the hybrid weight push (activation or ``overlap_sync`` preparation; 0 if none).
        activate_duration_s: The cycle's activation (``StepEndResult.cycle_activate_duration_s``).
        deactivate_duration_s: The cycle's deactivation (``StepEndResult.cycle_deactivate_duration_s``).
        deactivate_ratio: The policy's ratio after ``update_after_step`` (None: not emitted).
        param_version: The weight version the cycle published.
        offload_s: The trainer's last offload of its training state (seconds).
        onload_s: Its last onload (seconds).
        overlap_saved_s: Seconds ``overlap_sync`` saved this cycle (None: the option is off, not emitted).
        hybrid_active: Whether hybrid replicas are active after the cycle's ``after_sync``.
        active_hybrid_replicas: How many are lent then (``StepEndResult.active_replicas``; None: all of
            ``RunShape.num_hybrid_replicas`` when ``hybrid_active``, else 0).
    """

    rollout_history: Sequence[Sequence[float]] = ()
    step_generated_samples: int = 0
    mq_size: float = 0.0
    standalone_sync_s: float = 0.0
    hybrid_sync_s: float = 0.0
    activate_duration_s: float = 0.0
    deactivate_duration_s: float = 0.0
    deactivate_ratio: float | None = None
    param_version: int = 0
    offload_s: float = 0.0
    onload_s: float = 0.0
    overlap_saved_s: float | None = None
    hybrid_active: bool = False
    active_hybrid_replicas: int | None = None


@dataclass
class _Cycle:
    step_wait_times: list[float] = field(default_factory=list)
    step_wait_samples: list[int] = field(default_factory=list)
    step_queue_sizes: list[int] = field(default_factory=list)
    trained_samples: int = 0
    trained_tokens: int = 0
    compute_s: list[float] = field(default_factory=list)
    allocated_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    deactivate_wait_s: float = 0.0
    deactivate_wait_samples: int = 0
    deactivated: bool = False


class CycleLedger:
    """Accumulates one sync cycle's measurements; builds the policy's context and the cycle's metrics from them.

    One per run; the metrics' meanings are in docs/metrics.md. Per cycle, in the order the trainer sees them
    (design/scheduling.md §1)::

        ledger.context(totals)                        # before_step's context (nothing measured yet)
        ledger.add_deactivate_wait(s, n)              # inside wait_for_samples, if the policy deactivates
        ledger.mark_deactivation(deactivated)         # what before_step did
        for each optimizer step:
            ledger.add_batch(wait_s, queue_before, samples, tokens)
            ledger.add_compute(compute_s)             # right after training, before any sync
            ledger.end_step(allocated_s, step_s)      # at the step's very end (the last one: after the sync)
        ledger.context(totals, production)            # after_sync's context
        ledger.record_sync_decision(hybrid_active, hybrid_synced)   # (the fit's start: record_start_decision)
        metrics = ledger.close(CycleEnd(...))         # the cycle's dynamic_resource/* values; the next one starts

    Args:
        shape: The run's fixed shape.
    """

    def __init__(self, shape: RunShape) -> None:
        self.shape = shape
        self._c = _Cycle()
        self._skipped = False
        self.last_wait_s = self.last_step_s = 0.0
        #: Sync decisions that left the hybrid replicas without this version's weights (running count).
        self.hybrid_sync_skipped_total = 0

    # -------------------------------------------------------------------------------------------- recording

    def add_deactivate_wait(self, seconds: float, samples: int) -> None:
        """The trainer waited ``seconds`` for the deactivate threshold; ``samples`` reached the queue meanwhile."""
        self._c.deactivate_wait_s += float(seconds)
        self._c.deactivate_wait_samples += max(0, int(samples))

    def mark_deactivation(self, deactivated: bool) -> None:
        """Whether ``before_step`` really deactivated the hybrid replicas this cycle."""
        self._c.deactivated = self._c.deactivated or bool(deactivated)

    def add_batch(self, wait_s: float, queue_before: int, samples: int, tokens: int) -> None:
        """One optimizer step's batch: waited ``wait_s`` with ``queue_before`` samples queued when it asked."""
        c = self._c
        c.step_wait_times.append(float(wait_s))
        c.step_wait_samples.append(max(0, self.shape.required_samples - int(queue_before)))
        c.step_queue_sizes.append(int(queue_before))
        c.trained_samples += int(samples)
        c.trained_tokens += int(tokens)

    def add_compute(self, compute_s: float) -> None:
        """One optimizer step's training compute (design/scheduling.md §4.1 ``compute_i``), recorded before the cycle's
        sync."""
        self._c.compute_s.append(float(compute_s))

    def end_step(self, allocated_s: float, step_s: float) -> None:
        """One optimizer step's wall times: allocated (design/scheduling.md §4.1 ``alloc_i``) and whole."""
        self._c.allocated_s.append(float(allocated_s))
        self._c.step_s.append(float(step_s))

    def record_start_decision(self, hybrid_active: bool, hybrid_synced: bool) -> None:
        """The fit's start decision (step 0): counted in the running total, part of no cycle."""
        self.hybrid_sync_skipped_total += int(
            self.shape.num_hybrid_replicas > 0 and not (hybrid_active or hybrid_synced)
        )

    def record_sync_decision(self, hybrid_active: bool, hybrid_synced: bool) -> None:
        """After ``after_sync``: are hybrid replicas active, did a hybrid weight push happen at this boundary."""
        self._skipped = self.shape.num_hybrid_replicas > 0 and not (hybrid_active or hybrid_synced)
        self.hybrid_sync_skipped_total += int(self._skipped)

    # ---------------------------------------------------------------------------------------------- outputs

    def context(self, totals: Totals, production: ProductionByRole | None = None) -> RateScheduleContext:
        """The decision context: the run's counters and the cycle's measurements so far.

        Args:
            totals: The counters now.
            production: The cycle's per-role production (None before a cycle's first step: nothing measured).
        """
        s, c = self.shape, self._c
        p = production or ProductionByRole()
        return RateScheduleContext(
            required_samples=s.required_samples,
            trigger_parameter_sync_step=s.trigger_parameter_sync_step,
            total_generated_samples=int(totals.total_generated_samples),
            expected_samples=int(totals.expected_samples),
            buffer_samples=s.buffer_samples,
            step_wait_times=list(c.step_wait_times),
            step_wait_samples=list(c.step_wait_samples),
            only_hybrid=s.only_hybrid,
            queue_size=int(totals.queue_size),
            step_queue_sizes=list(c.step_queue_sizes),
            cycle_train_compute_s=float(sum(c.compute_s)),
            cycle_trained_samples=c.trained_samples,
            cycle_trained_tokens=c.trained_tokens,
            standalone_serving_s=p.standalone_serving_s,
            standalone_decoded_tokens=p.standalone_decoded_tokens,
            hybrid_serving_s=p.hybrid_serving_s,
            hybrid_decoded_tokens=p.hybrid_decoded_tokens,
            deactivate_wait_s=c.deactivate_wait_s,
            deactivate_wait_samples=c.deactivate_wait_samples,
            num_standalone_replicas=s.num_standalone_replicas,
            num_hybrid_replicas=s.num_hybrid_replicas,
        )

    def close(self, end: CycleEnd) -> dict[str, float]:
        """The cycle's ``dynamic_resource/*`` values; the next cycle starts empty."""
        s, c = self.shape, self._c
        wait_s = c.deactivate_wait_s if c.deactivated else 0.0
        #: The closed cycle's design/scheduling.md §4.3 terms (the simulator sums them into its run-level utilization).
        self.last_wait_s, self.last_step_s = wait_s, float(sum(c.step_s))
        out = F.cycle_metrics(
            compute_s=c.compute_s,
            allocated_s=c.allocated_s,
            rollout_history=list(end.rollout_history),
            wait_s=wait_s,
            step_s=self.last_step_s,
            hybrid_devices=s.hybrid_devices,
            standalone_devices=s.standalone_devices,
            mq_sizes=[end.mq_size],
            step_generated_samples=end.step_generated_samples,
        )
        out[F.ACTIVATE_DURATION_S] = float(end.activate_duration_s)
        out[F.DEACTIVATE_DURATION_S] = float(end.deactivate_duration_s)
        out[F.WEIGHT_SYNC_TIME_S] = float(end.standalone_sync_s) + float(end.hybrid_sync_s)
        out[F.HYBRID_SYNC_SKIPPED] = float(self._skipped)
        out[F.HYBRID_SYNC_SKIPPED_TOTAL] = float(self.hybrid_sync_skipped_total)
        out[F.HYBRID_ACTIVE] = float(end.hybrid_active)
        active = end.active_hybrid_replicas
        if active is None:  # an all-or-nothing caller: every hybrid replica or none
            active = s.num_hybrid_replicas if end.hybrid_active else 0
        out[ACTIVE_HYBRID_REPLICAS] = float(active)
        if end.deactivate_ratio is not None:
            out[DEACTIVATE_RATIO] = float(end.deactivate_ratio)
        out[PARAM_VERSION] = float(end.param_version)
        out[OFFLOAD_S] = float(end.offload_s)
        out[ONLOAD_S] = float(end.onload_s)
        if end.overlap_saved_s is not None:
            out[OVERLAP_SAVED_S] = float(end.overlap_saved_s)
        self._c = _Cycle()
        self._skipped = False
        return out

    # ------------------------------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The running count and the cycle in progress (a checkpoint may come in the middle of a cycle)."""
        return {
            "hybrid_sync_skipped_total": self.hybrid_sync_skipped_total,
            "cycle": dataclasses.asdict(self._c),
            "skipped": self._skipped,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (an older one without the cycle in progress starts the cycle empty)."""
        self.hybrid_sync_skipped_total = int(state.get("hybrid_sync_skipped_total", 0))
        self._c = _Cycle(**state["cycle"]) if "cycle" in state else _Cycle()
        self._skipped = bool(state.get("skipped", False))
