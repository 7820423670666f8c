"""The ``"rate_matched"`` policy: deactivate threshold and activation gate from what the last cycles measured (the
samples the trainer really needed, what a switch really costs); its rules are in docs/policies.md.

Example::

    from lightning_hybrid_rollout.schedule import create_policy
    from lightning_hybrid_rollout.schedule.rate_matched_policy import RateScheduleContext

    policy = create_policy("rate_matched")
    ctx = RateScheduleContext(required_samples=32, trigger_parameter_sync_step=4)
    assert policy.should_activate_after_step(0, False, ctx)  # the pipeline fill: the trainer has nothing to do
    assert policy.deactivate_wait_samples(ctx) == 32  # so the hybrid replicas help until the first batch is queued
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from lightning_hybrid_rollout.schedule.base import DynamicScheduleContext, finite_state_value, register_policy
from lightning_hybrid_rollout.schedule.default_policy import DefaultDynamicSchedulePolicy

logger = logging.getLogger(__name__)

__all__ = ["CycleForecast", "RateMatchedDynamicSchedulePolicy", "RateScheduleContext", "lending_size"]


@dataclass
class RateScheduleContext(DynamicScheduleContext):
    """The seed's context plus the measurements ``rate_matched`` needs (all default to "not measured").

    Every ``cycle``/window field covers the latest sync cycle: from the previous ``after_sync`` to this one.

    Args:
        queue_size: Samples in the message queue at the decision.
        step_queue_sizes: Per collection of the latest cycle (parallel to ``step_wait_samples``): queue size when
            the collection started.
        cycle_train_compute_s: Trainer compute seconds in the cycle (sum of the design/scheduling.md §4.1 compute
        timings).
        cycle_trained_samples: Samples trained in the cycle.
        cycle_trained_tokens: Response tokens of the samples trained in the cycle.
        standalone_serving_s: Seconds of the cycle during which standalone replicas were serving (not paused for
            a weight sync).
        standalone_decoded_tokens: Tokens the standalone replicas decoded in the cycle.
        hybrid_serving_s: Seconds of the cycle during which hybrid replicas were serving (routable, awake).
        hybrid_decoded_tokens: Tokens the hybrid replicas decoded in the cycle (aborted segments included).
        deactivate_wait_s: Seconds the trainer waited in the cycle for the deactivate threshold (hybrid generating).
        deactivate_wait_samples: Samples that reached the queue during that wait.
        num_standalone_replicas: Standalone replicas (0 = unknown).
        num_hybrid_replicas: Hybrid replicas (0 = unknown).
        last_hybrid_sync_s: Seconds of the cycle's ``sync_weights`` calls (written by the controller at
            ``after_sync``, before ``update_after_step``; 0 when it synced nothing, e.g. prepared by ``overlap_sync``).
        last_activated_replicas: Hybrid replicas the cycle's activation lent (written by the controller; 0: none).

    Example::

        ctx = RateScheduleContext(required_samples=8, standalone_serving_s=10.0, standalone_decoded_tokens=2e4)
        assert ctx.step_required_samples == 8
    """

    queue_size: int = 0
    step_queue_sizes: list[int] = field(default_factory=list)
    cycle_train_compute_s: float = 0.0
    cycle_trained_samples: int = 0
    cycle_trained_tokens: int = 0
    standalone_serving_s: float = 0.0
    standalone_decoded_tokens: float = 0.0
    hybrid_serving_s: float = 0.0
    hybrid_decoded_tokens: float = 0.0
    deactivate_wait_s: float = 0.0
    deactivate_wait_samples: int = 0
    num_standalone_replicas: int = 0
    num_hybrid_replicas: int = 0
    last_hybrid_sync_s: float = 0.0
    last_activated_replicas: int = 0


@dataclass(frozen=True)
class CycleForecast:
    """What the policy expects of the next cycle (for logs, tests and the simulator's report).

    Args:
        standalone_rate: Predicted standalone-only production, samples/s.
        total_rate: Predicted production with hybrid replicas active, samples/s.
        train_s_per_sample: Predicted trainer seconds per sample.
        threshold: Deactivate threshold (samples).
        wait_without_s: Predicted trainer wait over the cycle without hybrid help.
        cost_with_s: Predicted activation + hybrid wait + deactivation with hybrid help.
        activate: The gate's answer.
        top_up: Samples of ``threshold`` that are the economic-order top-up for the next cycle (0 when not
            topped up); at most ``buffer_samples // 2``, the share of the staleness budget the policy may spend.
    """

    standalone_rate: float
    total_rate: float
    train_s_per_sample: float
    threshold: int
    wait_without_s: float
    cost_with_s: float
    activate: bool
    top_up: int = 0


class _Holt:
    """Holt's linear exponential smoothing: a level and a trend, forecast one cycle ahead.

    ``alpha_up`` (default ``alpha``) weighs observations above the forecast: a larger value follows rises faster.
    """

    def __init__(self, alpha: float, beta: float, alpha_up: float | None = None) -> None:
        self.alpha = alpha
        self.alpha_up = alpha if alpha_up is None else alpha_up
        self.beta = beta
        self.level: float | None = None
        self.trend = 0.0
        self.count = 0

    def peek(self, x: float) -> tuple[float, float]:
        """(level, trend) after observing ``x``, without storing them."""
        if self.level is None:
            return x, 0.0
        prev = self.level + self.trend
        a = self.alpha_up if x > prev else self.alpha
        level = a * x + (1 - a) * prev
        if self.count < 2:  # the first difference is the first trend estimate
            return level, level - self.level
        return level, self.beta * (level - self.level) + (1 - self.beta) * self.trend

    def update(self, x: float) -> None:
        """Observe ``x``."""
        self.level, self.trend = self.peek(x)
        self.count += 1

    def forecast(self, fresh: float | None = None) -> float | None:
        """The next value (after ``fresh`` if given); None before any observation."""
        if fresh is not None:
            level, trend = self.peek(fresh)
            return level + (trend if self.count >= 1 else 0.0)
        if self.level is None:
            return None
        return self.level + self.trend

    def state(self) -> list[float | None]:
        return [self.level, self.trend, float(self.count)]

    def load(self, state: list[float | None]) -> None:
        level, trend, count = state
        self.level = None if level is None else finite_state_value(level, "level")
        self.trend = finite_state_value(trend if trend is not None else 0.0, "trend")
        self.count = int(count or 0)


def hindsight_need(queue_sizes: list[int], wait_samples: list[int], required: int, target_slack: float) -> float | None:
    """Queue size the first collection of a finished cycle would have needed to wait for nothing (plus a slack).

    The trainer's queue at each collection start (``queue_sizes``) and the samples it had to wait for
    (``wait_samples``) are replayed without the waits: a wait of ``w`` samples also added ``w`` to every later
    queue, so the waitless queue before collection ``j`` is ``q_j − Σ_{i<j} w_i``. The need is the first queue
    minus the smallest waitless surplus over ``required``, plus ``target_slack``.

    Example::

        assert hindsight_need([40, 35, 30, 25], [0, 0, 0, 7], 32, 0.0) == 47.0  # q_4 = 25 is 7 short
    """
    if not queue_sizes or len(queue_sizes) != len(wait_samples):
        return None
    waited = 0
    worst = math.inf
    for q, w in zip(queue_sizes, wait_samples):
        worst = min(worst, q - waited - required)
        waited += w
    return queue_sizes[0] - worst + target_slack


@register_policy("rate_matched")
class RateMatchedDynamicSchedulePolicy(DefaultDynamicSchedulePolicy):
    """Deactivate threshold and activation gate from measured needs and rates (docs/policies.md).

    Args:
        deactivate_ratio: Initial ratio of the ``default`` fallback (plain context only).
        only_hybrid: Colocated mode: always activate, wait for the whole cycle.
        target_slack_fraction: Samples, as a fraction of ``required_samples``, the queue should still hold above
            a collection's need at the tightest point of a cycle.
        smoothing: Weight of the newest cycle in the rate averages and the length/deficit forecasts, in (0, 1].
        trend_smoothing: Trend weight of the length/deficit forecasts, in [0, 1].
        need_smoothing: Weight of a newest need below the forecast (falls), in (0, 1].
        need_trend_smoothing: Trend weight of the need forecast, in [0, 1].
        need_rise_smoothing: Weight of a newest need above the forecast (rises), in (0, 1].
        gate_margin_s: Seconds by which hybrid help must beat waiting alone before the gate activates (on top of
            ``gate_margin_fraction``).
        gate_margin_fraction: Share of the predicted idle wait by which hybrid help must beat it before the gate
            activates (a margin that scales from seconds-long CPU cycles to hour-long cluster cycles), in [0, 1).
        min_deactivate_ratio: As for ``default`` (bounds the mirrored ``deactivate_ratio``).
        partial_lending: Lend k of the n hybrid replicas (:meth:`activate_replica_count`), k sized from the
            forecast shortfall and the measured per-replica sync cost; False (the default): all or nothing.

    Example::

        policy = RateMatchedDynamicSchedulePolicy()
        ctx = RateScheduleContext(required_samples=10, trigger_parameter_sync_step=4, queue_size=0,
                                  standalone_serving_s=100.0, standalone_decoded_tokens=2000.0,
                                  cycle_train_compute_s=40.0, cycle_trained_samples=40, cycle_trained_tokens=4000)
        assert policy.should_activate_after_step(1, False, ctx)  # 0.2 samples/s cannot feed 1 sample/s
    """

    def __init__(
        self,
        deactivate_ratio: float = 0.3,
        only_hybrid: bool = False,
        *,
        target_slack_fraction: float = 0.15,
        smoothing: float = 0.3,
        trend_smoothing: float = 0.2,
        need_smoothing: float = 0.3,
        need_trend_smoothing: float = 0.2,
        need_rise_smoothing: float = 0.8,
        gate_margin_s: float = 0.0,
        gate_margin_fraction: float = 0.1,
        min_deactivate_ratio: float = 0.05,
        partial_lending: bool = False,
    ) -> None:
        super().__init__(deactivate_ratio, only_hybrid, min_deactivate_ratio=min_deactivate_ratio)
        self.partial_lending = bool(partial_lending)
        if not 0.0 < smoothing <= 1.0 or not 0.0 <= trend_smoothing <= 1.0:
            raise ValueError(
                f"smoothing must be in (0, 1] and trend_smoothing in [0, 1], got {smoothing}, {trend_smoothing}"
            )
        if target_slack_fraction < 0 or gate_margin_s < 0:
            raise ValueError(
                f"target_slack_fraction and gate_margin_s must be >= 0, got {target_slack_fraction}, {gate_margin_s}"
            )
        self.target_slack_fraction = float(target_slack_fraction)
        if not 0.0 <= gate_margin_fraction < 1.0:
            raise ValueError(f"gate_margin_fraction must be in [0, 1), got {gate_margin_fraction}")
        self.gate_margin_s = float(gate_margin_s)
        self.gate_margin_fraction = float(gate_margin_fraction)
        self._smoothing = float(smoothing)
        self._standalone_tok_s: float | None = None  # tokens/s decoded by standalone replicas while serving
        self._hybrid_ratio: float | None = None  # hybrid tokens/s over standalone tokens/s
        self._train_s_per_tok: float | None = None  # trainer seconds per response token
        self._length = _Holt(smoothing, trend_smoothing)  # mean response length of a cycle's trained samples
        # queue needed at a cycle's first collection; follows rises fast (waiting costs more than over-collecting)
        self._need = _Holt(need_smoothing, need_trend_smoothing, need_rise_smoothing)
        self._activate_s: float | None = None
        self._deactivate_s: float | None = None
        self._deficit = _Holt(smoothing, trend_smoothing)  # samples a cycle consumes beyond what standalone adds
        self._wait_s_per_sample: float | None = None  # marginal seconds per missing sample, hybrid asleep
        self._hybrid_wait_s_per_sample: float | None = None  # seconds per sample while waiting with hybrid help
        # per lent replica, seconds of its weight sync (the sync is taken to scale with the replicas synced)
        self._sync_s_per_replica: float | None = None
        # hybrid replicas lent during the window the next context measures (0: all, or unknown)
        self._window_replicas = 0
        self._cycles_learned = 0  # 0: the context's deactivation wait is the pipeline fill

    # ------------------------------------------------------------------------------------------------ helpers

    @staticmethod
    def _rich(ctx: DynamicScheduleContext) -> bool:
        return isinstance(ctx, RateScheduleContext)

    @staticmethod
    def _cycle_length(ctx: RateScheduleContext) -> float | None:
        if ctx.cycle_trained_samples > 0 and ctx.cycle_trained_tokens > 0:
            return ctx.cycle_trained_tokens / ctx.cycle_trained_samples
        return None

    @staticmethod
    def _cycle_deficit(ctx: RateScheduleContext) -> float | None:
        """Samples the finished cycle consumed beyond what arrived: queue drop over the cycle + samples waited for.

        Measured from the first collection to the sync, when only standalone replicas serve.
        """
        if not ctx.step_queue_sizes or len(ctx.step_queue_sizes) != len(ctx.step_wait_samples):
            return None
        if len(ctx.step_wait_samples) != ctx.trigger_parameter_sync_step:
            return None  # a shorter cycle (e.g. an early first sync) says little about a full one's deficit
        return float(ctx.step_queue_sizes[0] - ctx.queue_size + sum(ctx.step_wait_samples))

    def _ema(self, old: float | None, new: float, weight: float = 1.0) -> float:
        a = self._smoothing * min(1.0, max(0.0, weight))
        return new if old is None else (1 - a) * old + a * new

    def _estimates(self, ctx: RateScheduleContext) -> dict[str, float | None]:
        """Stored estimates blended with the fresh cycle in ``ctx`` (no state change)."""
        est: dict[str, float | None] = {
            "standalone_tok_s": self._standalone_tok_s,
            "hybrid_ratio": self._hybrid_ratio,
            "train_s_per_tok": self._train_s_per_tok,
            "length": self._length.forecast(),
        }
        if ctx.standalone_serving_s > 0 and ctx.standalone_decoded_tokens > 0:
            standalone_tok_s = ctx.standalone_decoded_tokens / ctx.standalone_serving_s
            est["standalone_tok_s"] = self._ema(self._standalone_tok_s, standalone_tok_s)
        if ctx.hybrid_serving_s > 0 and ctx.hybrid_decoded_tokens > 0 and est["standalone_tok_s"]:
            # a short hybrid window (ramping up) says little: weigh it by its share of the cycle's serving time
            weight = ctx.hybrid_serving_s / max(ctx.standalone_serving_s, ctx.hybrid_serving_s)
            ratio = ctx.hybrid_decoded_tokens / ctx.hybrid_serving_s / est["standalone_tok_s"]
            ratio *= self._lent_scale(ctx)  # k of n served: the estimates are kept for all n
            est["hybrid_ratio"] = self._ema(self._hybrid_ratio, ratio, weight)
        if ctx.cycle_train_compute_s > 0 and ctx.cycle_trained_tokens > 0:
            est["train_s_per_tok"] = self._ema(
                self._train_s_per_tok, ctx.cycle_train_compute_s / ctx.cycle_trained_tokens
            )
        length = self._cycle_length(ctx)
        if length is not None:
            est["length"] = self._length.forecast(length)
        est["deficit"] = self._deficit.forecast()
        observed = self._cycle_deficit(ctx)
        if observed is not None:
            est["deficit"] = self._deficit.forecast(observed)
        est["wait_s_per_sample"] = self._wait_s_per_sample
        wait_s, wait_n = sum(ctx.step_wait_times), sum(ctx.step_wait_samples)
        if wait_s > 0 and wait_n > 0:
            est["wait_s_per_sample"] = self._ema(self._wait_s_per_sample, wait_s / wait_n)
        est["hybrid_wait_s_per_sample"] = self._hybrid_wait_s_per_sample
        # the first cycle's wait is the pipeline fill (engines warming, an empty queue), not a steady-state wait
        filled = self._cycles_learned > 0
        if filled and ctx.deactivate_wait_s > 0 and ctx.deactivate_wait_samples >= ctx.required_samples:
            per_sample = ctx.deactivate_wait_s / ctx.deactivate_wait_samples
            scale, ratio = self._lent_scale(ctx), est["hybrid_ratio"]
            if scale > 1.0 and ratio:  # waited with k of n lent: the all-n wait per sample is shorter
                per_sample *= (1.0 + ratio / scale) / (1.0 + ratio)
            est["hybrid_wait_s_per_sample"] = self._ema(self._hybrid_wait_s_per_sample, per_sample)
        return est

    def _lent_scale(self, ctx: RateScheduleContext) -> float:
        """``n / k`` for a window in which k of the n hybrid replicas served (1.0: all, or unknown)."""
        n, k = ctx.num_hybrid_replicas, self._window_replicas
        return n / k if 0 < k < n else 1.0

    def _switch_s(self) -> tuple[float, float]:
        # An untried switch is priced as free: no fixed prior fits every scale, and the first activation measures it.
        act = self._activate_s if self._activate_s is not None else 0.0
        deact = self._deactivate_s if self._deactivate_s is not None else 0.0
        return act, deact

    def _feedforward_need(self, ctx: DynamicScheduleContext, ps: float, c: float) -> float:
        """Queue needed at the first collection if standalone replicas alone feed the rest of the cycle."""
        R, m = ctx.required_samples, ctx.trigger_parameter_sync_step
        return max(j * R - ps * (j - 1) * R * c for j in range(1, m + 1)) + self.target_slack_fraction * R

    def forecast(self, ctx: DynamicScheduleContext, queue_size: int | None = None) -> CycleForecast | None:
        """Predict the next cycle from the stored state and the fresh cycle in ``ctx`` (no state change).

        None while the standalone rate or the training speed is unknown.

        Args:
            ctx: The decision context (a :class:`RateScheduleContext`).
            queue_size: Queue size to start from (default: ``ctx.queue_size``).
        """
        if not self._rich(ctx):
            return None
        assert isinstance(ctx, RateScheduleContext)
        est = self._estimates(ctx)
        tok_s, length, train_s_per_tok = est["standalone_tok_s"], est["length"], est["train_s_per_tok"]
        if tok_s is None or length is None or train_s_per_tok is None or tok_s <= 0 or length <= 0:
            return None
        ps = tok_s / length
        c = train_s_per_tok * length
        ratio = est["hybrid_ratio"]
        if ratio is None:
            ns, nh = ctx.num_standalone_replicas, ctx.num_hybrid_replicas
            ratio = nh / ns if ns > 0 and nh > 0 else 1.0
        ph = ps * max(0.0, ratio)
        R = ctx.required_samples
        act, deact = self._switch_s()
        need_first = self._need.forecast()
        if need_first is None:
            need_first = self._feedforward_need(ctx, ps, c)
        need_first = min(float(ctx.step_required_samples), max(float(R), need_first))
        threshold = math.ceil(min(float(ctx.step_required_samples), max(0.0, need_first - ps * deact)))
        q = float(ctx.queue_size if queue_size is None else queue_size)
        K = float(ctx.step_required_samples)
        # Seconds per missing sample, at the marginal rates measured while waiting (slower than nominal: the short
        # samples are done by then).
        idle_s = max(est["wait_s_per_sample"] or 1.0 / ps, 1.0 / ps)
        hybrid_s = est["hybrid_wait_s_per_sample"] or idle_s * ps / (ps + ph)
        # Option "idle": standalone replicas alone make up the deficit. The slack is a margin, not priced as idle.
        deficit = max(0.0, need_first - self.target_slack_fraction * R - q)
        wait_without = deficit * idle_s

        def activation_cost(theta: float) -> float:
            # standalone replicas keep producing during the activation; the wait has hybrid help
            return act + deact + max(0.0, theta - q - ps * act) * hybrid_s

        # Option "activate": top the queue up to the threshold.
        cost_with = activation_cost(threshold)
        # Option "activate and top up one more cycle" (economic order quantity), inside the staleness headroom and
        # only for a measured deficit: crediting an unmeasured one would activate for the slack alone.
        measured_deficit = max(0.0, est["deficit"] or 0.0)
        next_deficit = measured_deficit + self.target_slack_fraction * R
        top_up = 0
        if measured_deficit > 0:
            extra = math.ceil(next_deficit)
            if extra <= self.staleness_headroom(ctx) and threshold + extra <= K:
                avoided = min(next_deficit * idle_s, act + deact + next_deficit * hybrid_s)
                extended_cost = activation_cost(threshold + extra) - avoided
                if extended_cost < cost_with:
                    threshold, cost_with, top_up = threshold + extra, extended_cost, extra
        activate = deficit > 0 and wait_without * (1.0 - self.gate_margin_fraction) > cost_with + self.gate_margin_s
        return CycleForecast(ps, ps + ph, c, threshold, wait_without, cost_with, activate, top_up)

    @staticmethod
    def staleness_headroom(ctx: DynamicScheduleContext) -> int:
        """Samples the economic-order top-up may plan to carry into the next version: ``buffer_samples // 2``.

        Half of the staleness budget; the rest absorbs the requests in flight at the sync and the forecast's error.

        Args:
            ctx: The decision context.

        Example::

            ctx = RateScheduleContext(required_samples=128, trigger_parameter_sync_step=4, buffer_samples=256)
            assert RateMatchedDynamicSchedulePolicy.staleness_headroom(ctx) == 128
        """
        return max(0, int(ctx.buffer_samples)) // 2

    # ---------------------------------------------------------------------------------------------- decisions

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """The forecast threshold; before the first cycle is measured, the first batch (``required_samples``: the
        pipeline fill), later the ``default`` rule (``int(R × ratio)``) while the forecast has no rates.

        Args:
            ctx: The decision context.
        """
        if self.only_hybrid:
            return ctx.step_required_samples
        fc = self.forecast(ctx)
        if fc is None:
            if self._cycles_learned == 0 and self._rich(ctx):
                # the pipeline fill: the trainer has nothing to train until its first batch, so the hybrid replicas
                # help until that batch is queued and not longer (whether the standalones keep up is not known yet)
                return ctx.required_samples
            return super().deactivate_wait_samples(ctx)
        return fc.threshold

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """True if ``only_hybrid``; the ``default`` gate while nothing is measured (the start decision: an empty
        queue lends the hybrid replicas for the pipeline fill); else the forecast's gate.

        With a plain :class:`DynamicScheduleContext` (no rate fields) the ``default`` gate decides.

        Args:
            global_steps: The current global step.
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context.
        """
        if self.only_hybrid:
            return True
        if not self._rich(ctx):
            return super().should_activate_after_step(global_steps, is_hybrid_active, ctx)
        fc = self.forecast(ctx)
        if fc is None:
            logger.debug("rate_matched step=%d: nothing measured yet, the default gate decides", global_steps)
            return super().should_activate_after_step(global_steps, is_hybrid_active, ctx)
        logger.debug("rate_matched step=%d forecast %s", global_steps, fc)
        return fc.activate

    def activate_replica_count(self, global_steps: int, ctx: DynamicScheduleContext, num_hybrid_replicas: int) -> int:
        """With ``partial_lending``: the k that minimises the predicted per-replica sync plus the wait; else all.

        ``cost(k) = k × sync_s_per_replica + W × s(k)``, where ``W`` is the shortfall the wait must cover (the
        forecast threshold minus the queue and what standalone replicas add during the activation) and ``s(k)`` the
        seconds per waited sample with k lent, ``idle_s × ps / (ps + k × ph / n)`` (:meth:`forecast`'s rates).
        All n until a sync was measured; ties go to the larger k.

        Args:
            global_steps: The step that just synced.
            ctx: The decision context (a :class:`RateScheduleContext`; a plain one lends all).
            num_hybrid_replicas: ``n``.
        """
        n = num_hybrid_replicas
        if not self.partial_lending or self.only_hybrid or n <= 1 or self._sync_s_per_replica is None:
            return n
        fc = self.forecast(ctx)
        if fc is None or not self._rich(ctx):
            return n
        assert isinstance(ctx, RateScheduleContext)
        act, _ = self._switch_s()
        ps, ph = fc.standalone_rate, max(0.0, fc.total_rate - fc.standalone_rate)
        shortfall = max(0.0, fc.threshold - ctx.queue_size - ps * act)
        k = lending_size(n, shortfall, ps, ph / n, self._sync_s_per_replica, self._estimates(ctx)["wait_s_per_sample"])
        logger.debug(
            "rate_matched step=%d: lend %d of %d hybrid replicas (shortfall %.0f)", global_steps, k, n, shortfall
        )
        return k

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        """Fold the cycle's rates, switch durations and hindsight need into the forecasts.

        Args:
            global_steps: The current global step; nothing is learned when it is <= 0.
            ctx: The decision context, with this cycle's switch durations filled in by the controller.
        """
        if self.only_hybrid or global_steps <= 0:
            return
        if not self._rich(ctx):
            super().update_after_step(global_steps, ctx)
            return
        assert isinstance(ctx, RateScheduleContext)
        est = self._estimates(ctx)
        self._cycles_learned += 1
        self._standalone_tok_s = est["standalone_tok_s"]
        self._hybrid_ratio = est["hybrid_ratio"]
        self._train_s_per_tok = est["train_s_per_tok"]
        self._wait_s_per_sample = est["wait_s_per_sample"]
        self._hybrid_wait_s_per_sample = est["hybrid_wait_s_per_sample"]
        length = self._cycle_length(ctx)
        if length is not None:
            self._length.update(length)
        a = self._smoothing
        if ctx.last_activate_duration_s > 0:
            act = ctx.last_activate_duration_s
            self._activate_s = act if self._activate_s is None else (1 - a) * self._activate_s + a * act
        if ctx.last_deactivate_duration_s > 0:
            deact = ctx.last_deactivate_duration_s
            self._deactivate_s = deact if self._deactivate_s is None else (1 - a) * self._deactivate_s + a * deact
        if ctx.last_hybrid_sync_s > 0 and ctx.last_activated_replicas > 0:
            per = ctx.last_hybrid_sync_s / ctx.last_activated_replicas
            self._sync_s_per_replica = (
                per if self._sync_s_per_replica is None else (1 - a) * self._sync_s_per_replica + a * per
            )
        self._window_replicas = ctx.last_activated_replicas  # who serves in the window the next context measures
        overhead_s = ctx.last_activate_duration_s + ctx.last_deactivate_duration_s
        if overhead_s > 0:
            self._switch_overheads_s.append(float(overhead_s))
        # the first cycle starts from an empty pipeline: its need says nothing about the steady state
        if global_steps > 1 and len(ctx.step_wait_samples) == ctx.trigger_parameter_sync_step:
            observed = self._cycle_deficit(ctx)
            if observed is not None:
                self._deficit.update(observed)
            need = hindsight_need(
                list(ctx.step_queue_sizes),
                list(ctx.step_wait_samples),
                ctx.required_samples,
                self.target_slack_fraction * ctx.required_samples,
            )
            if need is not None:
                self._need.update(need)
        fc = self.forecast(ctx)
        if fc is not None:
            ratio = fc.threshold / ctx.step_required_samples
            self.deactivate_ratio = min(1.0, max(self.min_deactivate_ratio, ratio))

    # ---------------------------------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The default policy's state plus the forecasters and the switch-duration averages."""
        state = super().state_dict()
        state.update(
            {
                "standalone_tok_s": self._standalone_tok_s,
                "hybrid_ratio": self._hybrid_ratio,
                "train_s_per_tok": self._train_s_per_tok,
                "length": self._length.state(),
                "need": self._need.state(),
                "deficit": self._deficit.state(),
                "activate_s": self._activate_s,
                "deactivate_s": self._deactivate_s,
                "wait_s_per_sample": self._wait_s_per_sample,
                "hybrid_wait_s_per_sample": self._hybrid_wait_s_per_sample,
                "sync_s_per_replica": self._sync_s_per_replica,
                "window_replicas": self._window_replicas,
                "cycles_learned": self._cycles_learned,
            }
        )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Args:
            state_dict: A mapping from :meth:`state_dict`.
        """
        super().load_state_dict(state_dict)
        for key in ("length", "need", "deficit"):
            if key in state_dict:
                getattr(self, f"_{key}").load(list(state_dict[key]))
        for key in (
            "standalone_tok_s",
            "hybrid_ratio",
            "train_s_per_tok",
            "activate_s",
            "deactivate_s",
            "wait_s_per_sample",
            "hybrid_wait_s_per_sample",
            "sync_s_per_replica",
        ):
            if key in state_dict:
                value = state_dict[key]
                setattr(self, f"_{key}", None if value is None else finite_state_value(value, key))
        self._window_replicas = int(state_dict.get("window_replicas", 0))
        self._cycles_learned = int(state_dict.get("cycles_learned", 1 if self._standalone_tok_s is not None else 0))


def lending_size(
    n: int,
    shortfall: float,
    standalone_rate: float,
    hybrid_rate_per_replica: float,
    sync_s_per_replica: float,
    idle_s_per_sample: float | None = None,
) -> int:
    """The k in [1, n] that minimises ``k × sync_s_per_replica + shortfall × s(k)`` (ties: the larger k).

    ``s(k) = idle_s × ps / (ps + k × ph1)`` seconds per sample waited for with k replicas lent, ``idle_s`` the
    measured seconds per sample with none (default ``1 / ps``).

    Example::

        assert lending_size(4, 0.0, 1.0, 1.0, 5.0) == 1  # nothing to wait for: one replica is the cheapest
        assert lending_size(4, 1000.0, 1.0, 1.0, 5.0) == 4  # a long wait: every replica helps
    """
    if n <= 1 or standalone_rate <= 0:
        return max(1, n)
    idle_s = max(idle_s_per_sample or 0.0, 1.0 / standalone_rate)
    best_k, best = n, math.inf
    for k in range(n, 0, -1):
        cost = k * sync_s_per_replica + shortfall * idle_s * standalone_rate / (
            standalone_rate + k * hybrid_rate_per_replica
        )
        if cost < best - 1e-9:
            best_k, best = k, cost
    return best_k
