"""StaticFullyAsyncPolicy and FixedRatioDynamicSchedulePolicy (design/scheduling.md §3.2, §3.3 + design/notes.md §3),
values worked by hand."""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.schedule import (
    DefaultDynamicSchedulePolicy,
    DynamicScheduleContext,
    FixedRatioDynamicSchedulePolicy,
    StaticFullyAsyncPolicy,
)


def ctx100(**kwargs) -> DynamicScheduleContext:
    return DynamicScheduleContext(required_samples=25, trigger_parameter_sync_step=4, **kwargs)  # R = 100


# ------------------------------------------------------------------------------------------ static_fully_async


def test_static_deactivates_at_once_at_every_step_start():
    policy = StaticFullyAsyncPolicy(deactivate_ratio=0.7)
    for step in range(1, 5):
        assert policy.should_deactivate(step, True, ctx100()) is True
        assert policy.should_deactivate(step, False, ctx100()) is False
        assert policy.deactivate_wait_samples(ctx100(total_generated_samples=step * 10)) == 0


@pytest.mark.parametrize(
    "ctx",
    [
        ctx100(),  # huge gap
        ctx100(total_generated_samples=0, expected_samples=400, step_wait_times=[500.0], step_wait_samples=[100]),
        ctx100(total_generated_samples=900, expected_samples=100),
    ],
)
def test_static_never_reactivates_when_standalone_replicas_exist(ctx):
    policy = StaticFullyAsyncPolicy()
    assert policy.should_activate_after_step(4, False, ctx) is False
    assert policy.should_activate_after_step(4, True, ctx) is False


def test_static_has_no_adaptive_state():
    policy = StaticFullyAsyncPolicy(deactivate_ratio=0.4)
    policy.update_after_step(4, ctx100(step_wait_times=[9.0], step_wait_samples=[50], last_activate_duration_s=3.0))
    assert policy.deactivate_ratio == 0.4
    assert policy.state_dict() == {"deactivate_ratio": 0.4}


def test_static_only_hybrid_is_colocated_mode_activating_every_step_and_waiting_for_the_whole_cycle():
    # verl returns False here (nothing would ever generate); the seed promises classic colocated mode
    policy = StaticFullyAsyncPolicy(deactivate_ratio=0.3, only_hybrid=True)
    assert policy.deactivate_ratio == 1.0
    for step in (4, 8, 12):
        surplus_ctx = ctx100(total_generated_samples=step * 100, expected_samples=100)
        assert policy.should_activate_after_step(step, False, surplus_ctx) is True
        assert policy.should_deactivate(step + 1, True, surplus_ctx) is True
        assert policy.deactivate_wait_samples(surplus_ctx) == 100  # step_required_samples = 25 x 4


# ------------------------------------------------------------------------------------------------ fixed_ratio


def test_fixed_ratio_never_adapts_the_ratio():
    policy = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.3)
    for step, (times, samples) in enumerate([([9.0], [50]), ([], []), ([1.0], [1]), ([0.0], [0])], start=1):
        policy.update_after_step(
            step, ctx100(step_wait_times=times, step_wait_samples=samples, last_activate_duration_s=4.0)
        )
        assert policy.deactivate_ratio == 0.3
        assert policy.deactivate_wait_samples(ctx100()) == 30  # int(0.3 x 100)
    assert policy.state_dict() == {"deactivate_ratio": 0.3}


def test_fixed_ratio_deactivates_exactly_when_hybrid_is_active():
    policy = FixedRatioDynamicSchedulePolicy()
    assert policy.should_deactivate(1, True, ctx100()) is True
    assert policy.should_deactivate(1, False, ctx100()) is False


@pytest.mark.parametrize(
    ("surplus", "expected"),
    [(49, True), (50, False), (51, False), (-20, True)],  # threshold 0.5 x 100 = 50: gap 1 / 0 / -1 / 70
)
def test_fixed_ratio_activates_on_a_pure_gap_check(surplus, expected):
    policy = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.5)
    ctx = ctx100(total_generated_samples=100 + surplus, expected_samples=100)
    assert policy.should_activate_after_step(4, False, ctx) is expected


def test_fixed_ratio_has_no_cost_benefit_gate_unlike_default():
    # gap 1 sample at 0.001 s/sample = 0.001 s of benefit, far below the 10 s switch cost:
    # default skips the activation, fixed_ratio activates anyway
    ctx = ctx100(total_generated_samples=149, expected_samples=100, step_wait_times=[0.001], step_wait_samples=[1])
    assert DefaultDynamicSchedulePolicy(deactivate_ratio=0.5).should_activate_after_step(4, False, ctx) is False
    assert FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.5).should_activate_after_step(4, False, ctx) is True


def test_fixed_ratio_only_hybrid_forces_ratio_one_and_always_activates():
    policy = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.2, only_hybrid=True)
    assert policy.deactivate_ratio == 1.0
    assert policy.deactivate_wait_samples(ctx100()) == 100
    assert policy.should_activate_after_step(4, False, ctx100(total_generated_samples=500, expected_samples=100))
