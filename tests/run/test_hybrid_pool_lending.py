"""Lending k of n hybrid replicas on the real :class:`HybridReplicaPool` (issue #46), fast: no Ray, no engines.

A real :class:`RolloutRuntime` (never started) holds in-process fake replicas that generate like
:class:`~tests.rollout.fakes.FakeReplica` and load weights through the engine's own ``DeltaShadow``
(:class:`~tests.rollout.weights.test_delta.ShadowReceiver`: what each fake hashes is what a vLLM worker would
load), a real :class:`Rollouter` and load balancer on the runtime's loop, the real weight push (``node_shm``, delta
encoding, checksum-verified) and a real controller built with ``num_hybrid_replicas=2``, driven by a policy whose
``activate_replica_count`` the test sets. The slow end-to-end fit is in tests/lightning/test_partial_lending_real.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.rollout.weights.router import WeightRouter
from lightning_hybrid_rollout.run.overlap import OverlapSync
from lightning_hybrid_rollout.run.runtime import RolloutRuntime
from lightning_hybrid_rollout.schedule import (
    ControllerState,
    DynamicResourceController,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    ReplicaPoolError,
)
from tests.rollout.fakes import FakeReplica, char_tokenize, wait_for
from tests.rollout.weights.test_delta import ShadowReceiver, Trainer, _bits_equal

BF16 = torch.bfloat16


class _Engine(FakeReplica):
    """A fake replica that generates (``FakeReplica``), sleeps and wakes, and speaks the weight-update protocol
    through a :class:`ShadowReceiver` (a bfloat16 engine: the push sends it deltas from the version it holds)."""

    def __init__(self, replica_id: str, role: str = "hybrid") -> None:
        super().__init__(replica_id, role=role, token_latency=(0.002, 0.004))
        self.engine = ShadowReceiver(replica_id)
        self.info = self.engine.info
        self.wakes = self.sleeps = 0
        #: Answer a weight push with a wrong checksum (a corrupted load).
        self.corrupt = False

    async def wake_up(self) -> float:
        self.wakes += 1
        self.forbidden = False
        return 0.0

    async def sleep(self) -> float:
        self.sleeps += 1
        self.forbidden = True  # a request reaching a sleeping engine is recorded in `violations`
        return 0.0

    async def finish_weight_update(self) -> str:
        checksum = await self.engine.finish_weight_update()
        return "0" * len(checksum) if self.corrupt else checksum

    def __getattr__(self, name: str) -> Any:  # the rest of the weight-update protocol: the engine's
        engine = self.__dict__.get("engine")
        if engine is None:
            raise AttributeError(name)
        return getattr(engine, name)


class _Link:
    """The trainer side (:class:`~lightning_hybrid_rollout.run.hybrid_pool.TrainerLink`): a small AdamW model."""

    def __init__(self) -> None:
        self.model = Trainer(0)
        self.version = 1
        self.offloads = 0

    def need_devices(self) -> None:
        self.offloads += 1

    def cycle_weights(self) -> list[tuple[str, Any]]:
        return self.model.state()

    def weight_version(self) -> int:
        return self.version

    def step(self) -> None:
        self.model.step()
        self.version += 1


class _Lend(DynamicSchedulePolicyBase):
    """Deactivate at every cycle start, activate after every sync, lending ``k`` of the n hybrid replicas."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 1

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return True

    def activate_replica_count(self, global_steps: int, ctx: DynamicScheduleContext, num_hybrid_replicas: int) -> int:
        return self.k


