"""The ``"default"`` policy: adaptive deactivate ratio plus a cost/benefit activation gate (design/scheduling.md §3.1).

The ratio rises when the trainer waited for samples and falls when it did not; the gate activates when the missing
samples times the measured per-sample time exceed the measured switch cost. The formulas, and where they
deliberately differ from verl's code (a lower bound on the ratio, a gate that mutates nothing, float noise removed),
are in docs/policies.md.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.schedule.base import (
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    finite_state_value,
    register_policy,
    validate_deactivate_ratio,
)

logger = logging.getLogger(__name__)

#: Switch cost (s) assumed while no activate+deactivate overhead has been measured.
DEFAULT_SWITCH_COST_S = 10.0
#: How many recent switch overheads the switch-cost mean covers.
SWITCH_OVERHEAD_WINDOW = 3
#: Bounds of one ratio increase (fraction of the cycle's samples that had to be waited for, clipped).
RATIO_INCREASE_MIN = 0.02
RATIO_INCREASE_MAX = 0.1
#: One ratio decrease, when nothing had to be waited for.
RATIO_DECREASE_STEP = 0.02
#: Deliberately pessimistic per-sample time (s) before any signal: biases the gate toward activation.
INITIAL_PER_SAMPLE_TIME_S = 1000.0
#: Our lower bound on the adaptive ratio (verl has none).
DEFAULT_MIN_DEACTIVATE_RATIO = 0.05
_RATIO_DECIMALS = 12
_THRESHOLD_DECIMALS = 9


def deactivate_threshold(deactivate_ratio: float, ctx: DynamicScheduleContext) -> float:
    """The deactivate threshold in samples, ``ratio × step_required_samples``, snapped to 9 decimals.

    The snap removes float noise: ``0.29 × 100`` is 28.999999999999996 in floats, whose ``int`` is 28, not 29.

    Args:
        deactivate_ratio: The policy's current ratio.
        ctx: The decision context.

    Example::

        assert deactivate_threshold(0.29, DynamicScheduleContext(required_samples=100)) == 29.0
    """
    return round(deactivate_ratio * ctx.step_required_samples, _THRESHOLD_DECIMALS)


def deactivate_gap(deactivate_ratio: float, ctx: DynamicScheduleContext) -> float:
    """Samples still missing to reach the deactivate threshold: ``ratio × R − (generated − expected)``.

    Args:
        deactivate_ratio: The policy's current ratio.
        ctx: The decision context.

    Example::

        ctx = DynamicScheduleContext(required_samples=10, trigger_parameter_sync_step=2,
                                     total_generated_samples=105, expected_samples=100)
        assert deactivate_gap(0.5, ctx) == 5.0
    """
    return deactivate_threshold(deactivate_ratio, ctx) - (ctx.total_generated_samples - ctx.expected_samples)


def observed_per_sample_time(ctx: DynamicScheduleContext) -> float | None:
    """This cycle's standalone per-sample time, Σ wait_times / Σ wait_samples, or None without a signal.

    Args:
        ctx: The decision context.

    Example::

        ctx = DynamicScheduleContext(step_wait_times=[3.0, 1.0], step_wait_samples=[2, 2])
        assert observed_per_sample_time(ctx) == 1.0
    """
    total_wait_s = sum(ctx.step_wait_times)
    total_wait_samples = sum(ctx.step_wait_samples)
    if total_wait_s > 0 and total_wait_samples > 0:
        return total_wait_s / total_wait_samples
    return None


@dataclass(frozen=True)
class ActivationEstimate:
    """The numbers behind one cost/benefit gate decision of :class:`DefaultDynamicSchedulePolicy`.

    Args:
        gap_samples: ``ratio × R − (generated − expected)``.
        per_sample_time_s: The per-sample time the gate used.
        benefit_s: ``gap × per_sample_time`` (0.0 when there is no gap).
        switch_cost_s: The switch cost the gate compared against.
        activate: The gate's answer.

    Example::

        est = DefaultDynamicSchedulePolicy().estimate_activation(DynamicScheduleContext(required_samples=10))
        assert est.activate  # gap 3 samples × 1000 s pessimistic > 10 s fallback
    """

    gap_samples: float
    per_sample_time_s: float
    benefit_s: float
    switch_cost_s: float
    activate: bool


@register_policy("default")
class DefaultDynamicSchedulePolicy(DynamicSchedulePolicyBase):
    """Adaptive policy: deactivate whenever hybrid is active, at an adaptive share of the cycle's samples.

    The rules are in docs/policies.md.

    Args:
        deactivate_ratio: Initial ratio in (0, 1]; must be >= ``min_deactivate_ratio``.
        only_hybrid: No standalone replicas: forces ratio 1.0, always activates, never adapts.
        min_deactivate_ratio: Lower bound in (0, 1] of the adapted ratio.

    Example::

        policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
        ctx = DynamicScheduleContext(required_samples=25, trigger_parameter_sync_step=4,
                                     step_wait_times=[5.0], step_wait_samples=[10])
        policy.update_after_step(1, ctx)  # 10 of 100 samples waited for: ratio += clip(0.1, 0.02, 0.1)
        assert policy.deactivate_ratio == 0.4
        assert policy.per_sample_time_s == 0.5
    """

    def __init__(
        self,
        deactivate_ratio: float = 0.3,
        only_hybrid: bool = False,
        *,
        min_deactivate_ratio: float = DEFAULT_MIN_DEACTIVATE_RATIO,
    ) -> None:
        super().__init__(deactivate_ratio, only_hybrid)
        self._min_deactivate_ratio = validate_deactivate_ratio(min_deactivate_ratio, "min_deactivate_ratio")
        if self.deactivate_ratio < self._min_deactivate_ratio:
            raise ValueError(
                f"dynamic_schedule_deactivate_ratio must be >= min_deactivate_ratio ({self._min_deactivate_ratio}) "
                f"for the 'default' policy, got {self.deactivate_ratio}; raise the ratio or lower min_deactivate_ratio"
            )
        self._switch_overheads_s: deque[float] = deque(maxlen=SWITCH_OVERHEAD_WINDOW)
        self._per_sample_time_s = INITIAL_PER_SAMPLE_TIME_S

    # ------------------------------------------------------------------------------------------- read-only state

    @property
    def min_deactivate_ratio(self) -> float:
        """The lower bound of the adapted ratio."""
        return self._min_deactivate_ratio

    @property
    def switch_cost_s(self) -> float:
        """Mean of the last 3 measured (> 0) activate+deactivate overheads; 10 s while none was measured."""
        if self._switch_overheads_s:
            return sum(self._switch_overheads_s) / len(self._switch_overheads_s)
        return DEFAULT_SWITCH_COST_S

    @property
    def per_sample_time_s(self) -> float:
        """The stored standalone per-sample time estimate (1000 s before any signal)."""
        return self._per_sample_time_s

    @property
    def switch_overheads_s(self) -> tuple[float, ...]:
        """The overheads (s) in the switch-cost window, oldest first."""
        return tuple(self._switch_overheads_s)

    # ------------------------------------------------------------------------------------------------ decisions

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        """Deactivate whenever the hybrid replicas are active.

        Args:
            global_steps: The current global step.
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context (unused).
        """
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """``int(step_required_samples × ratio)`` (the product snapped to 9 decimals first).

        Args:
            ctx: The decision context.
        """
        return int(deactivate_threshold(self.deactivate_ratio, ctx))

    def estimate_activation(self, ctx: DynamicScheduleContext) -> ActivationEstimate:
        """Compute the cost/benefit gate without changing any state (``only_hybrid`` is not considered here).

        Args:
            ctx: The decision context.
        """
        switch_cost_s = self.switch_cost_s
        fresh = observed_per_sample_time(ctx)
        per_sample_time_s = self._per_sample_time_s if fresh is None else fresh
        gap = deactivate_gap(self.deactivate_ratio, ctx)
        if gap <= 0:
            return ActivationEstimate(gap, per_sample_time_s, 0.0, switch_cost_s, False)
        benefit_s = gap * per_sample_time_s
        return ActivationEstimate(gap, per_sample_time_s, benefit_s, switch_cost_s, benefit_s > switch_cost_s)

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """True if ``only_hybrid``; else iff a gap exists and ``gap × per_sample_time > switch_cost``.

        Args:
            global_steps: The current global step.
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context.
        """
        if self.only_hybrid:
            return True
        est = self.estimate_activation(ctx)
        logger.debug(
            "default policy step=%d gate: gap=%.3f per_sample_time=%.3fs benefit=%.3fs switch_cost=%.3fs -> %s",
            global_steps,
            est.gap_samples,
            est.per_sample_time_s,
            est.benefit_s,
            est.switch_cost_s,
            "activate" if est.activate else "skip",
        )
        return est.activate

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        """Record the switch overhead and per-sample time, then adapt the ratio.

        Args:
            global_steps: The current global step; nothing happens when it is <= 0.
            ctx: The decision context, with this cycle's switch durations filled in by the controller.
        """
        if self.only_hybrid or global_steps <= 0:
            return
        overhead_s = ctx.last_activate_duration_s + ctx.last_deactivate_duration_s
        if overhead_s > 0:
            self._switch_overheads_s.append(float(overhead_s))
        fresh = observed_per_sample_time(ctx)
        if fresh is not None:
            self._per_sample_time_s = fresh

        wait_samples = sum(ctx.step_wait_samples)
        if wait_samples > 0:
            delta = min(RATIO_INCREASE_MAX, max(RATIO_INCREASE_MIN, wait_samples / ctx.step_required_samples))
        else:
            delta = -RATIO_DECREASE_STEP
        ratio = round(self.deactivate_ratio + delta, _RATIO_DECIMALS)
        self.deactivate_ratio = min(1.0, max(self._min_deactivate_ratio, ratio))
        logger.debug(
            "default policy step=%d: deactivate_ratio=%.4f (delta=%+.4f, wait_samples=%d, per_sample_time=%.3fs, "
            "switch_cost=%.3fs, overhead=%.3fs)",
            global_steps,
            self.deactivate_ratio,
            delta,
            wait_samples,
            self._per_sample_time_s,
            self.switch_cost_s,
            overhead_s,
        )

    # ---------------------------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Ratio, switch-overhead window and per-sample time: everything the decisions depend on.

        Example::

            other = DefaultDynamicSchedulePolicy()
            other.load_state_dict(policy.state_dict())
        """
        state = super().state_dict()
        state["switch_overheads_s"] = list(self._switch_overheads_s)
        state["per_sample_time_s"] = self._per_sample_time_s
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Args:
            state_dict: A mapping from :meth:`state_dict`.
        """
        super().load_state_dict(state_dict)
        if "switch_overheads_s" in state_dict:
            overheads = [finite_state_value(x, "switch_overheads_s") for x in state_dict["switch_overheads_s"]]
            self._switch_overheads_s = deque(overheads, maxlen=SWITCH_OVERHEAD_WINDOW)
        if "per_sample_time_s" in state_dict:
            self._per_sample_time_s = finite_state_value(state_dict["per_sample_time_s"], "per_sample_time_s")
