"""rate_matched never plans to spend more of the staleness budget than ``staleness_threshold`` allows (issue #14.6).

The rollouter admits while ``staleness + group <= max_required_samples``, so a full cycle carries at most
``buffer_samples = max_required_samples - step_required_samples`` samples into the next version. The policy's part:
its deactivate threshold never asks for more than the cycle consumes, and its economic-order top-up (samples it
collects now for the next cycle, i.e. carries over the sync) is at most half of ``buffer_samples``, none without one.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hybrid_rollout.config import derived_counts
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateMatchedDynamicSchedulePolicy, RateScheduleContext

SETTINGS = settings(max_examples=200, deadline=None)


def _cycle(required: int, m: int, staleness: float, queue: list[int], waits: list[int], **kw) -> RateScheduleContext:
    counts = derived_counts(mini_batch_size=required, trigger_parameter_sync_step=m, staleness_threshold=staleness)
    base = {
        "required_samples": required,
        "trigger_parameter_sync_step": m,
        "buffer_samples": counts.buffer_samples,
        "queue_size": queue[-1],
        "step_queue_sizes": queue,
        "step_wait_samples": waits,
        "step_wait_times": [2.0 * w for w in waits],
        "standalone_serving_s": 100.0,
        "standalone_decoded_tokens": 2000.0,
        "cycle_train_compute_s": 40.0,
        "cycle_trained_samples": required * m,
        "cycle_trained_tokens": 100 * required * m,
        "num_standalone_replicas": 1,
        "num_hybrid_replicas": 1,
    }
    base.update(kw)
    return RateScheduleContext(**base)


@st.composite
def measured_cycles(draw: st.DrawFn) -> tuple[RateMatchedDynamicSchedulePolicy, RateScheduleContext, int]:
    required = draw(st.integers(1, 256))
    m = draw(st.integers(1, 8))
    staleness = draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0]))
    policy = RateMatchedDynamicSchedulePolicy(target_slack_fraction=draw(st.floats(0.0, 1.0)))
    ctx = None
    for step in range(1, draw(st.integers(1, 5)) + 1):
        queue = draw(st.lists(st.integers(0, 3 * required * m), min_size=m, max_size=m))
        waits = draw(st.lists(st.integers(0, required), min_size=m, max_size=m))
        ctx = _cycle(
            required,
            m,
            staleness,
            queue,
            waits,
            standalone_decoded_tokens=draw(st.floats(10.0, 1e6)),
            last_activate_duration_s=draw(st.sampled_from([0.0, 0.5, 12.0])),
            last_deactivate_duration_s=draw(st.sampled_from([0.0, 0.5, 10.0])),
        )
        policy.update_after_step(step, ctx)
    assert ctx is not None
    max_required = derived_counts(
        mini_batch_size=required, trigger_parameter_sync_step=m, staleness_threshold=staleness
    ).max_required_samples
    return policy, ctx, max_required


@SETTINGS
@given(measured_cycles())
def test_threshold_and_top_up_stay_within_the_cycle_and_half_the_staleness_budget(case):
    policy, ctx, max_required = case
    fc = policy.forecast(ctx)
    assert fc is not None
    assert 0 <= fc.threshold <= ctx.step_required_samples
    assert policy.deactivate_wait_samples(ctx) == fc.threshold
    assert 0 <= fc.top_up <= ctx.buffer_samples // 2
    # what the policy plans to carry into the next version fits the rollouter's admission bound
    assert ctx.step_required_samples + fc.top_up <= max_required


def test_no_top_up_when_staleness_threshold_is_zero():
    # a small measured deficit (queue 20 -> 14, nothing waited): with a budget the next cycle's switch is bought
    # now; with staleness_threshold 0 every queued sample at the sync would be stale, so nothing is topped up
    def run(staleness: float) -> tuple[int, int]:
        policy = RateMatchedDynamicSchedulePolicy()
        for step in (1, 2, 3):  # switches measured: 12 s + 10 s, worth saving the next cycle's
            cycle = _cycle(10, 4, staleness, [20, 18, 16, 14], [0, 0, 0, 0])
            cycle.last_activate_duration_s, cycle.last_deactivate_duration_s = 12.0, 10.0
            policy.update_after_step(step, cycle)
        fc = policy.forecast(_cycle(10, 4, staleness, [20, 18, 16, 14], [0, 0, 0, 0], queue_size=10))
        assert fc is not None
        return fc.top_up, fc.threshold

    top_up, threshold = run(0.5)
    assert 0 < top_up <= 10  # buffer_samples 20: half of it
    assert run(0.0) == (0, threshold - top_up)


def test_staleness_headroom_is_half_the_buffer_rounded_down():
    assert RateMatchedDynamicSchedulePolicy.staleness_headroom(_cycle(128, 4, 0.5, [0] * 4, [0] * 4)) == 128
    assert RateMatchedDynamicSchedulePolicy.staleness_headroom(_cycle(5, 3, 0.2, [0] * 3, [0] * 3)) == 1  # 3 // 2
    assert RateMatchedDynamicSchedulePolicy.staleness_headroom(_cycle(5, 3, 0.0, [0] * 3, [0] * 3)) == 0