class _Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.link = _Link()
        rt = RolloutRuntime(
            RolloutConfig(model_path="unused", hybrid_replicas=2, weight_encoding="delta", replica_health_timeout_s=10),
            AsyncTrainingConfig(),
            workload=None,
            run_dir=tmp_path,
            trace=False,
            trainer=self.link,
        )
        rt.weights = WeightRouter("node_shm", "delta")
        rt.queue = MessageQueue(maxsize=100_000)
        rt.standalone = [_Engine("standalone-0", role="standalone")]
        rt.hybrid = [_Engine("hybrid-0"), _Engine("hybrid-1")]
        rt.pool.park_started()
        rt.rollouter = Rollouter(
            (f"p{i:06d}" for i in range(1_000_000)),
            char_tokenize,
            lambda sample: 0.0,
            rt.queue,
            sampling=SamplingSpec(max_tokens=4),
            replicas=rt.standalone,
            max_required_samples=100_000,
            concurrent_samples_per_replica=4,
        )
        rt.supervisor = SimpleNamespace(
            joined=lambda r: None, failed_to_join=lambda r, e: None, restarts=0, cancel=lambda: None
        )
        rt.start_generation()
        self.rt = rt
        self.h0, self.h1 = rt.hybrid
        self.policy = _Lend()
        self.controller = DynamicResourceController(rt.pool, self.policy, clock=time.monotonic, num_hybrid_replicas=2)
        self.ctx = DynamicScheduleContext(required_samples=8, trigger_parameter_sync_step=1)
        self.cycles = 0

    @property
    def lb(self) -> Any:
        return self.rt.rollouter.load_balancer

    def routed(self, rid: str) -> int:
        return int(self.lb.routed_counts().get(rid, 0))

    def cycle(self, k: int) -> Any:
        """One cycle: the lent replicas back (before the step), the step and its version, then lend ``k``."""
        if self.controller.is_hybrid_active:
            self.controller.before_step(self.cycles + 1, self.ctx, wait_for_samples=lambda n: None)
        if self.cycles:
            self.link.step()
        self.cycles += 1
        self.policy.k = k
        before = {r.replica_id: self.routed(r.replica_id) for r in self.rt.hybrid}
        end = self.controller.after_sync(self.cycles, self.ctx)
        for i in self.controller.active_replicas or ():  # every lent replica takes requests
            rid = self.rt.pool.slot_ids[i]
            wait_for(lambda rid=rid: self.routed(rid) > before.get(rid, 0), timeout=10)
        return end

    def current(self, replica: _Engine) -> bool:
        """``replica`` holds the trainer's current weights, bit for bit, in the engine's dtype."""
        return _bits_equal(replica.engine.held, self.link.model.cast(BF16))


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[_Rig]:
    r = _Rig(tmp_path)
    try:
        yield r
    finally:
        r.rt.stop()


def test_lending_one_of_two_wakes_syncs_and_routes_to_replica_0_only(rig: _Rig) -> None:
    pool, h0, h1 = rig.rt.pool, rig.h0, rig.h1
    end = rig.cycle(k=1)
    assert end.activated and end.active_replicas == 1 and rig.controller.active_replicas == (0,)
    assert list(pool.calls) == [
        "wake_up_replicas [0]",
        "sync_weights [0]",
        "add_replicas [0]",
        "resume_generation_replicas [0]",
        "rebalance_requests",
    ]
    report = rig.rt.last_hybrid_sync_report
    assert report.replica_checksums == {"hybrid-0": report.checksum}  # the push named replica 0 alone, verified
    assert pool.held_versions == {"hybrid-0": 1} and rig.current(h0)
    assert pool.awake_indices == (0,) and pool.routing_indices == (0,)
    # replica 1: parked at the start, then untouched: never woken, pushed to, registered nor routed to
    assert (h1.wakes, h1.sleeps, h1.engine.calls, h1.calls) == (0, 1, [], [])
    assert "hybrid-1" not in rig.lb.routed_counts()
    rig.cycle(k=1)  # its deactivation and the next lending concern replica 0 alone too
    assert list(pool.calls)[5:8] == ["remove_replicas [0]", "abort_replicas [0]", "sleep_replicas [0]"]
    assert (h0.wakes, h0.sleeps, h0.violations) == (2, 2, [])
    assert (h1.wakes, h1.sleeps, h1.engine.calls, h1.calls) == (0, 1, [], [])
    assert pool.held_versions == {"hybrid-0": 2} and rig.current(h0)
    assert rig.rt.last_hybrid_sync_report.per_replica_encoding == {"hybrid-0": "delta"}  # from the version it held


