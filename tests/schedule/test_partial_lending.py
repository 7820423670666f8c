"""Lending k of n hybrid replicas: the controller's subset call orders, the default (all, the seed's no-argument
calls), clamping, rollback and checkpoints of the lent subset, ``rate_matched``'s k sizing and the cycle metric."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lightning_hybrid_rollout.schedule import DynamicResourceController, DynamicScheduleContext, ReplicaPoolError
from lightning_hybrid_rollout.schedule.cycle import ACTIVE_HYBRID_REPLICAS, CycleEnd, CycleLedger, RunShape
from lightning_hybrid_rollout.schedule.rate_matched_policy import (
    RateMatchedDynamicSchedulePolicy,
    RateScheduleContext,
    lending_size,
)
from tests.schedule.doubles import POOL_METHODS, FakeClock, RecordingPool, ScriptedPolicy

ACTIVATE = ["wake_up_replicas", "sync_weights", "add_replicas", "resume_generation_replicas"]
DEACTIVATE = ["remove_replicas", "abort_replicas", "sleep_replicas"]


class SubsetPool:
    """Records ``(method, replicas)``; ``replicas`` is None for a call without the keyword (all replicas)."""

    def __init__(self, clock: FakeClock, sync_s_per_replica: float = 0.0) -> None:
        self.clock = clock
        self.calls: list[tuple[str, tuple[int, ...] | None]] = []
        self.sync_s_per_replica = sync_s_per_replica
        self.failures: dict[str, int] = {}

    def __getattr__(self, method: str) -> Any:
        if method not in POOL_METHODS:
            raise AttributeError(method)

        def call(replicas: Any = None) -> None:
            self.calls.append((method, None if replicas is None else tuple(replicas)))
            if method == "sync_weights":
                self.clock.advance(self.sync_s_per_replica * (4 if replicas is None else len(replicas)))
            if self.failures.get(method, 0) > 0:
                self.failures[method] -= 1
                raise OSError(f"{method} boom")

        return call


class LendK(ScriptedPolicy):
    def __init__(self, log: list[str], k: int, **kwargs: Any) -> None:
        super().__init__(log, **kwargs)
        self.k = k

    def activate_replica_count(self, global_steps: int, ctx: DynamicScheduleContext, num_hybrid_replicas: int) -> int:
        self.log.append(f"policy.activate_replica_count(n={num_hybrid_replicas})")
        return self.k


def ctx() -> DynamicScheduleContext:
    return DynamicScheduleContext(required_samples=4, trigger_parameter_sync_step=1)


def test_a_policy_that_does_not_say_k_activates_all_with_the_seeds_no_argument_calls():
    clock, log = FakeClock(), []
    pool = RecordingPool(clock, log)  # its methods take no argument: a keyword would raise
    controller = DynamicResourceController(pool, ScriptedPolicy(log), clock, num_hybrid_replicas=4)
    end = controller.after_sync(1, ctx())
    assert end.activated and end.active_replicas == 4 and controller.active_replicas == (0, 1, 2, 3)
    assert [e for e in log if not e.startswith("policy.")] == [*ACTIVATE, "rebalance_requests"]


def test_k_of_n_activation_and_deactivation_keep_the_seeds_order_on_the_same_subset():
    clock, log = FakeClock(), []
    pool = SubsetPool(clock)
    controller = DynamicResourceController(pool, LendK(log, 2), clock, num_hybrid_replicas=4)
    end = controller.after_sync(1, ctx())
    assert end.active_replicas == 2 and controller.active_replica_count == 2
    assert log[:2] == ["policy.should_activate_after_step(active=False)", "policy.activate_replica_count(n=4)"]
    assert pool.calls == [*((m, (0, 1)) for m in ACTIVATE), ("rebalance_requests", None)]
    pool.calls.clear()
    start = controller.before_step(2, ctx(), wait_for_samples=lambda n: None)
    assert start.deactivated and controller.active_replicas == ()
    assert pool.calls == [(m, (0, 1)) for m in DEACTIVATE]


@pytest.mark.parametrize(("k", "expected"), [(0, (0,)), (-3, (0,)), (4, None), (9, None)])
def test_the_policys_k_is_clamped_to_one_to_n_and_all_n_uses_the_no_argument_calls(k, expected):
    clock, log = FakeClock(), []
    pool = SubsetPool(clock)
    controller = DynamicResourceController(pool, LendK(log, k), clock, num_hybrid_replicas=4)
    controller.after_sync(1, ctx())
    assert pool.calls[0] == ("wake_up_replicas", expected)


def test_without_num_hybrid_replicas_the_policys_count_is_not_asked():
    clock, log = FakeClock(), []
    pool = SubsetPool(clock)
    controller = DynamicResourceController(pool, LendK(log, 1), clock)
    end = controller.after_sync(1, ctx())
    assert "policy.activate_replica_count(n=4)" not in log and end.active_replicas is None
    assert all(replicas is None for _, replicas in pool.calls)


def test_activate_refuses_a_subset_outside_range_n():
    clock = FakeClock()
    controller = DynamicResourceController(SubsetPool(clock), LendK([], 1), clock, num_hybrid_replicas=4)
    with pytest.raises(ValueError, match=r"subset of range\(4\)"):
        controller.activate(1, replicas=[4])
    bare = DynamicResourceController(SubsetPool(clock), LendK([], 1), clock)
    with pytest.raises(ValueError, match="needs a controller built with num_hybrid_replicas"):
        bare.activate(1, replicas=[0])


def test_a_failed_subset_activation_rolls_back_the_same_subset():
    clock = FakeClock()
    pool = SubsetPool(clock)
    pool.failures["sync_weights"] = 1
    controller = DynamicResourceController(pool, LendK([], 3), clock, num_hybrid_replicas=4)
    with pytest.raises(ReplicaPoolError):
        controller.after_sync(1, ctx())
    assert pool.calls == [("wake_up_replicas", (0, 1, 2)), ("sync_weights", (0, 1, 2)), ("sleep_replicas", (0, 1, 2))]
    assert not controller.is_hybrid_active and controller.active_replicas == ()


def test_the_lent_subset_round_trips_through_a_checkpoint_and_a_pending_cleanup_keeps_it():
    clock = FakeClock()
    pool = SubsetPool(clock)
    controller = DynamicResourceController(pool, LendK([], 2), clock, num_hybrid_replicas=4)
    controller.after_sync(1, ctx())
    state = json.loads(json.dumps(controller.state_dict()))
    assert state["active_replicas"] == [0, 1]
    pool2 = SubsetPool(clock)
    restored = DynamicResourceController(pool2, LendK([], 2), clock, num_hybrid_replicas=4)
    restored.load_state_dict(state)
    assert restored.state_dict() == controller.state_dict() and restored.active_replicas == (0, 1)
    pool2.failures["abort_replicas"] = 1
    with pytest.raises(ReplicaPoolError):
        restored.deactivate(2)
    restored.deactivate(2)  # the retry finishes the same subset
    assert pool2.calls == [
        ("remove_replicas", (0, 1)),
        ("abort_replicas", (0, 1)),
        ("abort_replicas", (0, 1)),
        ("sleep_replicas", (0, 1)),
    ]
    with pytest.raises(ValueError, match="without num_hybrid_replicas"):
        DynamicResourceController(SubsetPool(clock), LendK([], 2), clock).load_state_dict(state)
    old = {k: v for k, v in state.items() if k not in ("active_replicas", "cycle_sync_s", "cycle_replicas")}
    restored.load_state_dict(old)  # a checkpoint from before k-of-n lending: all replicas
    assert restored.active_replicas == (0, 1, 2, 3)


def test_the_controller_writes_the_cycles_sync_seconds_and_lent_replicas_into_a_rate_context():
    clock = FakeClock()
    controller = DynamicResourceController(
        SubsetPool(clock, sync_s_per_replica=1.5), LendK([], 2), clock, num_hybrid_replicas=4
    )
    rctx = RateScheduleContext(required_samples=4)
    controller.after_sync(1, rctx)
    assert (rctx.last_hybrid_sync_s, rctx.last_activated_replicas) == (3.0, 2)


# --------------------------------------------------------------------------------------------- rate_matched


def test_lending_size_trades_the_per_replica_sync_against_the_wait():
    assert lending_size(4, 0.0, 1.0, 1.0, 5.0) == 1
    assert lending_size(4, 1000.0, 1.0, 1.0, 5.0) == 4
    assert lending_size(4, 1000.0, 1.0, 1.0, 0.0) == 4  # free syncs: all
    # cost(k) = 10k + 60 / (1 + k): k=1 40, k=2 40 (tie: the larger), k=3 45
    assert lending_size(4, 60.0, 1.0, 1.0, 10.0) == 2


def _measured_ctx(**kw: Any) -> RateScheduleContext:
    base = {
        "required_samples": 10,
        "trigger_parameter_sync_step": 4,
        "queue_size": 0,
        "standalone_serving_s": 100.0,
        "standalone_decoded_tokens": 2000.0,
        "cycle_train_compute_s": 40.0,
        "cycle_trained_samples": 40,
        "cycle_trained_tokens": 4000,
        "num_standalone_replicas": 1,
        "num_hybrid_replicas": 4,
    }
    return RateScheduleContext(**{**base, **kw})


def test_rate_matched_lends_all_unless_partial_lending_and_a_sync_was_measured():
    off = RateMatchedDynamicSchedulePolicy()
    on = RateMatchedDynamicSchedulePolicy(partial_lending=True)
    ctx0 = _measured_ctx()
    assert off.activate_replica_count(1, ctx0, 4) == 4
    assert on.activate_replica_count(1, ctx0, 4) == 4  # no sync measured yet: all
    for policy in (off, on):
        policy.update_after_step(2, _measured_ctx(last_hybrid_sync_s=400.0, last_activated_replicas=4))
    assert off.activate_replica_count(3, _measured_ctx(queue_size=30), 4) == 4
    k = on.activate_replica_count(3, _measured_ctx(queue_size=30), 4)
    assert 1 <= k < 4  # 100 s of sync per replica against a short wait
    assert on.state_dict()["sync_s_per_replica"] == 100.0
    restored = RateMatchedDynamicSchedulePolicy(partial_lending=True)
    restored.load_state_dict(json.loads(json.dumps(on.state_dict())))
    assert restored.activate_replica_count(3, _measured_ctx(queue_size=30), 4) == k


# ----------------------------------------------------------------------------------------------- the metric


def test_the_cycle_metric_counts_the_lent_replicas_or_derives_all_or_none():
    ledger = CycleLedger(RunShape(required_samples=4, trigger_parameter_sync_step=1, num_hybrid_replicas=6))
    assert ledger.close(CycleEnd(hybrid_active=True, active_hybrid_replicas=2))[ACTIVE_HYBRID_REPLICAS] == 2.0
    assert ledger.close(CycleEnd(hybrid_active=True))[ACTIVE_HYBRID_REPLICAS] == 6.0
    assert ledger.close(CycleEnd(hybrid_active=False))[ACTIVE_HYBRID_REPLICAS] == 0.0
