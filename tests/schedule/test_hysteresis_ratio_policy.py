"""``hysteresis_ratio``: verl v1 ``separate_async``'s switch rule (verl-project/verl 890dfc3ebdd5, PR #7373).

Expected values come from verl's rule and from the cases of its CPU tests
(``tests/trainer/ppo/v1/test_separate_async_step_switch_on_cpu.py``, mirrored below with verl's fixture: a batch of
64 = 4 mini-batches of 16, 2×8 trainer GPUs and 2×8 rollout GPUs, so the scaling factor is 2; ``step_down`` 0.025 and a
1 s poll interval where verl's fixture sets them), worked out by hand, never by calling the code under test.
"""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.schedule import (
    DynamicResourceController,
    DynamicScheduleContext,
    HysteresisRatioDynamicSchedulePolicy,
    available_policies,
    create_policy,
    get_policy_class,
)
from lightning_hybrid_rollout.schedule import hysteresis_ratio_policy as module
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateScheduleContext
from tests.schedule.doubles import FakeClock, RecordingPool
from tests.schedule.test_docs_examples import example_blocks

BATCH = {"required_samples": 16, "trigger_parameter_sync_step": 4}  # verl's train_batch_size 64, mini-batch 16


def ctx(queue: int = 0, wait_s: float = 0.0, wait_samples: int = 0, **kwargs) -> RateScheduleContext:
    """A cycle's context: ``queue`` buffered, the trainer waited ``wait_s`` for ``wait_samples`` samples."""
    return RateScheduleContext(
        **BATCH,
        queue_size=queue,
        step_wait_times=[wait_s],
        step_wait_samples=[wait_samples],
        num_standalone_replicas=kwargs.pop("standalone", 4),
        num_hybrid_replicas=kwargs.pop("hybrid", 4),
        **kwargs,
    )


def verl_fixture(ratio: float = 0.25, adaptive: bool = False, **kwargs) -> HysteresisRatioDynamicSchedulePolicy:
    """verl's ``_trainer()`` fixture: step_up 0.05, step_down 0.025, release 2, window 3, poll interval 1 s."""
    return HysteresisRatioDynamicSchedulePolicy(
        ratio,
        adaptive_switch_threshold=adaptive,
        switch_threshold_step_up=0.05,
        switch_threshold_step_down=0.025,
        switch_threshold_release_steps=2,
        switch_cost_window_size=3,
        idle_wait_s=1.0,
        **kwargs,
    )


def run_cycles(policy, waits: list[float]) -> list[float]:
    """verl's ``_run_step``: one global step per wait (seconds the trainer waited); the ratio after each."""
    ratios = []
    for step, wait_s in enumerate(waits, start=1):
        policy.update_after_step(step, ctx(wait_s=wait_s))
        ratios.append(policy.deactivate_ratio)
    return ratios


# ------------------------------------------------------------------------------------------------ registration


def test_registered_under_its_name_with_verls_defaults():
    assert "hysteresis_ratio" in available_policies()
    assert get_policy_class("hysteresis_ratio") is HysteresisRatioDynamicSchedulePolicy
    policy = create_policy("hysteresis_ratio")
    # verl's HybridRolloutSwitchConfig: switch_threshold_ratio 0.4, adaptive, +0.05 / -0.03, release 2, window 3;
    # the replay buffer's poll_interval 2.0 s
    assert policy.deactivate_ratio == 0.4
    assert policy.adaptive_switch_threshold is True
    assert (policy.switch_threshold_step_up, policy.switch_threshold_step_down) == (0.05, 0.03)
    assert (policy.switch_threshold_release_steps, policy.switch_cost_window_size) == (2, 3)
    assert policy.idle_wait_s == 2.0 and policy.scaling_factor is None
    assert "verl" in (HysteresisRatioDynamicSchedulePolicy.__doc__ or "")
    assert "trainer_separate_async.py" in (module.__doc__ or "")


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_rejects_a_ratio_outside_the_unit_interval(ratio):  # verl: ..._rejects_a_ratio_outside_the_unit_interval
    with pytest.raises(ValueError, match="must be in"):
        HysteresisRatioDynamicSchedulePolicy(ratio)


@pytest.mark.parametrize("window", [0, -1])
def test_rejects_a_nonpositive_cost_window(window):  # verl: ..._rejects_nonpositive_cost_window
    with pytest.raises(ValueError, match="switch_cost_window_size"):
        HysteresisRatioDynamicSchedulePolicy(switch_cost_window_size=window)


