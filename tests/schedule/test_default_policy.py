"""DefaultDynamicSchedulePolicy, on scripted scenarios whose expected values are worked out by hand from the seed's
rules (design/scheduling.md §3.1 + design/notes.md §3), never by calling the code under test."""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.schedule import ActivationEstimate, DefaultDynamicSchedulePolicy, DynamicScheduleContext

R100 = {"required_samples": 25, "trigger_parameter_sync_step": 4}  # step_required_samples = 100


def ctx100(**kwargs) -> DynamicScheduleContext:
    return DynamicScheduleContext(**R100, **kwargs)


def test_default_deactivates_exactly_when_hybrid_is_active():
    policy = DefaultDynamicSchedulePolicy()
    assert policy.should_deactivate(3, True, ctx100()) is True
    assert policy.should_deactivate(3, False, ctx100()) is False


def test_default_wait_threshold_is_int_of_ratio_times_step_required_samples():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    ctx = DynamicScheduleContext(required_samples=32, trigger_parameter_sync_step=4)
    assert ctx.step_required_samples == 128
    assert policy.deactivate_wait_samples(ctx) == 38  # int(38.4)


def test_default_ratio_grows_by_clipped_shortfall_and_caps_at_one():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    # (waited-for samples per collection, expected ratio after the update); R = 100
    script = [
        ([1], 0.52),  # 1/100 = 0.01 -> clipped up to 0.02
        ([3, 2], 0.57),  # 5/100 = 0.05 -> taken as is
        ([40], 0.67),  # 0.4 -> clipped down to 0.1
        ([10, 0, 0, 0], 0.77),  # 0.1 exactly
        ([50], 0.87),
        ([50], 0.97),
        ([50], 1.0),  # 0.97 + 0.1 -> capped at 1.0
        ([50], 1.0),
    ]
    for step, (wait_samples, expected) in enumerate(script, start=1):
        policy.update_after_step(
            step, ctx100(step_wait_times=[1.0] * len(wait_samples), step_wait_samples=wait_samples)
        )
        assert policy.deactivate_ratio == pytest.approx(expected), f"step {step}"
    assert policy.deactivate_ratio == 1.0
    assert policy.deactivate_wait_samples(ctx100()) == 100


def test_default_ratio_shrinks_by_002_without_real_waits_down_to_the_lower_bound():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.1)  # min_deactivate_ratio defaults to 0.05
    # waits that served only backlog (wait samples 0) do not count as a shortfall
    no_wait = ctx100(step_wait_times=[0.5, 0.0], step_wait_samples=[0, 0])
    for step, expected in enumerate([0.08, 0.06, 0.05, 0.05, 0.05], start=1):  # 0.06 - 0.02 = 0.04 -> 0.05
        policy.update_after_step(step, no_wait)
        assert policy.deactivate_ratio == pytest.approx(expected)
    assert policy.min_deactivate_ratio == 0.05


def test_default_lower_bound_is_configurable():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.1, min_deactivate_ratio=0.07)
    for step, expected in enumerate([0.08, 0.07, 0.07], start=1):
        policy.update_after_step(step, ctx100())
        assert policy.deactivate_ratio == pytest.approx(expected)


def test_default_initial_ratio_below_the_lower_bound_is_rejected():
    with pytest.raises(ValueError, match=r"must be >= min_deactivate_ratio \(0.05\).*got 0.01"):
        DefaultDynamicSchedulePolicy(deactivate_ratio=0.01)


def test_default_ratio_does_not_drift_when_steps_cancel_out():
    # in raw floats 0.3 - 0.02 + 0.02 == 0.29999999999999993 and int(100 * that) == 29
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3)
    policy.update_after_step(1, ctx100())  # no wait: -0.02
    policy.update_after_step(2, ctx100(step_wait_times=[1.0], step_wait_samples=[2]))  # 2/100 = 0.02: +0.02
    assert policy.deactivate_ratio == 0.3
    assert policy.deactivate_wait_samples(ctx100()) == 30


def test_default_update_is_skipped_at_step_zero_or_below():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    for step in (0, -1):
        policy.update_after_step(
            step, ctx100(step_wait_times=[8.0], step_wait_samples=[4], last_activate_duration_s=5.0)
        )
    assert policy.deactivate_ratio == 0.5
    assert policy.switch_cost_s == 10.0
    assert policy.per_sample_time_s == 1000.0


def test_default_only_hybrid_forces_ratio_one_always_activates_and_never_adapts():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.3, only_hybrid=True)
    assert policy.deactivate_ratio == 1.0
    # no gap at all (surplus 500 >= 1.0 * 100), yet colocated mode must generate: activate
    assert policy.should_activate_after_step(1, False, ctx100(total_generated_samples=600, expected_samples=100))
    policy.update_after_step(1, ctx100(step_wait_times=[8.0], step_wait_samples=[4], last_activate_duration_s=5.0))
    policy.update_after_step(2, ctx100())
    assert policy.deactivate_ratio == 1.0
    assert policy.switch_cost_s == 10.0
    assert policy.per_sample_time_s == 1000.0
    assert policy.deactivate_wait_samples(ctx100()) == 100