def test_lending_both_later_brings_replica_1_to_the_current_weights_from_the_version_it_holds(rig: _Rig) -> None:
    pool, h0, h1 = rig.rt.pool, rig.h0, rig.h1
    rig.cycle(k=1)
    rig.cycle(k=1)
    end = rig.cycle(k=2)  # version 3: replica 1 held nothing the run verified, so a full sync
    assert end.active_replicas == 2 and rig.controller.active_replicas == (0, 1)
    assert list(pool.calls)[-5:-1] == ["wake_up_replicas", "sync_weights", "add_replicas", "resume_generation_replicas"]
    report = rig.rt.last_hybrid_sync_report
    assert report.per_replica_encoding == {"hybrid-0": "delta", "hybrid-1": "full"}
    assert set(report.replica_checksums) == {"hybrid-0", "hybrid-1"}
    assert set(report.replica_checksums.values()) == {report.checksum}
    assert pool.held_versions == {"hybrid-0": 3, "hybrid-1": 3} and rig.current(h0) and rig.current(h1)
    rig.cycle(k=1)
    rig.cycle(k=1)  # replica 1 sleeps through versions 4 and 5, holding 3
    assert pool.held_versions == {"hybrid-0": 5, "hybrid-1": 3} and not rig.current(h1)
    assert h1.wakes == 1 and h1.sleeps == 2
    rig.cycle(k=2)  # version 6: replica 1 gets the chain 3 -> 6 squashed into one delta
    report = rig.rt.last_hybrid_sync_report
    assert report.per_replica_encoding == {"hybrid-0": "delta", "hybrid-1": "delta"}
    assert set(report.replica_checksums.values()) == {report.checksum} and not report.repaired
    assert pool.held_versions == {"hybrid-0": 6, "hybrid-1": 6} and rig.current(h0) and rig.current(h1)
    assert h0.violations == [] and h1.violations == []  # no request ever reached a sleeping engine


def test_a_failed_lending_rolls_back_the_subset_only_and_the_next_one_lends_it(rig: _Rig) -> None:
    pool, h0, h1 = rig.rt.pool, rig.h0, rig.h1
    h0.corrupt = True  # replica 0 loads the weights wrong: its checksum differs from the trainer's
    with pytest.raises(ReplicaPoolError, match="sync_weights"):
        rig.cycle(k=1)
    assert rig.controller.state is ControllerState.STANDALONE_ONLY and not rig.controller.pending_cleanup
    assert list(pool.calls) == ["wake_up_replicas [0]", "sync_weights [0]", "sleep_replicas [0]"]
    assert not pool.awake and pool.held_versions == {} and "hybrid-0" not in rig.lb.routed_counts()
    assert (h1.wakes, h1.sleeps, h1.engine.calls) == (0, 1, [])
    h0.corrupt = False
    resume = rig.rt.rollouter.resume_generation_replicas
    rig.rt.rollouter.resume_generation_replicas = _raise_once(resume)  # type: ignore[method-assign]
    with pytest.raises(ReplicaPoolError, match="resume_generation_replicas"):
        rig.controller.after_sync(rig.cycles, rig.ctx)
    assert list(pool.calls)[3:] == [
        "wake_up_replicas [0]",
        "sync_weights [0]",
        "add_replicas [0]",
        "resume_generation_replicas [0]",
        "remove_replicas [0]",
        "abort_replicas [0]",
        "sleep_replicas [0]",
    ]
    assert not pool.awake and not pool.routing and rig.routed("hybrid-0") == 0
    assert (h1.wakes, h1.sleeps, h1.engine.calls, h1.calls) == (0, 1, [], [])
    rig.rt.rollouter.resume_generation_replicas = resume  # type: ignore[method-assign]
    end = rig.controller.after_sync(rig.cycles, rig.ctx)  # retried: lends replica 0 alone, as asked
    wait_for(lambda: rig.routed("hybrid-0") > 0)
    assert end.activated and rig.controller.active_replicas == (0,) and rig.current(h0)
    assert "hybrid-1" not in rig.lb.routed_counts()