def test_rejects_bad_knobs():
    with pytest.raises(ValueError, match="switch_threshold_release_steps"):
        HysteresisRatioDynamicSchedulePolicy(switch_threshold_release_steps=0)
    with pytest.raises(ValueError, match="step_up"):
        HysteresisRatioDynamicSchedulePolicy(switch_threshold_step_down=-0.01)
    with pytest.raises(ValueError, match="scaling_factor"):
        HysteresisRatioDynamicSchedulePolicy(scaling_factor=0.5)


# ------------------------------------------------------------------------------------------------- threshold


@pytest.mark.parametrize(
    ("ratio", "sync_steps", "expected"),
    [(0.5, 4, 32), (1.0, 4, 64), (0.01, 4, 16), (0.25, 1, 64)],  # verl's cases, same numbers
)
def test_threshold_is_clamped_between_one_mini_batch_and_the_batch(ratio, sync_steps, expected):
    policy = HysteresisRatioDynamicSchedulePolicy(ratio)
    c = DynamicScheduleContext(required_samples=64 // sync_steps, trigger_parameter_sync_step=sync_steps)
    assert policy.deactivate_wait_samples(c) == expected


def test_threshold_rounds_like_python():
    c = DynamicScheduleContext(**BATCH)
    assert HysteresisRatioDynamicSchedulePolicy(0.4).deactivate_wait_samples(c) == 26  # round(25.6)
    assert HysteresisRatioDynamicSchedulePolicy(0.3).deactivate_wait_samples(c) == 19  # round(19.2)
    c = DynamicScheduleContext(required_samples=1, trigger_parameter_sync_step=10)
    assert HysteresisRatioDynamicSchedulePolicy(0.25).deactivate_wait_samples(c) == 2  # round(2.5): to even


def test_deactivates_exactly_when_hybrid_is_active():
    policy = HysteresisRatioDynamicSchedulePolicy()
    assert policy.should_deactivate(3, True, ctx()) is True
    assert policy.should_deactivate(3, False, ctx()) is False


# -------------------------------------------------------------------------------- adaptive ratio (hysteresis)


def test_adaptive_threshold_increases_after_trainer_idle():  # verl: same name
    assert run_cycles(verl_fixture(0.5, adaptive=True), [2.0] * 3) == pytest.approx([0.5, 0.55, 0.6])


def test_adaptive_threshold_decreases_after_calm_release_interval():  # verl: same name
    assert run_cycles(verl_fixture(0.5, adaptive=True), [0.0] * 4) == pytest.approx([0.5, 0.475, 0.45, 0.425])


def test_threshold_direction_change_resets_hysteresis():  # verl: same name
    policy = verl_fixture(0.5, adaptive=True)
    run_cycles(policy, [0.0, 0.0, 0.0, 2.0, 0.0])
    assert policy.deactivate_ratio == pytest.approx(0.45)


def test_alternating_idle_and_calm_does_not_move_threshold():  # verl: same name
    policy = verl_fixture(0.5, adaptive=True)
    run_cycles(policy, [2.0, 0.0] * 4)
    assert policy.deactivate_ratio == pytest.approx(0.5)


def test_default_steps_are_plus_005_and_minus_003_after_two_cycles():
    policy = HysteresisRatioDynamicSchedulePolicy()  # 0.4, idle above 2 s
    assert run_cycles(policy, [5.0, 5.0, 5.0, 0.0, 0.0, 0.0]) == pytest.approx([0.4, 0.45, 0.5, 0.5, 0.47, 0.44])
    # exactly the poll interval is not idle (strictly greater); float noise does not accumulate
    policy = HysteresisRatioDynamicSchedulePolicy()
    assert run_cycles(policy, [2.0, 2.0, 2.5, 2.5]) == [0.4, 0.37, 0.37, 0.42]


def test_ratio_is_clamped_to_one_mini_batch_and_one():
    policy = HysteresisRatioDynamicSchedulePolicy(0.3)  # floor 1 / trigger_parameter_sync_step = 0.25
    assert run_cycles(policy, [0.0] * 5) == pytest.approx([0.3, 0.27, 0.25, 0.25, 0.25])
    policy = HysteresisRatioDynamicSchedulePolicy(0.97)
    assert run_cycles(policy, [9.0] * 4) == pytest.approx([0.97, 1.0, 1.0, 1.0])


def test_not_adaptive_keeps_the_ratio_but_reports_idle():  # verl: test_trainer_idle_is_reported
    policy = verl_fixture(0.5)
    decision = policy.decide(1, ctx(wait_s=2.0))
    assert decision.had_idle and decision.threshold == 32
    policy.update_after_step(1, ctx(wait_s=2.0))
    assert policy.deactivate_ratio == 0.5


def test_start_decision_does_not_adapt():
    policy = HysteresisRatioDynamicSchedulePolicy(0.5, switch_threshold_release_steps=1)
    policy.update_after_step(0, ctx(wait_s=9.0))
    assert policy.deactivate_ratio == 0.5 and policy.idle_steps == 0


# ------------------------------------------------------------------------------------------------------- gate


def test_cold_start_lends_whenever_the_queue_is_short():  # verl: test_step_lends_the_engine_out_...
    policy = verl_fixture()  # ratio 0.25: threshold 16
    assert policy.should_activate_after_step(0, False, ctx(queue=0))  # the start decision
    assert policy.should_activate_after_step(1, False, ctx(queue=15))
    d = policy.decide(1, ctx(queue=15))
    assert (d.remaining, d.per_sample_time_s, d.switch_cost_s, d.benefit_s) == (1, None, None, None)


def test_inventory_gate_skips_lending_when_the_target_is_already_buffered():  # verl: same name
    policy = verl_fixture()
    d = policy.decide(1, ctx(queue=16))
    assert d.remaining == 0 and not d.activate
    assert not policy.should_activate_after_step(1, False, ctx(queue=40))


def _measured(wait_s: float) -> HysteresisRatioDynamicSchedulePolicy:
    """verl's cost-gate setup: 1 waited sample took ``wait_s``; one activation of 3 s, one deactivation of 4 s."""
    policy = verl_fixture()
    policy.load_state_dict(
        {"wait_seconds": wait_s, "wait_samples": 1, "activate_costs_s": [3.0], "deactivate_costs_s": [4.0]}
    )
    return policy


def test_cost_gate_skips_lending_when_the_remaining_work_is_cheaper_to_fill_on_standalone():  # verl: same name
    d = _measured(2.0).decide(1, ctx(queue=15))
    # benefit = remaining × per_sample_time × (1 − 1/scaling) = 1 × 2.0 × 0.5 = 1.0 < 3 + 4
    assert (d.remaining, d.per_sample_time_s, d.scaling_factor) == (1, 2.0, 2.0)
    assert (d.benefit_s, d.switch_cost_s, d.activate) == (1.0, 7.0, False)


def test_cost_gate_lends_when_the_remaining_work_is_more_expensive_than_the_switch():  # verl: same name
    d = _measured(16.0).decide(1, ctx(queue=15))
    assert (d.benefit_s, d.activate) == (8.0, True)  # 1 × 16 × 0.5 = 8 > 7
    assert not _measured(14.0).decide(1, ctx(queue=15)).activate  # 7 is not > 7: strictly greater


def test_switch_cost_window_forgets_cold_start():  # verl: same name
    policy = verl_fixture()
    for act, deact in [(100.0, 50.0), (2.0, 1.0), (4.0, 3.0), (6.0, 5.0)]:
        policy.update_after_step(1, ctx(last_activate_duration_s=act, last_deactivate_duration_s=deact))
    assert policy.switch_cost_s == pytest.approx(7.0)  # mean(2, 4, 6) + mean(1, 3, 5)


def test_switch_cost_needs_both_directions_and_ignores_zero_durations():
    policy = verl_fixture()
    policy.update_after_step(0, ctx(last_activate_duration_s=5.0))  # the start activation counts
    assert policy.switch_cost_s is None  # no deactivation measured yet: cost unknown
    policy.update_after_step(1, ctx(last_activate_duration_s=0.0, last_deactivate_duration_s=2.0))
    assert policy.switch_cost_s == 7.0


def test_per_sample_time_is_cumulative_and_counts_cycles_with_both_sums():
    policy = HysteresisRatioDynamicSchedulePolicy()
    policy.update_after_step(1, ctx(wait_s=6.0, wait_samples=2))
    policy.update_after_step(2, ctx(wait_s=3.0, wait_samples=0))  # no waited samples: not counted
    policy.update_after_step(3, ctx(wait_s=0.0, wait_samples=5))  # no wait time: not counted
    policy.update_after_step(4, ctx(wait_s=10.0, wait_samples=3))
    assert policy.per_sample_time_s == pytest.approx(16.0 / 5)


def test_the_gate_decides_with_the_ratio_this_cycle_adapted():
    # verl adapts in on_step_end before deciding: an idle cycle that raises 0.25 -> 0.3 makes the threshold
    # round(0.3 × 64) = 19, so a queue of 16 is 3 short (cold start: lend). Unadapted it would be 0 short.
    policy = HysteresisRatioDynamicSchedulePolicy(0.25)
    policy.update_after_step(1, ctx(queue=40, wait_s=5.0))  # first idle cycle: held by the hysteresis
    assert policy.deactivate_ratio == 0.25
    before = policy.state_dict()
    d = policy.decide(2, ctx(queue=16, wait_s=5.0))
    assert (d.ratio, d.threshold, d.remaining, d.activate) == (0.3, 19, 3, True)
    assert policy.state_dict() == before  # asking changes nothing
    policy.update_after_step(2, ctx(queue=16, wait_s=5.0))
    assert policy.deactivate_ratio == 0.3


def test_scaling_from_replica_counts_or_the_override():
    policy = _measured(16.0)
    assert policy.decide(1, ctx(queue=15, hybrid=8, standalone=4)).scaling_factor == 3.0
    d = HysteresisRatioDynamicSchedulePolicy(0.25, scaling_factor=4.0, idle_wait_s=1.0).decide(1, ctx(queue=15))
    assert d.scaling_factor == 4.0
    # unknown (plain context, no override): the benefit is unknown and the cold-start rule lends
    plain = DynamicScheduleContext(**BATCH, total_generated_samples=115, expected_samples=100)
    d = policy.decide(1, plain)
    assert (d.queue, d.remaining, d.scaling_factor, d.benefit_s, d.activate) == (15, 1, None, None, True)


def test_only_hybrid_always_lends_and_waits_for_the_whole_cycle():
    policy = HysteresisRatioDynamicSchedulePolicy(only_hybrid=True)
    assert policy.deactivate_ratio == 1.0
    assert policy.should_activate_after_step(3, False, ctx(queue=64))
    assert policy.deactivate_wait_samples(ctx()) == 64
    policy.update_after_step(1, ctx(wait_s=0.0, last_activate_duration_s=1.0))
    assert policy.deactivate_ratio == 1.0 and policy.switch_cost_s is None


# ------------------------------------------------------------------------------------ controller, checkpoints


def test_runs_through_the_controller_in_the_seed_call_order():
    clock = FakeClock()
    pool = RecordingPool(clock, [], costs={"wake_up_replicas": 2.0, "sleep_replicas": 1.0})
    policy = HysteresisRatioDynamicSchedulePolicy()
    controller = DynamicResourceController(pool, policy, clock=clock)
    assert controller.after_sync(0, ctx(queue=0)).activated  # start: queue short, nothing measured
    waits: list[int] = []
    start = controller.before_step(0, ctx(queue=0), waits.append)
    assert start.deactivated and waits == [26]  # round(0.4 × 64)
    end = controller.after_sync(1, ctx(queue=10, wait_s=0.0))
    assert end.activated  # cost unknown until both directions were measured: short queue lends
    assert policy.switch_cost_s == pytest.approx(3.0)  # 2 s wake-up + 1 s sleep, recorded after the gate


def test_state_dict_round_trip_reproduces_decisions():
    script = [ctx(queue=q, wait_s=w, wait_samples=n) for q, w, n in [(0, 9.0, 10), (30, 0.5, 0), (5, 4.0, 16)]]
    script += [ctx(queue=q, wait_s=w, wait_samples=n) for q, w, n in [(12, 3.0, 4), (50, 0.0, 0), (20, 6.0, 8)]]
    for c in script:
        c.last_activate_duration_s, c.last_deactivate_duration_s = 2.0, 1.5
    a = HysteresisRatioDynamicSchedulePolicy()
    for step, c in enumerate(script[:3], start=1):
        a.update_after_step(step, c)
    b = HysteresisRatioDynamicSchedulePolicy()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    for step, c in enumerate(script[3:], start=4):
        assert a.decide(step, c) == b.decide(step, c)
        assert a.deactivate_wait_samples(c) == b.deactivate_wait_samples(c)
        a.update_after_step(step, c)
        b.update_after_step(step, c)
    assert b.state_dict() == a.state_dict()
    assert a.state_dict()["idle_steps"] + a.state_dict()["calm_steps"] > 0


def test_load_state_dict_refuses_bad_numbers():
    policy = HysteresisRatioDynamicSchedulePolicy()
    with pytest.raises(ValueError, match="finite"):
        policy.load_state_dict({"wait_seconds": float("nan")})
    with pytest.raises(ValueError, match="idle_steps"):
        policy.load_state_dict({"idle_steps": -1})
    with pytest.raises(ValueError, match="must be in"):
        policy.load_state_dict({"deactivate_ratio": 0.0})


@pytest.mark.parametrize(
    "obj",
    [
        module,
        module.switch_threshold,
        HysteresisRatioDynamicSchedulePolicy,
        HysteresisRatioDynamicSchedulePolicy.state_dict,
    ],
)
def test_docstring_examples_run(obj, isolated_registry):
    blocks = example_blocks(obj.__doc__ or "")
    assert blocks
    for block in blocks:
        exec(compile(block, f"{getattr(obj, '__qualname__', obj.__name__)} Example::", "exec"), dict(vars(module)))
