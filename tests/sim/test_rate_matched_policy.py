"""Unit tests of the rate_matched policy's decisions (pure functions of the context and its state)."""

from __future__ import annotations

from lightning_hybrid_rollout.schedule import DynamicScheduleContext, create_policy
from lightning_hybrid_rollout.schedule.rate_matched_policy import (
    RateMatchedDynamicSchedulePolicy,
    RateScheduleContext,
    hindsight_need,
)


def _measured(**kw):
    base = {
        "required_samples": 10,
        "trigger_parameter_sync_step": 4,
        "buffer_samples": 20,
        "standalone_serving_s": 100.0,
        "standalone_decoded_tokens": 2000.0,  # 20 tok/s at 100 tokens/sample: 0.2 samples/s
        "cycle_train_compute_s": 40.0,
        "cycle_trained_samples": 40,
        "cycle_trained_tokens": 4000,  # 1 s of training per sample
        "num_standalone_replicas": 1,
        "num_hybrid_replicas": 1,
    }
    base.update(kw)
    return RateScheduleContext(**base)


def test_registered_and_a_subclass_of_default():
    policy = create_policy("rate_matched")
    assert isinstance(policy, RateMatchedDynamicSchedulePolicy)
    assert policy.should_deactivate(3, True, DynamicScheduleContext()) is True
    assert policy.should_deactivate(3, False, DynamicScheduleContext()) is False


def test_the_start_lends_for_the_pipeline_fill_until_the_first_batch_then_a_measured_shortfall_decides():
    policy = RateMatchedDynamicSchedulePolicy()
    start = RateScheduleContext(required_samples=10, trigger_parameter_sync_step=4)
    assert policy.should_activate_after_step(0, False, start)  # an empty queue, nothing to train yet
    assert policy.deactivate_wait_samples(start) == 10  # the first batch, not the cycle's 40
    policy.update_after_step(0, start)
    ctx = _measured(queue_size=0)
    assert policy.should_activate_after_step(1, False, ctx)
    assert 10 <= policy.deactivate_wait_samples(ctx) <= ctx.step_required_samples


def test_the_pipeline_fill_is_not_learned_as_the_wait_with_hybrid_help():
    # the first cycle's deactivation wait was the fill: 600 s for its 10 samples, engines warming, an empty pipeline
    fill = {"deactivate_wait_s": 600.0, "deactivate_wait_samples": 10, "step_wait_times": [0.0, 20.0, 20.0, 20.0]}
    ctx = _measured(queue_size=0, step_queue_sizes=[10, 6, 3, 0], step_wait_samples=[0, 2, 2, 2], **fill)
    fresh = RateMatchedDynamicSchedulePolicy()
    assert fresh.should_activate_after_step(4, False, ctx)  # 10 s per missing sample idle; help beats it
    fresh.update_after_step(4, ctx)
    assert fresh.state_dict()["hybrid_wait_s_per_sample"] is None
    # the same wait measured in a later cycle is a real one (60 s per sample with help): waiting idle is cheaper
    learned = RateMatchedDynamicSchedulePolicy()
    learned.load_state_dict(fresh.state_dict())
    assert not learned.should_activate_after_step(8, False, ctx)
    learned.update_after_step(8, ctx)
    assert learned.state_dict()["hybrid_wait_s_per_sample"] == 60.0


def test_never_activates_when_standalone_keeps_up():
    policy = RateMatchedDynamicSchedulePolicy()
    # 4 samples/s of standalone production against 1 sample/s of training, a full queue
    ctx = _measured(
        standalone_decoded_tokens=40000.0,
        queue_size=60,
        step_queue_sizes=[60, 70, 80, 90],
        step_wait_samples=[0, 0, 0, 0],
    )
    for step in range(1, 6):
        assert not policy.should_activate_after_step(step, False, ctx)
        policy.update_after_step(step, ctx)


def test_only_hybrid_always_activates_and_waits_for_the_whole_cycle():
    policy = RateMatchedDynamicSchedulePolicy(only_hybrid=True)
    ctx = RateScheduleContext(required_samples=8, trigger_parameter_sync_step=2, only_hybrid=True)
    assert policy.should_activate_after_step(0, False, ctx)
    assert policy.deactivate_wait_samples(ctx) == 16


def test_plain_context_falls_back_to_the_default_policy():
    ours, default = RateMatchedDynamicSchedulePolicy(), create_policy("default")
    ctx = DynamicScheduleContext(
        required_samples=10, trigger_parameter_sync_step=4, step_wait_times=[5.0], step_wait_samples=[10]
    )
    assert ours.should_activate_after_step(1, False, ctx) == default.should_activate_after_step(1, False, ctx)
    ours.update_after_step(1, ctx)
    default.update_after_step(1, ctx)
    assert ours.deactivate_wait_samples(ctx) == default.deactivate_wait_samples(ctx)


def test_hindsight_need_replays_the_cycle_without_its_waits():
    assert hindsight_need([40, 35, 30, 25], [0, 0, 0, 7], 32, 0.0) == 47.0
    assert hindsight_need([10, 20, 30], [22, 12, 2], 32, 2.0) == 10 + 36 + 2.0  # the waits add up
    assert hindsight_need([], [], 32, 0.0) is None


def test_need_follows_rises_fast_and_threshold_tracks_it():
    policy = RateMatchedDynamicSchedulePolicy()
    low = _measured(queue_size=5, step_queue_sizes=[20, 15, 12, 10], step_wait_samples=[0, 0, 0, 0])
    high = _measured(queue_size=5, step_queue_sizes=[20, 10, 10, 10], step_wait_samples=[0, 5, 10, 10])
    for step in range(1, 5):
        policy.update_after_step(step, low)
    before = policy.deactivate_wait_samples(low)
    policy.update_after_step(5, high)
    after = policy.deactivate_wait_samples(high)
    assert after >= before + 12  # the 25 samples it lacked show up within one cycle, mostly