def test_default_does_not_activate_without_a_gap():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)  # threshold 50 samples
    assert not policy.should_activate_after_step(1, False, ctx100(total_generated_samples=150, expected_samples=100))
    assert not policy.should_activate_after_step(1, False, ctx100(total_generated_samples=170, expected_samples=100))
    # one sample short: gap 1 x 1000 s (pessimistic, no signal yet) > 10 s fallback
    assert policy.should_activate_after_step(1, False, ctx100(total_generated_samples=149, expected_samples=100))


def test_default_uses_a_pessimistic_1000s_per_sample_before_any_signal():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    est = policy.estimate_activation(ctx100(total_generated_samples=149, expected_samples=100))
    # gap = 0.5 x 100 - 49 = 1 sample; 1 x 1000 s = 1000 s > 10 s fallback
    assert est == ActivationEstimate(
        gap_samples=1.0, per_sample_time_s=1000.0, benefit_s=1000.0, switch_cost_s=10.0, activate=True
    )


@pytest.mark.parametrize(("ratio", "expected"), [(0.009, False), (0.01, False), (0.011, True)])
def test_default_pessimistic_gate_flips_where_gap_times_1000s_crosses_10s(ratio, expected):
    # R = 1, no surplus: gap = ratio samples -> benefit = ratio x 1000 s = 9 / 10 / 11 s against the 10 s fallback
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=ratio, min_deactivate_ratio=0.001)
    assert policy.should_activate_after_step(1, False, DynamicScheduleContext()) is expected


@pytest.mark.parametrize(
    ("wait_time_s", "expected"),
    [(3.8, False), (4.0, False), (4.2, True)],  # per-sample 1.9 / 2.0 / 2.1 s x gap 5 = 9.5 / 10 / 10.5 s vs 10 s
)
def test_default_gate_flips_exactly_where_benefit_crosses_the_10s_fallback(wait_time_s, expected):
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    # gap = 0.5 x 100 - (145 - 100) = 5; this cycle's signal: wait_time_s over 2 waited-for samples
    ctx = ctx100(
        total_generated_samples=145, expected_samples=100, step_wait_times=[wait_time_s], step_wait_samples=[2]
    )
    assert policy.should_activate_after_step(4, False, ctx) is expected


def test_default_switch_cost_is_the_mean_of_the_last_three_positive_overheads():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    assert policy.switch_cost_s == 10.0  # no history
    # (activate s, deactivate s) per cycle; (0, 0) means no switch this cycle and must not enter the window
    overheads = [(1.0, 2.0), (0.0, 0.0), (4.0, 2.0), (5.0, 4.0), (0.0, 0.0), (10.0, 2.0)]
    expected_costs = [3.0, 3.0, 4.5, 6.0, 6.0, 9.0]  # windows [3], [3], [3,6], [3,6,9], [3,6,9], [6,9,12]
    for step, ((act, deact), cost) in enumerate(zip(overheads, expected_costs), start=1):
        policy.update_after_step(step, ctx100(last_activate_duration_s=act, last_deactivate_duration_s=deact))
        assert policy.switch_cost_s == pytest.approx(cost)
    assert policy.switch_overheads_s == (6.0, 9.0, 12.0)


@pytest.mark.parametrize(("wait_time_s", "expected"), [(8.8, False), (9.0, False), (9.2, True)])
def test_default_gate_flips_where_benefit_crosses_the_learned_switch_cost(wait_time_s, expected):
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    for step, overhead in enumerate([6.0, 9.0, 12.0], start=1):  # switch cost = 9 s
        policy.update_after_step(step, ctx100(last_activate_duration_s=overhead, step_wait_samples=[1]))
    # three increases of 0.02 (1/100 clipped up): ratio 0.56, threshold 56; surplus 55 -> gap 1
    assert policy.deactivate_ratio == pytest.approx(0.56)
    ctx = ctx100(
        total_generated_samples=155, expected_samples=100, step_wait_times=[wait_time_s], step_wait_samples=[1]
    )
    assert policy.should_activate_after_step(4, False, ctx) is expected


def test_default_per_sample_time_is_kept_when_a_cycle_has_no_fresh_signal():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    policy.update_after_step(1, ctx100(step_wait_times=[4.0, 2.0], step_wait_samples=[2, 1]))
    assert policy.per_sample_time_s == 2.0  # 6 s / 3 samples
    # waited time without waited-for samples, waited-for samples without time, nothing at all: no fresh signal
    for step, (times, samples) in enumerate([([5.0], [0]), ([0.0], [4]), ([], [])], start=2):
        policy.update_after_step(step, ctx100(step_wait_times=times, step_wait_samples=samples))
        assert policy.per_sample_time_s == 2.0
    # ratio: 0.5 +0.03 (3/100) -0.02 (no waited-for samples) +0.04 (4/100) -0.02 = 0.53
    # the gate uses the kept 2.0 s: gap = 53 - 48 = 5 -> 10 s, not > 10 s
    assert policy.deactivate_ratio == pytest.approx(0.53)
    assert not policy.should_activate_after_step(6, False, ctx100(total_generated_samples=148, expected_samples=100))
    # gap 6 -> 12 s > 10 s
    assert policy.should_activate_after_step(6, False, ctx100(total_generated_samples=147, expected_samples=100))


