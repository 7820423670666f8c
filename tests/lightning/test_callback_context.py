"""HybridRolloutCallback fills ``RateScheduleContext`` with measured values (fast: fake replicas, no Ray, no fit).

The callback's hooks run against a stand-in runtime that holds a real :class:`Rollouter` over in-process fake
replicas, a real :class:`MessageQueue` and a pool that registers/unregisters the hybrid fake with the rollouter, as
``HybridReplicaPool`` does (without Ray). The trainer and module are minimal stand-ins for what the hooks touch.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.run.runtime import RuntimeQueries
from lightning_hybrid_rollout.schedule import (
    DynamicResourceController,
    DynamicScheduleContext,
    RateScheduleContext,
    create_policy,
)
from tests.lightning.fakes import fake_trainer
from tests.rollout.fakes import FakeReplica, char_tokenize

TRAIN_S = 0.02  # "compute" per training step


class _Pool:
    def __init__(self, rt: _FakeRuntime) -> None:
        self.rt = rt
        self.registered = False

    def wake_up_replicas(self) -> None:
        pass

    def sync_weights(self) -> None:
        pass

    def take_cycle_sync_s(self) -> float:
        return 0.0

    def add_replicas(self) -> None:
        self.rt.rollouter.add_replicas(self.rt.hybrid, paused=True)
        self.registered = True

    def resume_generation_replicas(self) -> None:
        self.rt.rollouter.resume_generation_replicas([r.replica_id for r in self.rt.hybrid])

    def remove_replicas(self) -> None:
        if self.registered:
            self.rt.rollouter.remove_replicas([r.replica_id for r in self.rt.hybrid])

    def abort_replicas(self) -> None:
        if self.registered:
            self.rt.rollouter.abort_replicas([r.replica_id for r in self.rt.hybrid])

    def sleep_replicas(self) -> None:
        pass

    def rebalance_requests(self) -> None:
        self.rt.rollouter.rebalance_requests()


class _FakeRuntime(RuntimeQueries):
    """What the callback touches of ``RolloutRuntime``; the standalone sync takes ``sync_s`` and is announced."""

    def __init__(
        self,
        a: AsyncTrainingConfig,
        sync_s: float = 0.05,
        standalone_latency: tuple[float, float] = (0.0005, 0.001),
        group_filter: Any = None,
    ) -> None:
        self.standalone = [FakeReplica("standalone-0", token_latency=standalone_latency, seed=1)]
        self.hybrid = [FakeReplica("hybrid-0", role="hybrid", token_latency=(0.0005, 0.001), seed=2)]
        self.queue = MessageQueue(maxsize=a.max_required_samples)
        prompts = ({"prompt": f"p{i:04d}"} for i in range(100_000))
        self.rollouter = Rollouter(
            prompts,
            char_tokenize,
            lambda s: 0.0,
            self.queue,
            sampling=SamplingSpec(max_tokens=6),
            replicas=self.standalone,
            max_required_samples=a.max_required_samples,
            concurrent_samples_per_replica=4,
            group_filter=group_filter,
        )
        self.pool = _Pool(self)
        self.sync_s = sync_s
        self.syncs: list[tuple[float, float]] = []

    def start_generation(self) -> None:
        self.rollouter.start()

    def push_standalone(self, weights: Any, version: int) -> float:
        ids = [r.replica_id for r in self.standalone]
        t0 = time.monotonic()
        self.rollouter.set_syncing(ids, True)
        time.sleep(self.sync_s)
        self.rollouter.set_syncing(ids, False)
        self.syncs.append((t0, time.monotonic()))
        return time.monotonic() - t0

    def check_health(self) -> None:
        pass

    def trace_phase(self, *args: Any, **kwargs: Any) -> None:
        pass

    def trace_cycle(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Module:
    param_version = 0

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass


def run_cycles(policy: str, cycles: int = 3, ratio: float = 0.3, **runtime: Any) -> dict[str, Any]:
    """Drive the callback's hooks for ``cycles`` sync cycles; record every context the policy saw."""
    a = AsyncTrainingConfig(
        dynamic_schedule_policy=policy,
        dynamic_schedule_deactivate_ratio=ratio,
        mini_batch_size=8,
        trigger_parameter_sync_step=2,
        staleness_threshold=0.5,
    )
    cb = HybridRolloutCallback(RolloutConfig(model_path="unused", hybrid_replicas=1), a, trace=False)
    rt = _FakeRuntime(a, **runtime)
    cb.run.runtime = rt
    cb.run.controller = DynamicResourceController(
        rt.pool, cb.policy, clock=time.monotonic, enable_rebalance=False, has_hybrid=True
    )
    seen: list[dict[str, Any]] = []
    original = cb.policy.should_activate_after_step

    def recording(global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        forecast = getattr(cb.policy, "forecast", lambda c: None)(ctx)
        share = cb.run.accepted_token_share
        seen.append({"step": global_steps, "ctx": copy.deepcopy(ctx), "forecast": forecast, "share": share})
        return original(global_steps, is_hybrid_active, ctx)

    cb.policy.should_activate_after_step = recording  # type: ignore[method-assign]
    windows: list[Any] = []
    take = rt.rollouter.take_role_window

    def recording_take() -> Any:
        windows.append(take())
        return windows[-1]

    rt.rollouter.take_role_window = recording_take  # type: ignore[method-assign]
    trainer, module = fake_trainer(), _Module()
    batches: list[list[Any]] = []
    states: list[dict[str, Any]] = []
    try:
        cb.on_train_start(trainer, module)  # type: ignore[arg-type]
        for step in range(cycles * a.trigger_parameter_sync_step):
            trainer.global_step = step
            cb.on_train_batch_start(trainer, module, None, step)  # type: ignore[arg-type]
            batches.append(cb.run.next_batch())
            time.sleep(TRAIN_S)
            trainer.global_step = step + 1
            cb.on_train_batch_end(trainer, module, None, None, step)  # type: ignore[arg-type]
            if trainer.global_step % a.trigger_parameter_sync_step == 0:
                states.append(cb.policy.state_dict())
    finally:
        rt.rollouter.stop()
    return {"cb": cb, "rt": rt, "seen": seen, "batches": batches, "states": states, "a": a, "windows": windows}


@pytest.fixture(scope="module")
def rate_run() -> dict[str, Any]:
    return run_cycles("rate_matched")


def test_rate_matched_sees_measured_cycles(rate_run: dict[str, Any]) -> None:
    a, seen, batches = rate_run["a"], rate_run["seen"], rate_run["batches"]
    m = a.trigger_parameter_sync_step
    assert [s["step"] for s in seen] == [0, 1, 2, 3]
    for k, rec in enumerate(seen[1:], start=1):
        ctx = rec["ctx"]
        assert isinstance(ctx, RateScheduleContext)
        cycle = batches[(k - 1) * m : k * m]
        assert ctx.cycle_trained_samples == a.step_required_samples == sum(len(b) for b in cycle)
        assert ctx.cycle_trained_tokens == sum(s.response_length for b in cycle for s in b) > 0
        assert m * TRAIN_S <= ctx.cycle_train_compute_s < m * TRAIN_S + 1.0
        assert len(ctx.step_queue_sizes) == len(ctx.step_wait_samples) == len(ctx.step_wait_times) == m
        for q, w in zip(ctx.step_queue_sizes, ctx.step_wait_samples):
            assert w == max(0, a.required_samples - q)
        assert ctx.standalone_decoded_tokens > 0 and ctx.standalone_serving_s > 0
        assert (ctx.num_standalone_replicas, ctx.num_hybrid_replicas) == (1, 1)
        assert 0 <= ctx.queue_size <= a.max_required_samples
    # the decision at step 0 has nothing measured yet
    assert seen[0]["ctx"].standalone_decoded_tokens == 0 and seen[0]["ctx"].cycle_trained_samples == 0


def test_standalone_serving_excludes_the_weight_sync(rate_run: dict[str, Any]) -> None:
    rt, seen, windows = rate_run["rt"], rate_run["seen"], rate_run["windows"]
    # windows: [start .. after_sync(0)], [discarded: after_sync(0)'s activation], then one per cycle
    assert len(windows) == 2 + len(seen) - 1
    for k, window in enumerate(windows[2:], start=1):
        ctx = seen[k]["ctx"]
        assert ctx.standalone_serving_s == window.serving_s["standalone"]
        assert ctx.standalone_decoded_tokens == window.decoded_tokens["standalone"]
        t0, t1 = rt.syncs[k - 1]  # cycle k's own standalone sync, right before its after_sync
        assert window.start_s < t0 < t1 <= window.end_s
        length = window.end_s - window.start_s
        # the sync's time (>= sync_s inside the rollouter, <= t1 - t0 seen from outside) is not serving time
        assert length - (t1 - t0) <= ctx.standalone_serving_s <= length - rt.sync_s + 1e-9


def test_rate_matched_forecast_is_computed_from_the_measurements(rate_run: dict[str, Any]) -> None:
    seen, states = rate_run["seen"], rate_run["states"]
    assert seen[0]["forecast"] is None  # cold start: nothing measured
    first = seen[1]["ctx"]
    assert seen[1]["forecast"] is not None
    # the first measured cycle seeds the rate estimates exactly (no smoothing yet)
    assert states[0]["standalone_tok_s"] == pytest.approx(first.standalone_decoded_tokens / first.standalone_serving_s)
    assert states[0]["train_s_per_tok"] == pytest.approx(first.cycle_train_compute_s / first.cycle_trained_tokens)
    fc = seen[1]["forecast"]
    length = first.cycle_trained_tokens / first.cycle_trained_samples
    assert fc.standalone_rate == pytest.approx(first.standalone_decoded_tokens / first.standalone_serving_s / length)


def test_hybrid_and_deactivate_wait_are_measured_when_the_hybrid_replica_helps() -> None:
    # default activates at step 0 (pessimistic per-sample time); a slow standalone replica and a high ratio make
    # the deactivation wait long enough for the hybrid replica to decode
    run = run_cycles("default", cycles=2, ratio=0.9, standalone_latency=(0.004, 0.006))
    cb, seen = run["cb"], run["seen"]
    assert cb.run.switch_events and cb.run.switch_events[0]["kind"] == "activate"
    ctx = seen[1]["ctx"]
    assert isinstance(ctx, RateScheduleContext)
    assert ctx.hybrid_decoded_tokens > 0 and ctx.hybrid_serving_s > 0
    assert ctx.deactivate_wait_s > 0 and ctx.deactivate_wait_samples > 0
    assert ctx.standalone_decoded_tokens > 0


def test_with_a_group_filter_the_policy_sees_accepted_samples_and_tokens_only() -> None:
    """Half the prompts are dropped by the group filter: the batches hold kept prompts only, the context's sample
    count is the accepted one and its decoded tokens are the cycle's scaled by the accepted share."""

    def keep(samples: Any) -> bool:
        return int(samples[0].prompt[1:]) % 2 == 0

    run = run_cycles("rate_matched", group_filter=keep)
    rt, seen, windows, batches = run["rt"], run["seen"], run["windows"], run["batches"]
    assert all(keep([s]) for b in batches for s in b)
    counters = rt.rollouter.counters()
    assert counters["total_filtered_samples"] > 0
    assert rt.generated_samples() == counters["total_generated_samples"] - counters["total_filtered_samples"]
    for k, window in enumerate(windows[2:], start=1):
        ctx, share = seen[k]["ctx"], seen[k]["share"]
        assert 0.0 < share < 1.0
        assert ctx.standalone_decoded_tokens == pytest.approx(window.decoded_tokens["standalone"] * share)
        assert ctx.total_generated_samples <= counters["total_generated_samples"] - counters["total_filtered_samples"]


BASE = {
    "required_samples": 16,
    "trigger_parameter_sync_step": 2,
    "total_generated_samples": 40,
    "expected_samples": 32,
    "buffer_samples": 16,
    "step_wait_times": [0.5, 2.0],
    "step_wait_samples": [0, 6],
}
EXTRA = {
    "queue_size": 3,
    "step_queue_sizes": [20, 10],
    "cycle_train_compute_s": 4.0,
    "cycle_trained_samples": 32,
    "cycle_trained_tokens": 900,
    "standalone_serving_s": 7.0,
    "standalone_decoded_tokens": 3000.0,
    "hybrid_serving_s": 2.0,
    "hybrid_decoded_tokens": 800.0,
    "deactivate_wait_s": 1.0,
    "deactivate_wait_samples": 5,
    "num_standalone_replicas": 1,
    "num_hybrid_replicas": 1,
}


@pytest.mark.parametrize("name", ["default", "static_fully_async", "fixed_ratio"])
def test_other_policies_decide_the_same_on_the_rich_context(name: str) -> None:
    plain, rich = create_policy(name), create_policy(name)
    for step in range(1, 5):
        p = DynamicScheduleContext(**BASE, last_activate_duration_s=0.3 * step)
        r = RateScheduleContext(**BASE, **EXTRA, last_activate_duration_s=0.3 * step)
        for active in (False, True):
            assert plain.should_deactivate(step, active, p) == rich.should_deactivate(step, active, r)
            assert plain.should_activate_after_step(step, active, p) == rich.should_activate_after_step(step, active, r)
        assert plain.deactivate_wait_samples(p) == rich.deactivate_wait_samples(r)
        plain.update_after_step(step, p)
        rich.update_after_step(step, r)
        assert plain.state_dict() == rich.state_dict()
