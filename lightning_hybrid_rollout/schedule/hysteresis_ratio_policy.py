"""The ``"hysteresis_ratio"`` policy: verl v1's ``separate_async`` switch rule, as a baseline to compare against.

Reproduces ``_switch_threshold``, ``_adapt_switch_threshold``, ``_effective_switch_cost`` and the step hooks of
``verl/trainer/ppo/v1/trainer_separate_async.py`` with the defaults of ``HybridRolloutSwitchConfig`` (verl-project/verl
890dfc3ebdd5, PR #7373): a threshold ratio moved with a 2-cycle hysteresis and a benefit gate scaled by the hybrid
share. Its rules, and where and why it differs from verl's code, are in docs/policies.md.

Example::

    from lightning_hybrid_rollout.schedule import DynamicScheduleContext, create_policy

    policy = create_policy("hysteresis_ratio")
    ctx = DynamicScheduleContext(required_samples=16, trigger_parameter_sync_step=4)
    assert policy.deactivate_wait_samples(ctx) == 26  # round(0.4 × 64) = 26, within [16, 64]
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
)
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateScheduleContext

logger = logging.getLogger(__name__)

__all__ = ["HysteresisRatioDynamicSchedulePolicy", "SwitchDecision"]

_RATIO_DECIMALS = 12


def switch_threshold(ratio: float, ctx: DynamicScheduleContext) -> int:
    """verl's ``_switch_threshold``: ``clamp(round(ratio × B), one mini-batch, B)`` with ``B = step_required_samples``.

    Args:
        ratio: The threshold ratio.
        ctx: The decision context.

    Example::

        ctx = DynamicScheduleContext(required_samples=16, trigger_parameter_sync_step=4)
        assert [switch_threshold(r, ctx) for r in (0.5, 1.0, 0.01)] == [32, 64, 16]
    """
    batch = ctx.step_required_samples
    target = round(ratio * batch)
    return min(max(target, ctx.required_samples), batch)


@dataclass(frozen=True)
class SwitchDecision:
    """The numbers behind one gate decision of :class:`HysteresisRatioDynamicSchedulePolicy` (verl's decision metrics).

    Args:
        ratio: The threshold ratio the decision used (this cycle's adaptation applied).
        threshold: ``clamp(round(ratio × B), b, B)``.
        queue: Samples buffered for the next cycle.
        remaining: ``max(0, threshold − queue)``.
        per_sample_time_s: Cumulative wait seconds per waited sample; None before any.
        scaling_factor: ``(hybrid + standalone) / standalone``; None when unknown.
        benefit_s: ``remaining × per_sample_time × (1 − 1 / scaling)``; None when an input is unknown.
        switch_cost_s: Mean activation + mean deactivation duration; None until both were measured.
        had_idle: Whether the cycle just finished counted as idle.
        activate: The gate's answer.
    """

    ratio: float
    threshold: int
    queue: int
    remaining: int
    per_sample_time_s: float | None
    scaling_factor: float | None
    benefit_s: float | None
    switch_cost_s: float | None
    had_idle: bool
    activate: bool


@dataclass(frozen=True)
class _Adapted:
    """The adaptive state after folding in one cycle (what ``update_after_step`` stores)."""

    ratio: float
    idle_steps: int
    calm_steps: int
    wait_seconds: float
    wait_samples: int
    had_idle: bool


@register_policy("hysteresis_ratio")
class HysteresisRatioDynamicSchedulePolicy(DynamicSchedulePolicyBase):
    """verl v1 ``separate_async``'s switch rule: a threshold ratio moved with hysteresis, a scaled benefit gate.

    Reproduces verl's ``PPOTrainerSeparateAsync`` step switch (``verl/trainer/ppo/v1/trainer_separate_async.py``,
    verl-project/verl 890dfc3ebdd5, 2026-08); see the module docstring for the rules and the differences. The
    arguments are verl's ``HybridRolloutSwitchConfig`` fields, with its defaults.

    Args:
        deactivate_ratio: Initial threshold ratio in (0, 1] (verl's ``switch_threshold_ratio``, 0.4).
        only_hybrid: No standalone replicas: always activate, wait for the whole cycle, never adapt.
        adaptive_switch_threshold: Adapt the ratio from idle and calm cycles.
        switch_threshold_step_up: Ratio increase after sustained idle cycles.
        switch_threshold_step_down: Ratio decrease after sustained calm cycles.
        switch_threshold_release_steps: Consecutive idle (or calm) cycles before the ratio moves (>= 1).
        switch_cost_window_size: Recent activation (and deactivation) durations the switch cost averages (>= 1).
        idle_wait_s: A cycle is idle when the trainer waited longer than this in total (verl: the replay buffer's
            ``poll_interval``, 2 s).
        scaling_factor: ``(hybrid + standalone) / standalone`` capacity; None: from the context's replica counts.

    Example::

        policy = HysteresisRatioDynamicSchedulePolicy(deactivate_ratio=0.5)
        ctx = DynamicScheduleContext(required_samples=16, trigger_parameter_sync_step=4, step_wait_times=[3.0])
        policy.update_after_step(1, ctx)  # idle once: the hysteresis holds the ratio
        policy.update_after_step(2, ctx)  # idle twice: +0.05
        assert policy.deactivate_ratio == 0.55
    """

    def __init__(
        self,
        deactivate_ratio: float = 0.4,
        only_hybrid: bool = False,
        *,
        adaptive_switch_threshold: bool = True,
        switch_threshold_step_up: float = 0.05,
        switch_threshold_step_down: float = 0.03,
        switch_threshold_release_steps: int = 2,
        switch_cost_window_size: int = 3,
        idle_wait_s: float = 2.0,
        scaling_factor: float | None = None,
    ) -> None:
        super().__init__(deactivate_ratio, only_hybrid)
        if switch_threshold_step_up < 0 or switch_threshold_step_down < 0:
            raise ValueError(
                f"switch_threshold_step_up and switch_threshold_step_down must be >= 0, got "
                f"{switch_threshold_step_up}, {switch_threshold_step_down}"
            )
        if int(switch_threshold_release_steps) < 1 or int(switch_cost_window_size) < 1:
            raise ValueError(
                f"switch_threshold_release_steps and switch_cost_window_size must be >= 1, got "
                f"{switch_threshold_release_steps}, {switch_cost_window_size}"
            )
        if idle_wait_s < 0:
            raise ValueError(f"idle_wait_s must be >= 0, got {idle_wait_s}")
        if scaling_factor is not None and not scaling_factor >= 1.0:
            raise ValueError(f"scaling_factor must be >= 1 (hybrid + standalone over standalone), got {scaling_factor}")
        self.adaptive_switch_threshold = bool(adaptive_switch_threshold)
        self.switch_threshold_step_up = float(switch_threshold_step_up)
        self.switch_threshold_step_down = float(switch_threshold_step_down)
        self.switch_threshold_release_steps = int(switch_threshold_release_steps)
        self.switch_cost_window_size = int(switch_cost_window_size)
        self.idle_wait_s = float(idle_wait_s)
        self.scaling_factor = None if scaling_factor is None else float(scaling_factor)
        self._idle_steps = 0
        self._calm_steps = 0
        self._wait_seconds = 0.0
        self._wait_samples = 0
        self._activate_costs_s: deque[float] = deque(maxlen=self.switch_cost_window_size)
        self._deactivate_costs_s: deque[float] = deque(maxlen=self.switch_cost_window_size)

    # ------------------------------------------------------------------------------------------- read-only state

    @property
    def idle_steps(self) -> int:
        """Consecutive idle cycles counted (saturates at ``switch_threshold_release_steps``)."""
        return self._idle_steps

    @property
    def calm_steps(self) -> int:
        """Consecutive calm cycles counted (saturates at ``switch_threshold_release_steps``)."""
        return self._calm_steps

    @property
    def per_sample_time_s(self) -> float | None:
        """Cumulative wait seconds per waited sample; None before any cycle had both."""
        return self._wait_seconds / self._wait_samples if self._wait_samples > 0 else None

    @property
    def switch_cost_s(self) -> float | None:
        """Mean recent activation + mean recent deactivation duration; None until both were measured."""
        if not self._activate_costs_s or not self._deactivate_costs_s:
            return None
        act = sum(self._activate_costs_s) / len(self._activate_costs_s)
        return act + sum(self._deactivate_costs_s) / len(self._deactivate_costs_s)

    # ------------------------------------------------------------------------------------------------ helpers

    def _adapted(self, ctx: DynamicScheduleContext) -> _Adapted:
        """The state after folding in the cycle in ``ctx`` (verl's ``on_step_end`` up to the decision); no change."""
        wait_s = float(sum(ctx.step_wait_times))
        wait_n = int(sum(ctx.step_wait_samples))
        had_idle = wait_s > self.idle_wait_s
        seconds, samples = self._wait_seconds, self._wait_samples
        if wait_n > 0 and wait_s > 0:
            seconds, samples = seconds + wait_s, samples + wait_n
        ratio, idle, calm = self.deactivate_ratio, self._idle_steps, self._calm_steps
        release = self.switch_threshold_release_steps
        if self.adaptive_switch_threshold:
            if had_idle:
                calm, idle = 0, min(idle + 1, release)
                if idle >= release:
                    ratio = min(1.0, round(ratio + self.switch_threshold_step_up, _RATIO_DECIMALS))
            else:
                idle, calm = 0, min(calm + 1, release)
                if calm >= release:
                    floor = 1.0 / ctx.trigger_parameter_sync_step
                    ratio = max(floor, round(ratio - self.switch_threshold_step_down, _RATIO_DECIMALS))
        return _Adapted(ratio, idle, calm, seconds, samples, had_idle)

    @staticmethod
    def _queue(ctx: DynamicScheduleContext) -> int:
        if isinstance(ctx, RateScheduleContext):
            return int(ctx.queue_size)
        return int(ctx.total_generated_samples - ctx.expected_samples)

    def _scaling(self, ctx: DynamicScheduleContext) -> float | None:
        if self.scaling_factor is not None:
            return self.scaling_factor
        if isinstance(ctx, RateScheduleContext) and ctx.num_standalone_replicas > 0 and ctx.num_hybrid_replicas > 0:
            return (ctx.num_hybrid_replicas + ctx.num_standalone_replicas) / ctx.num_standalone_replicas
        return None

    def decide(self, global_steps: int, ctx: DynamicScheduleContext) -> SwitchDecision:
        """The gate's numbers, without changing any state (``only_hybrid`` is not considered here).

        After a cycle (``global_steps > 0``) the cycle in ``ctx`` is folded in first (idle flag, wait totals,
        ratio), as verl does before deciding; the start decision (``global_steps <= 0``) uses the state as it is.

        Args:
            global_steps: The step that just synced (0: the start decision).
            ctx: The decision context.
        """
        if global_steps > 0:
            nxt = self._adapted(ctx)
        else:
            nxt = _Adapted(
                self.deactivate_ratio, self._idle_steps, self._calm_steps, self._wait_seconds, self._wait_samples, False
            )
        threshold = switch_threshold(nxt.ratio, ctx)
        queue = self._queue(ctx)
        remaining = max(0, threshold - queue)
        per_sample = nxt.wait_seconds / nxt.wait_samples if nxt.wait_samples > 0 else None
        scaling = self._scaling(ctx)
        benefit = None
        if per_sample is not None and scaling is not None:
            benefit = remaining * per_sample * (1.0 - 1.0 / scaling)
        cost = self.switch_cost_s
        activate = remaining > 0 and (benefit is None or cost is None or benefit > cost)
        return SwitchDecision(
            nxt.ratio, threshold, queue, remaining, per_sample, scaling, benefit, cost, nxt.had_idle, activate
        )

    # ------------------------------------------------------------------------------------------------ decisions

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        """Deactivate whenever the hybrid replicas are active (once the queue holds the threshold).

        Args:
            global_steps: The current global step.
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context (unused).
        """
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """``clamp(round(ratio × step_required_samples), required_samples, step_required_samples)``.

        Args:
            ctx: The decision context.
        """
        return switch_threshold(self.deactivate_ratio, ctx)

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """True if ``only_hybrid``; else verl's gate (see :meth:`decide`).

        Args:
            global_steps: The step that just synced (0: the start decision).
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context.
        """
        if self.only_hybrid:
            return True
        d = self.decide(global_steps, ctx)
        logger.debug("hysteresis_ratio step=%d gate: %s", global_steps, d)
        return d.activate

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        """Record the cycle's switch durations; after a cycle (``global_steps > 0``) fold it in (see :meth:`decide`).

        Args:
            global_steps: The step that just synced (0: the start decision, which only records an activation).
            ctx: The decision context, with this cycle's switch durations filled in by the controller.
        """
        if self.only_hybrid:
            return
        if ctx.last_activate_duration_s > 0:
            self._activate_costs_s.append(float(ctx.last_activate_duration_s))
        if ctx.last_deactivate_duration_s > 0:
            self._deactivate_costs_s.append(float(ctx.last_deactivate_duration_s))
        if global_steps <= 0:
            return
        nxt = self._adapted(ctx)
        self.deactivate_ratio = nxt.ratio
        self._idle_steps, self._calm_steps = nxt.idle_steps, nxt.calm_steps
        self._wait_seconds, self._wait_samples = nxt.wait_seconds, nxt.wait_samples
        logger.debug(
            "hysteresis_ratio step=%d: ratio=%.4f idle=%s (idle_steps=%d calm_steps=%d) per_sample_time=%s",
            global_steps,
            self.deactivate_ratio,
            nxt.had_idle,
            self._idle_steps,
            self._calm_steps,
            self.per_sample_time_s,
        )

    # ---------------------------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Ratio, hysteresis counts, cumulative wait totals and the switch-cost windows.

        Example::

            other = HysteresisRatioDynamicSchedulePolicy()
            other.load_state_dict(HysteresisRatioDynamicSchedulePolicy().state_dict())
        """
        state = super().state_dict()
        state.update(
            {
                "idle_steps": self._idle_steps,
                "calm_steps": self._calm_steps,
                "wait_seconds": self._wait_seconds,
                "wait_samples": self._wait_samples,
                "activate_costs_s": list(self._activate_costs_s),
                "deactivate_costs_s": list(self._deactivate_costs_s),
            }
        )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Args:
            state_dict: A mapping from :meth:`state_dict`.
        """
        super().load_state_dict(state_dict)
        for key in ("idle_steps", "calm_steps", "wait_samples"):
            if key in state_dict:
                value = int(state_dict[key])
                if value < 0:
                    raise ValueError(f"{key} must be >= 0, got {value}")
                setattr(self, f"_{key}", value)
        if "wait_seconds" in state_dict:
            self._wait_seconds = finite_state_value(state_dict["wait_seconds"], "wait_seconds")
        for key in ("activate_costs_s", "deactivate_costs_s"):
            if key in state_dict:
                values = [finite_state_value(x, key) for x in state_dict[key]]
                setattr(self, f"_{key}", deque(values, maxlen=self.switch_cost_window_size))
