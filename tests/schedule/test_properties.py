"""Property tests (hypothesis): policy invariants, checkpoint round trips, and controller safety under failures."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hybrid_rollout.schedule import (
    ControllerState,
    DefaultDynamicSchedulePolicy,
    DynamicResourceController,
    DynamicScheduleContext,
    FixedRatioDynamicSchedulePolicy,
    ReplicaPoolError,
    StaticFullyAsyncPolicy,
    create_policy,
)
from tests.schedule.doubles import POOL_METHODS, FakeClock, RecordingPool

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def contexts(draw: st.DrawFn) -> DynamicScheduleContext:
    n = draw(st.integers(0, 6))
    return DynamicScheduleContext(
        required_samples=draw(st.integers(1, 64)),
        trigger_parameter_sync_step=draw(st.integers(1, 8)),
        total_generated_samples=draw(st.integers(0, 3000)),
        expected_samples=draw(st.integers(0, 3000)),
        step_wait_times=draw(st.lists(st.floats(0, 100, allow_nan=False), min_size=n, max_size=n)),
        step_wait_samples=draw(st.lists(st.integers(0, 64), min_size=n, max_size=n)),
        last_activate_duration_s=draw(st.sampled_from([0.0, 0.5, 3.0, 12.0])),
        last_deactivate_duration_s=draw(st.sampled_from([0.0, 0.25, 2.0, 9.0])),
    )


ratios = st.floats(0.001, 1.0, allow_nan=False)
cycles = st.lists(st.tuples(st.integers(-1, 50), contexts()), max_size=25)


@st.composite
def default_policies(draw: st.DrawFn) -> DefaultDynamicSchedulePolicy:
    floor = draw(st.floats(0.001, 1.0))
    return DefaultDynamicSchedulePolicy(deactivate_ratio=draw(st.floats(floor, 1.0)), min_deactivate_ratio=floor)


@SETTINGS
@given(default_policies(), cycles)
def test_default_ratio_always_stays_within_its_lower_bound_and_one(policy, history):
    for step, ctx in history:
        policy.update_after_step(step, ctx)
        assert policy.min_deactivate_ratio <= policy.deactivate_ratio <= 1.0
        assert policy.switch_cost_s > 0 and policy.per_sample_time_s >= 0


@SETTINGS
@given(st.sampled_from(["default", "fixed_ratio", "static_fully_async"]), ratios, st.booleans(), cycles, contexts())
def test_wait_threshold_always_within_zero_and_step_required_samples(name, ratio, only_hybrid, history, probe):
    kwargs = {"min_deactivate_ratio": min(ratio, 0.05)} if name == "default" else {}
    policy = create_policy(name, deactivate_ratio=ratio, only_hybrid=only_hybrid, **kwargs)
    for step, ctx in [*history, (1, probe)]:
        policy.update_after_step(step, ctx)
        assert 0 <= policy.deactivate_wait_samples(probe) <= probe.step_required_samples


@SETTINGS
@given(ratios, contexts())
def test_default_gate_is_stricter_than_the_pure_gap_check(ratio, ctx):
    default = DefaultDynamicSchedulePolicy(deactivate_ratio=ratio, min_deactivate_ratio=ratio)
    fixed = FixedRatioDynamicSchedulePolicy(deactivate_ratio=ratio)
    if default.should_activate_after_step(1, False, ctx):
        assert fixed.should_activate_after_step(1, False, ctx)


def decisions(policy, history) -> list[object]:
    out: list[object] = []
    for step, ctx in history:
        out.append(policy.should_deactivate(step, True, ctx))
        out.append(policy.deactivate_wait_samples(ctx))
        out.append(policy.should_activate_after_step(step, False, ctx))
        policy.update_after_step(step, ctx)
        out.append(policy.deactivate_ratio)
    return out


@SETTINGS
@given(
    st.sampled_from([DefaultDynamicSchedulePolicy, FixedRatioDynamicSchedulePolicy, StaticFullyAsyncPolicy]),
    st.floats(0.05, 1.0),
    st.booleans(),
    cycles,
    cycles,
)
def test_state_dict_round_trip_gives_identical_future_decisions(cls, ratio, only_hybrid, before, after):
    original = cls(deactivate_ratio=ratio, only_hybrid=only_hybrid)
    decisions(original, before)
    restored = cls(deactivate_ratio=0.5 if not only_hybrid else ratio, only_hybrid=only_hybrid)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    assert decisions(restored, after) == decisions(original, after)


class ModelPool(RecordingPool):
    """A recording pool that also models what the replicas are doing; a failing call is read pessimistically
    (wake/add/resume may have happened, remove/sleep may not have)."""

    def __init__(self, clock: FakeClock, failures: list[str]) -> None:
        super().__init__(clock, [])
        self.script = list(failures)  # per call: the method to fail next, in order of calls
        self.awake = self.routable = self.accepting = False

    def _call(self, method: str) -> None:
        self.log.append(method)
        self.clock.advance(1.0)
        failing = bool(self.script) and self.script[0] == method
        if failing:
            self.script.pop(0)
        if method == "wake_up_replicas":
            self.awake = True
        elif method == "add_replicas":
            self.routable = True
        elif method == "resume_generation_replicas":
            self.accepting = True
        elif method == "remove_replicas" and not failing:
            self.routable = False
        elif method == "abort_replicas" and not failing:
            self.accepting = False
        elif method == "sleep_replicas" and not failing:
            self.awake = False
        if failing:
            raise OSError(f"{method} boom")


operations = st.lists(
    st.tuples(st.sampled_from(["before_step", "after_sync", "activate", "deactivate"]), st.booleans()),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.lists(st.sampled_from(POOL_METHODS), max_size=12))
def test_controller_is_never_half_active_whatever_fails(ops, failures):
    clock = FakeClock()
    pool = ModelPool(clock, failures)
    policy = StaticFullyAsyncPolicy()
    controller = DynamicResourceController(pool, policy, clock)
    for step, (op, want_activate) in enumerate(ops, start=1):
        policy.only_hybrid = want_activate  # static policy: activate after sync iff only_hybrid
        ctx = DynamicScheduleContext()
        try:
            if op == "before_step":
                controller.before_step(step, ctx, lambda n: None)
            elif op == "after_sync":
                controller.after_sync(step, ctx)
            elif op == "activate":
                controller.activate(step)
            else:
                controller.deactivate(step)
        except ReplicaPoolError as err:
            assert err.method in POOL_METHODS
        pending = controller.pending_cleanup
        diff = controller.activate_count - controller.deactivate_count
        if controller.state is ControllerState.HYBRID_ACTIVE:
            assert pending == ()
            assert pool.awake and pool.routable and pool.accepting
            assert diff == 1
        else:
            assert diff in (0, 1)
            if not pending:  # nothing owed: the hybrid replicas are really out of the way
                assert not (pool.awake or pool.routable or pool.accepting)
                assert diff == 0
            else:  # owed steps are always a suffix of remove -> abort -> sleep
                assert pending in (
                    ("remove_replicas", "abort_replicas", "sleep_replicas"),
                    ("abort_replicas", "sleep_replicas"),
                    ("sleep_replicas",),
                )
                assert not pool.routable or pending[0] == "remove_replicas"
        assert len(controller.switch_history) == controller.activate_count + controller.deactivate_count
