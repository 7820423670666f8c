"""DynamicResourceController with a recording pool and a fake clock: call orders, idempotence, durations,
error safety at each pool method, the retry rule, history and checkpoints."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from lightning_hybrid_rollout.schedule import (
    ControllerState,
    DefaultDynamicSchedulePolicy,
    DynamicResourceController,
    DynamicScheduleContext,
    ReplicaPool,
    ReplicaPoolError,
    StepEndResult,
    StepStartResult,
    SwitchRecord,
)
from tests.schedule.doubles import POOL_METHODS, FakeClock, RecordingPool, ScriptedPolicy

ACTIVATE = ["wake_up_replicas", "sync_weights", "add_replicas", "resume_generation_replicas"]
DEACTIVATE = ["remove_replicas", "abort_replicas", "sleep_replicas"]
COSTS = {  # activation 1 + 2 + 0.5 + 0.25 = 3.75 s; deactivation 0.5 + 1 + 2 = 3.5 s; rebalance 0.125 s
    "wake_up_replicas": 1.0,
    "sync_weights": 2.0,
    "add_replicas": 0.5,
    "resume_generation_replicas": 0.25,
    "remove_replicas": 0.5,
    "abort_replicas": 1.0,
    "sleep_replicas": 2.0,
    "rebalance_requests": 0.125,
}
LOGGER = "lightning_hybrid_rollout.schedule.controller"


def make(pool, clock, log, *, state=ControllerState.STANDALONE_ONLY, **policy_kwargs):
    policy = ScriptedPolicy(log, **policy_kwargs)
    return DynamicResourceController(pool, policy, clock, initial_state=state), policy


def active(pool, clock, log, **policy_kwargs):
    return make(pool, clock, log, state=ControllerState.HYBRID_ACTIVE, **policy_kwargs)


def waiter(log):
    return lambda n: log.append(f"wait({n})")


# ------------------------------------------------------------------------------------------ interface


def test_replica_pool_protocol_has_exactly_the_methods_of_the_architecture_doc(pool):
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    table_methods = set(re.findall(r"^\| `(\w+)\(\)` \|", doc, flags=re.MULTILINE))
    protocol_methods = {name for name in vars(ReplicaPool) if not name.startswith("_")}
    assert protocol_methods == table_methods == set(POOL_METHODS)
    assert isinstance(pool, ReplicaPool)


# ------------------------------------------------------------------------------------------ switching


def test_activate_wakes_syncs_adds_resumes_in_order_and_returns_the_clock_duration(pool, clock, log):
    pool.costs = COSTS
    clock.now = 100.0
    controller, _ = make(pool, clock, log)
    assert controller.activate(global_steps=4) == 3.75
    assert log == ACTIVATE
    assert controller.state is ControllerState.HYBRID_ACTIVE and controller.is_hybrid_active
    assert (controller.activate_count, controller.last_activate_duration_s) == (1, 3.75)
    assert controller.switch_history == (SwitchRecord("activate", 4, 100.0, 3.75),)


def test_deactivate_removes_then_aborts_then_sleeps_and_returns_the_clock_duration(pool, clock, log):
    pool.costs = COSTS
    controller, _ = active(pool, clock, log)
    assert controller.deactivate(global_steps=5) == 3.5
    assert log == DEACTIVATE
    assert controller.state is ControllerState.STANDALONE_ONLY
    assert (controller.deactivate_count, controller.last_deactivate_duration_s) == (1, 3.5)
    assert controller.switch_history == (SwitchRecord("deactivate", 5, 0.0, 3.5),)


def test_activating_an_active_pool_does_nothing_and_logs_at_debug(pool, clock, log, caplog):
    controller, _ = active(pool, clock, log)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert controller.activate(7) == 0.0
    assert log == [] and controller.activate_count == 0
    assert "already active, nothing to do" in caplog.text
    assert caplog.records[-1].levelno == logging.DEBUG


def test_deactivating_an_inactive_pool_does_nothing_and_logs_at_debug(pool, clock, log, caplog):
    controller, _ = make(pool, clock, log)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert controller.deactivate(7) == 0.0
    assert log == [] and controller.deactivate_count == 0
    assert "already inactive, nothing to do" in caplog.text
    assert caplog.records[-1].levelno == logging.DEBUG


def test_without_hybrid_replicas_switching_is_a_noop_but_the_policy_is_still_consulted(pool, clock, log, caplog):
    policy = ScriptedPolicy(log, deactivate=True, wait=3, activate=True)
    controller = DynamicResourceController(pool, policy, clock, has_hybrid=False)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert controller.activate(1) == 0.0
        assert controller.deactivate(1) == 0.0
    assert "no hybrid replicas" in caplog.text
    end = controller.after_sync(2, DynamicScheduleContext())
    start = controller.before_step(3, DynamicScheduleContext(), waiter(log))
    assert not end.activated and not start.deactivated
    assert [entry for entry in log if entry in POOL_METHODS] == []
    assert controller.state is ControllerState.STANDALONE_ONLY
    with pytest.raises(ValueError, match="has_hybrid=False"):
        DynamicResourceController(pool, policy, clock, has_hybrid=False, initial_state=ControllerState.HYBRID_ACTIVE)


# ------------------------------------------------------------------------------------------ per-step driver


def test_before_step_follows_should_deactivate_wait_threshold_wait_then_deactivate(pool, clock, log):
    pool.costs = COSTS
    controller, _ = active(pool, clock, log, deactivate=True, wait=7)
    result = controller.before_step(5, DynamicScheduleContext(), waiter(log))
    assert log == ["policy.should_deactivate(active=True)", "policy.deactivate_wait_samples", "wait(7)", *DEACTIVATE]
    assert result == StepStartResult(
        global_steps=5,
        was_hybrid_active=True,
        should_deactivate=True,
        wait_samples=7,
        deactivated=True,
        deactivate_duration_s=3.5,
    )


def test_before_step_does_not_wait_or_switch_when_the_policy_keeps_hybrid(pool, clock, log):
    controller, _ = active(pool, clock, log, deactivate=False)
    result = controller.before_step(5, DynamicScheduleContext(), waiter(log))
    assert log == ["policy.should_deactivate(active=True)"]
    assert result.wait_samples is None and not result.deactivated
    assert controller.is_hybrid_active


def test_before_step_clamps_a_negative_wait_threshold_to_zero(pool, clock, log):
    controller, _ = active(pool, clock, log, deactivate=True, wait=-4)
    assert controller.before_step(5, DynamicScheduleContext(), waiter(log)).wait_samples == 0
    assert "wait(0)" in log


def test_after_sync_activates_then_rebalances_then_updates(pool, clock, log):
    pool.costs = COSTS
    controller, policy = make(pool, clock, log, activate=True)
    ctx = DynamicScheduleContext()
    result = controller.after_sync(4, ctx)
    assert log == [
        "policy.should_activate_after_step(active=False)",
        *ACTIVATE,
        "policy.request_rebalance",
        "rebalance_requests",
        "policy.update_after_step",
    ]
    assert result == StepEndResult(
        global_steps=4,
        was_hybrid_active=False,
        should_activate=True,
        activated=True,
        activate_duration_s=3.75,
        rebalanced=True,
        rebalance_duration_s=0.125,
        cycle_activate_duration_s=3.75,
        cycle_deactivate_duration_s=0.0,
    )
    assert policy.seen_durations == [(3.75, 0.0)]
    assert (ctx.last_activate_duration_s, ctx.last_deactivate_duration_s) == (3.75, 0.0)


def test_after_sync_skips_rebalance_when_disabled(pool, clock, log):
    policy = ScriptedPolicy(log, activate=True)
    controller = DynamicResourceController(pool, policy, clock, enable_rebalance=False)
    result = controller.after_sync(4, DynamicScheduleContext())
    assert log == ["policy.should_activate_after_step(active=False)", *ACTIVATE, "policy.update_after_step"]
    assert result.activated and not result.rebalanced


def test_after_sync_on_an_already_active_pool_neither_switches_nor_rebalances(pool, clock, log):
    controller, _ = active(pool, clock, log, activate=True)
    result = controller.after_sync(4, DynamicScheduleContext())
    assert log == ["policy.should_activate_after_step(active=True)", "policy.update_after_step"]
    assert result.should_activate and not result.activated and not result.rebalanced


def test_after_sync_without_activation_only_asks_and_updates(pool, clock, log):
    controller, _ = make(pool, clock, log, activate=False)
    controller.after_sync(4, DynamicScheduleContext())
    assert log == ["policy.should_activate_after_step(active=False)", "policy.update_after_step"]


def test_ctx_switch_durations_cover_exactly_the_switches_since_the_previous_after_sync(pool, clock, log):
    pool.costs = COSTS
    controller, policy = make(pool, clock, log, deactivate=True, activate=True)
    ctx = DynamicScheduleContext()
    controller.after_sync(2, ctx)  # activates: 3.75 s, no deactivation yet
    controller.before_step(3, ctx, waiter(log))  # deactivates: 3.5 s
    controller.before_step(4, ctx, waiter(log))  # inactive: nothing
    controller.after_sync(4, ctx)  # activates again: 3.75 s -> one full switch pair
    policy.activate = False
    controller.before_step(5, ctx, waiter(log))  # deactivates: 3.5 s
    controller.after_sync(6, ctx)  # no activation
    controller.after_sync(8, ctx)  # nothing happened since the previous after_sync
    assert policy.seen_durations == [(3.75, 0.0), (3.75, 3.5), (0.0, 3.5), (0.0, 0.0)]
    assert (ctx.last_activate_duration_s, ctx.last_deactivate_duration_s) == (0.0, 0.0)
    assert (controller.activate_count, controller.deactivate_count) == (2, 2)
    assert [r.kind for r in controller.switch_history] == ["activate", "deactivate", "activate", "deactivate"]


def test_default_policy_learns_its_switch_cost_from_the_controllers_measured_durations(pool, clock, log):
    pool.costs = COSTS  # activation 3.75 s, deactivation 3.5 s
    policy = DefaultDynamicSchedulePolicy(deactivate_ratio=0.5)
    controller = DynamicResourceController(pool, policy, clock)
    hungry = DynamicScheduleContext(required_samples=4, trigger_parameter_sync_step=2)  # gap 4 x 1000 s: activate
    controller.after_sync(2, hungry)
    assert policy.switch_overheads_s == (3.75,)
    controller.before_step(3, hungry, lambda n: None)
    controller.after_sync(4, hungry)
    assert policy.switch_overheads_s == (3.75, 7.25)
    assert policy.switch_cost_s == pytest.approx(5.5)


# ------------------------------------------------------------------------------------------ failures


FAILURES = [
    # (failing method, calls made (the failing one included), state after, pending after)
    ("wake_up_replicas", ["wake_up_replicas", "sleep_replicas"], ControllerState.STANDALONE_ONLY, ()),
    ("sync_weights", ["wake_up_replicas", "sync_weights", "sleep_replicas"], ControllerState.STANDALONE_ONLY, ()),
    ("add_replicas", [*ACTIVATE[:3], *DEACTIVATE], ControllerState.STANDALONE_ONLY, ()),
    ("resume_generation_replicas", [*ACTIVATE, *DEACTIVATE], ControllerState.STANDALONE_ONLY, ()),
    ("remove_replicas", ["remove_replicas"], ControllerState.HYBRID_ACTIVE, ()),
    ("abort_replicas", DEACTIVATE[:2], ControllerState.STANDALONE_ONLY, ("abort_replicas", "sleep_replicas")),
    ("sleep_replicas", DEACTIVATE, ControllerState.STANDALONE_ONLY, ("sleep_replicas",)),
    ("rebalance_requests", [*ACTIVATE, "rebalance_requests"], ControllerState.HYBRID_ACTIVE, ()),
]


@pytest.mark.parametrize(("method", "calls", "state", "pending"), FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failing_pool_method_leaves_a_consistent_state_and_a_named_error(
    pool, clock, log, method, calls, state, pending
):
    phase = "activate" if method in ACTIVATE else "rebalance" if method == "rebalance_requests" else "deactivate"
    initial = ControllerState.HYBRID_ACTIVE if phase == "deactivate" else ControllerState.STANDALONE_ONLY
    controller, _ = make(pool, clock, log, state=initial, deactivate=True, activate=True)
    pool.fail(method)
    ctx = DynamicScheduleContext()
    with pytest.raises(ReplicaPoolError) as info:
        if phase == "deactivate":
            controller.before_step(3, ctx, lambda n: None)
        else:
            controller.after_sync(2, ctx)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert str(err) == f"{phase} failed at {method}: {method} boom"
    assert (err.phase, err.method) == (phase, method)
    assert isinstance(err.__cause__, OSError) and err.original is err.__cause__
    assert [entry for entry in log if entry in POOL_METHODS] == calls
    assert controller.state is state
    assert controller.pending_cleanup == pending
    assert "policy.update_after_step" not in log  # the cycle did not complete
    switched_ok = method == "rebalance_requests"  # the activation itself succeeded
    assert controller.activate_count == int(switched_ok)
    assert controller.deactivate_count == 0


def test_pending_cleanup_is_finished_by_the_next_deactivate_and_counted_once_with_summed_duration(pool, clock, log):
    pool.costs = COSTS
    clock.now = 10.0
    controller, _ = active(pool, clock, log)
    pool.fail("abort_replicas")
    with pytest.raises(ReplicaPoolError):
        controller.deactivate(5)  # remove 0.5 s + failing abort 1 s
    log.clear()
    assert controller.deactivate(6) == 4.5  # 1.5 s before + abort 1 s + sleep 2 s
    assert log == ["abort_replicas", "sleep_replicas"]
    assert controller.pending_cleanup == ()
    assert controller.deactivate_count == 1
    assert controller.switch_history == (SwitchRecord("deactivate", 6, 10.0, 4.5),)
    log.clear()
    assert controller.deactivate(7) == 0.0 and log == []  # done: back to a no-op


def test_pending_cleanup_runs_first_in_before_step_before_the_policy_is_asked(pool, clock, log):
    controller, _ = active(pool, clock, log, deactivate=False)
    pool.fail("sleep_replicas")
    with pytest.raises(ReplicaPoolError):
        controller.deactivate(5)
    log.clear()
    result = controller.before_step(6, DynamicScheduleContext(), waiter(log))
    assert log == ["sleep_replicas", "policy.should_deactivate(active=False)"]
    assert controller.deactivate_count == 1 and controller.pending_cleanup == ()
    assert result.cleanup_duration_s == 0.0 and not result.deactivated


def test_pending_cleanup_runs_before_a_new_activation(pool, clock, log):
    controller, _ = active(pool, clock, log)
    pool.fail("sleep_replicas")
    with pytest.raises(ReplicaPoolError):
        controller.deactivate(5)
    log.clear()
    controller.activate(6)
    assert log == ["sleep_replicas", *ACTIVATE]
    assert controller.is_hybrid_active and controller.pending_cleanup == ()
    assert (controller.activate_count, controller.deactivate_count) == (1, 1)


def test_a_retry_that_fails_again_raises_keeps_the_rest_pending_and_does_nothing_more(pool, clock, log):
    controller, _ = active(pool, clock, log)
    pool.fail("abort_replicas", times=2)
    with pytest.raises(ReplicaPoolError):
        controller.deactivate(5)
    log.clear()
    with pytest.raises(ReplicaPoolError, match="deactivate failed at abort_replicas"):
        controller.activate(6)
    assert log == ["abort_replicas"]  # no activation was attempted
    assert controller.pending_cleanup == ("abort_replicas", "sleep_replicas")
    assert controller.state is ControllerState.STANDALONE_ONLY


def test_a_failed_remove_keeps_hybrid_active_and_the_next_deactivate_starts_over(pool, clock, log):
    controller, _ = active(pool, clock, log)
    pool.fail("remove_replicas")
    with pytest.raises(ReplicaPoolError):
        controller.deactivate(5)
    log.clear()
    controller.deactivate(6)
    assert log == DEACTIVATE and controller.deactivate_count == 1


def test_a_failing_rollback_becomes_pending_and_completing_it_is_not_a_deactivation(pool, clock, log, caplog):
    controller, _ = make(pool, clock, log)
    pool.fail("add_replicas")
    pool.fail("remove_replicas")  # the rollback's first call fails too
    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(ReplicaPoolError, match="at add_replicas"):
        controller.activate(2)
    assert "rollback after activation failed at add_replicas" in caplog.text
    assert controller.state is ControllerState.STANDALONE_ONLY
    assert controller.pending_cleanup == tuple(DEACTIVATE)
    log.clear()
    controller.deactivate(3)
    assert log == DEACTIVATE
    assert controller.pending_cleanup == () and controller.deactivate_count == 0
    assert controller.switch_history == ()


def test_a_failed_activation_can_be_retried_by_the_next_after_sync(pool, clock, log):
    controller, _ = make(pool, clock, log, activate=True)
    pool.fail("sync_weights")
    with pytest.raises(ReplicaPoolError):
        controller.after_sync(2, DynamicScheduleContext())
    log.clear()
    assert controller.after_sync(4, DynamicScheduleContext()).activated
    assert controller.is_hybrid_active and controller.activate_count == 1


# ------------------------------------------------------------------------------------------ history, checkpoint


def test_switch_history_is_bounded(pool, clock, log):
    controller = DynamicResourceController(pool, ScriptedPolicy(log), clock, history_size=3)
    for step in range(1, 4):
        controller.activate(step)
        controller.deactivate(step)
    assert [(r.kind, r.global_steps) for r in controller.switch_history] == [
        ("deactivate", 2),
        ("activate", 3),
        ("deactivate", 3),
    ]
    assert controller.activate_count == 3


def run_cycles(controller: DynamicResourceController, steps: range, log: list[str]) -> list[object]:
    results: list[object] = []
    for step in steps:
        ctx = DynamicScheduleContext(
            required_samples=4,
            trigger_parameter_sync_step=2,
            total_generated_samples=step * 7,
            expected_samples=step * 8,
            step_wait_times=[0.5 * (step % 3)],
            step_wait_samples=[step % 3],
        )
        results.append(controller.before_step(step, ctx, waiter(log)))
        if step % 2 == 0:
            results.append(controller.after_sync(step, ctx))
            results.append(controller.policy.state_dict())
    return results


def test_state_dict_round_trip_continues_identically(clock, log):
    pool = RecordingPool(clock, log, COSTS)
    original = DynamicResourceController(pool, DefaultDynamicSchedulePolicy(deactivate_ratio=0.5), clock)
    run_cycles(original, range(1, 9), log)
    pool.fail("sleep_replicas")  # leave a pending retry in the checkpoint
    if not original.is_hybrid_active:
        original.activate(9)
    with pytest.raises(ReplicaPoolError):
        original.deactivate(9)
    state = json.loads(json.dumps(original.state_dict()))  # plain values only

    clock2 = FakeClock(clock.now)
    log2: list[str] = []
    restored = DynamicResourceController(
        RecordingPool(clock2, log2, COSTS), DefaultDynamicSchedulePolicy(deactivate_ratio=0.5), clock2
    )
    restored.load_state_dict(state)
    assert restored.state_dict() == original.state_dict()
    log.clear()
    assert run_cycles(restored, range(10, 20), log2) == run_cycles(original, range(10, 20), log)
    assert log2 == log
    assert restored.state_dict() == original.state_dict()


def test_load_state_dict_rejects_inconsistent_checkpoints(pool, clock, log):
    controller, _ = make(pool, clock, log)
    good = controller.state_dict()
    with pytest.raises(ValueError, match="unsupported controller state_dict version"):
        controller.load_state_dict({**good, "version": 99})
    with pytest.raises(ValueError, match="pending_cleanup must be a suffix"):
        controller.load_state_dict({**good, "pending_cleanup": ["abort_replicas"]})
    no_hybrid = DynamicResourceController(pool, ScriptedPolicy(log), clock, has_hybrid=False)
    with pytest.raises(ValueError, match="has_hybrid=False"):
        no_hybrid.load_state_dict({**good, "state": "hybrid_active"})