def _raise_once(fn: Any) -> Any:
    calls = {"n": 0}

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("resume refused")
        return fn(*args, **kwargs)

    return wrapped


def test_a_replacement_joins_its_own_slot_lent_or_parked_and_keeps_its_index(rig: _Rig) -> None:
    rt, pool = rig.rt, rig.rt.pool
    rig.cycle(k=1)
    old0, old1 = rig.h0, rig.h1
    for old in (old0, old1):  # both die; what supervise() does with a failed replica
        old.kill()
        rt.hybrid.remove(old)
        pool.replica_failed(old.replica_id)
    wait_for(lambda: old0.in_flight == 0 and rig.lb.in_flight("hybrid-0") == 0)  # its requests went elsewhere
    new1, new0 = _Engine("hybrid-1"), _Engine("hybrid-0")
    rt._join(new1, rig.link.cycle_weights(), rig.link.version)  # slot 1 is not lent: parked, untouched
    rt._join(new0, rig.link.cycle_weights(), rig.link.version)  # slot 0 is lent: awake, current, routed to
    assert rt.hybrid == [new1, new0]  # the runtime's order changed; the slots' did not
    assert (new1.wakes, new1.engine.calls, new1.calls) == (0, [], [])
    assert new0.wakes == 1 and rig.current(new0) and pool.held_versions == {"hybrid-0": 1}
    wait_for(lambda: new0.calls != [])  # the load balancer routes to the replacement
    rig.controller.before_step(2, rig.ctx, wait_for_samples=lambda n: None)  # index 0 is still hybrid-0
    assert (new0.sleeps, new1.sleeps) == (1, 0) and not pool.awake


def test_overlap_sync_prepares_only_the_subset_lent_and_puts_back_what_was_not_lent(rig: _Rig) -> None:
    rt, pool, h0, h1 = rig.rt, rig.rt.pool, rig.h0, rig.h1
    overlap = OverlapSync(clock=time.monotonic, call_log=[])
    ranks = SimpleNamespace(need_devices=lambda: None)
    rig.policy.k = 1
    assert overlap.will_activate(rig.controller, rt, 1, lambda: rig.ctx) and overlap.subset == (0,)
    overlap.prepare(rt, ranks, rig.link.cycle_weights(), rig.link.version, 1)
    assert list(pool.calls) == ["wake_up_replicas [0] (overlapped)", "sync_weights [0] (overlapped)"]
    assert overlap.events[-1]["replicas"] == [0] and overlap.events[-1]["hybrid_error"] is None
    assert (h1.wakes, h1.engine.calls) == (0, [])
    end = rig.controller.after_sync(1, rig.ctx)
    overlap.finish(rig.controller, rt, end, 1)
    assert list(pool.calls)[2:6] == [
        "wake_up_replicas [0] (no-op: awake)",
        "sync_weights [0] (no-op: current)",
        "add_replicas [0]",
        "resume_generation_replicas [0]",
    ]
    assert "undo_s" not in overlap.events[-1] and pool.awake_indices == (0,) and rig.current(h0)
    # the policy changes its mind between the preparation (k = 2) and the activation (k = 1): replica 1 goes back
    rig.controller.before_step(2, rig.ctx, wait_for_samples=lambda n: None)
    rig.link.step()
    rig.policy.k = 2
    assert overlap.will_activate(rig.controller, rt, 2, lambda: rig.ctx) and overlap.subset is None
    overlap.prepare(rt, ranks, rig.link.cycle_weights(), rig.link.version, 2)
    assert pool.awake_indices == (0, 1) and rig.current(h1)
    rig.policy.k = 1
    end = rig.controller.after_sync(2, rig.ctx)
    overlap.finish(rig.controller, rt, end, 2)
    assert rig.controller.active_replicas == (0,) and pool.awake_indices == (0,)
    assert list(pool.calls)[-1] == "sleep_replicas [1]" and h1.sleeps == 2 and "undo_s" in overlap.events[-1]
    assert "hybrid-1" not in rig.lb.routed_counts()