def test_default_gate_prefers_this_cycles_signal_over_the_stored_one_without_mutating_it():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    # gap 5; this cycle's signal 0.1 s/sample -> 0.5 s < 10 s (the stored 1000 s would say activate)
    ctx = ctx100(total_generated_samples=145, expected_samples=100, step_wait_times=[0.2], step_wait_samples=[2])
    assert not policy.should_activate_after_step(1, False, ctx)
    assert policy.per_sample_time_s == 1000.0  # deciding changed nothing; update_after_step stores it
    policy.update_after_step(1, ctx)
    assert policy.per_sample_time_s == pytest.approx(0.1)


def test_default_multi_cycle_scenario_worked_by_hand():
    # R = 16 x 2 = 32, initial ratio 0.25, min 0.05
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.25)
    base = {"required_samples": 16, "trigger_parameter_sync_step": 2}

    # cycle 1: surplus 40 - 32 = 8, gap = 0.25 x 32 - 8 = 0 -> no activation
    c1 = DynamicScheduleContext(
        **base, total_generated_samples=40, expected_samples=32, step_wait_times=[1.5, 0.5], step_wait_samples=[3, 1]
    )
    assert not policy.should_activate_after_step(2, False, c1)
    policy.update_after_step(2, c1)  # per-sample 2/4 = 0.5 s; 4/32 = 0.125 -> +0.1 -> 0.35; no overhead
    assert policy.deactivate_ratio == pytest.approx(0.35)
    assert policy.per_sample_time_s == 0.5
    assert policy.switch_cost_s == 10.0

    # cycle 2: surplus 6, gap = 11.2 - 6 = 5.2; no signal -> 0.5 s -> 2.6 s < 10 s -> no activation
    c2 = DynamicScheduleContext(**base, total_generated_samples=70, expected_samples=64)
    assert not policy.should_activate_after_step(4, False, c2)
    policy.update_after_step(4, c2)  # no real wait: -0.02 -> 0.33
    assert policy.deactivate_ratio == pytest.approx(0.33)

    # cycle 3: surplus -6, gap = 10.56 + 6 = 16.56; fresh 4.0 s/sample -> 66.24 s > 10 s -> activate
    c3 = DynamicScheduleContext(
        **base, total_generated_samples=90, expected_samples=96, step_wait_times=[4.0], step_wait_samples=[1]
    )
    assert policy.estimate_activation(c3).benefit_s == pytest.approx(66.24)
    assert policy.should_activate_after_step(6, False, c3)
    c3.last_activate_duration_s, c3.last_deactivate_duration_s = 2.0, 1.0
    policy.update_after_step(6, c3)  # overhead 3 -> cost 3; per-sample 4.0; 1/32 = 0.03125 -> 0.36125
    assert policy.deactivate_ratio == pytest.approx(0.36125)
    assert policy.switch_cost_s == 3.0
    assert policy.per_sample_time_s == 4.0

    # cycle 4: hybrid was activated, so deactivate at int(32 x 0.36125) = int(11.56) = 11 samples
    c4 = DynamicScheduleContext(**base, total_generated_samples=130, expected_samples=128)
    assert policy.should_deactivate(7, True, c4)
    assert policy.deactivate_wait_samples(c4) == 11
    # gap = 11.56 - 2 = 9.56; kept 4.0 s -> 38.24 s > 3 s -> activate
    assert policy.should_activate_after_step(8, False, c4)


def test_default_state_dict_round_trip_restores_every_decision_input():
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.4)
    policy.update_after_step(1, ctx100(step_wait_times=[3.0], step_wait_samples=[6], last_activate_duration_s=7.0))
    state = policy.state_dict()
    assert state == {"deactivate_ratio": pytest.approx(0.46), "switch_overheads_s": [7.0], "per_sample_time_s": 0.5}
    fresh = DefaultDynamicSchedulePolicy(deactivate_ratio=0.4)
    fresh.load_state_dict(state)
    assert (fresh.deactivate_ratio, fresh.switch_cost_s, fresh.per_sample_time_s) == (
        policy.deactivate_ratio,
        7.0,
        0.5,
    )


def test_default_load_state_dict_rejects_a_bad_ratio():
    with pytest.raises(ValueError, match=r"must be in \(0, 1\], got 1.5"):
        DefaultDynamicSchedulePolicy().load_state_dict({"deactivate_ratio": 1.5})


def test_default_threshold_follows_decimal_arithmetic_not_float_noise():
    # int(0.29 * 100) == 28 in raw floats; the seed's formula means 29
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.29)
    assert policy.deactivate_wait_samples(ctx100()) == 29
    # threshold 29, surplus 29: no gap, so no activation even with the pessimistic 1000 s per sample
    assert not policy.should_activate_after_step(1, False, ctx100(total_generated_samples=129, expected_samples=100))