def test_state_dict_round_trip_reproduces_decisions():
    a = RateMatchedDynamicSchedulePolicy()
    for step in range(1, 4):
        ctx = _measured(
            queue_size=3 * step,
            step_queue_sizes=[20, 15, 12, 10],
            step_wait_samples=[0, 0, 1, 2],
            last_activate_duration_s=4.0,
            last_deactivate_duration_s=2.0,
            deactivate_wait_s=30.0,
            deactivate_wait_samples=12,
        )
        a.update_after_step(step, ctx)
    b = RateMatchedDynamicSchedulePolicy()
    b.load_state_dict(a.state_dict())
    probe = _measured(queue_size=7)
    assert b.forecast(probe) == a.forecast(probe)
    assert b.state_dict() == a.state_dict()


def _one_step_cycle(queue_size: int) -> RateScheduleContext:
    """The context after a one-micro-step first cycle (``early_first_sync``): standalone replicas make 0.4
    samples/s, training takes 4 s per sample, so they outproduce the trainer 1.6 times."""
    return _measured(
        standalone_decoded_tokens=4000.0,
        cycle_train_compute_s=40.0,
        cycle_trained_samples=10,
        cycle_trained_tokens=1000,
        queue_size=queue_size,
        step_queue_sizes=[0],
        step_wait_samples=[10],
        step_wait_times=[50.0],
    )


def test_slack_is_not_priced_as_idle_time():
    # a queue of one collection is all the trainer needs when standalone replicas outproduce it: missing slack
    # samples cost no idle time, so they must not pay for a switch (they did through the top-up credit)
    for q in (10, 12):
        policy = RateMatchedDynamicSchedulePolicy()
        fc = policy.forecast(_one_step_cycle(q))
        assert fc is not None and fc.wait_without_s == 0.0 and not fc.activate
        assert not policy.should_activate_after_step(1, False, _one_step_cycle(q))
    # a real shortfall is still weighed: 5 samples short at 5 s each against a 10 s switch
    policy = RateMatchedDynamicSchedulePolicy()
    assert policy.should_activate_after_step(1, False, _one_step_cycle(5))


def test_top_up_needs_a_measured_deficit():
    # without a measured cycle deficit there is no next switch to save: the threshold is not extended
    policy = RateMatchedDynamicSchedulePolicy()
    fc = policy.forecast(_one_step_cycle(5))
    # the feed-forward need: one collection (10) plus the slack (1.5), nothing added for a next cycle
    assert fc is not None and fc.threshold == policy.deactivate_wait_samples(_one_step_cycle(5)) == 12


def test_a_short_cycle_is_not_learned_as_a_need_or_a_deficit():
    policy = RateMatchedDynamicSchedulePolicy()
    policy.update_after_step(2, _one_step_cycle(5))
    assert policy._need.count == 0 and policy._deficit.count == 0
    assert policy._standalone_tok_s is not None  # rates are still learned from it
    full = _measured(queue_size=20, step_queue_sizes=[30, 25, 20, 15], step_wait_samples=[0, 0, 0, 2])
    policy.update_after_step(3, full)
    assert policy._need.count == 1 and policy._deficit.count == 1


def _seconds_scale_cycle() -> RateScheduleContext:
    """A CPU-miniature cycle (benchmarks/cpu_miniature.py): 4 x 256 samples of 16 tokens; standalone replicas make
    ~270 samples/s, training takes ~1.6 ms per sample, the trainer waited ~2.7 s for ~860 samples."""
    return _measured(
        required_samples=256,
        buffer_samples=1536,
        queue_size=40,
        step_queue_sizes=[0, 10, 20, 30],
        step_wait_samples=[256, 246, 236, 226],
        step_wait_times=[0.75, 0.65, 0.65, 0.65],
        standalone_serving_s=3.8,
        standalone_decoded_tokens=16400.0,
        cycle_train_compute_s=1.6,
        cycle_trained_samples=1024,
        cycle_trained_tokens=16400,
    )


def test_an_untried_switch_does_not_veto_a_seconds_scale_shortfall():
    # the seed's 10 s switch-cost prior would outweigh the whole cycle's 2.7 s of waiting, so hybrid help would
    # never be tried, never measured, and the trainer's devices would idle for the whole run
    policy = RateMatchedDynamicSchedulePolicy()
    ctx = _seconds_scale_cycle()
    fc = policy.forecast(ctx)
    assert fc is not None and 2.0 < fc.wait_without_s < 10.0
    assert fc.activate and policy.should_activate_after_step(1, False, ctx)
    assert fc.threshold > 2 * ctx.required_samples  # it collects for most of the cycle, not for nothing
    # once measured, a switch that costs more than the wait it saves vetoes the next activation
    expensive = _seconds_scale_cycle()
    expensive.last_activate_duration_s, expensive.last_deactivate_duration_s = 3.0, 2.0
    policy.update_after_step(1, expensive)
    assert not policy.should_activate_after_step(2, False, _seconds_scale_cycle())


def test_the_gate_margin_scales_with_the_wait():
    ctx = _seconds_scale_cycle()
    fc = RateMatchedDynamicSchedulePolicy().forecast(ctx)
    assert fc is not None and fc.activate
    # a margin of most of the wait vetoes the same activation; an absolute margin adds on top
    assert not RateMatchedDynamicSchedulePolicy(gate_margin_fraction=0.9).forecast(ctx).activate
    assert not RateMatchedDynamicSchedulePolicy(gate_margin_s=fc.wait_without_s).forecast(ctx).activate
