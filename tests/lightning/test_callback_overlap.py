"""``async_training.overlap_sync`` and ``early_first_sync`` in the runtime (fast: fake replicas, no Ray, no fit).

The callback's real hooks drive a real :class:`RolloutRuntime` (never started: no Ray) whose replicas are in-process
fakes with timed ``wake_up`` / ``sleep``, a real :class:`Rollouter`, the real :class:`HybridReplicaPool` and a real
controller. Only ``weights.push.push_weights_async`` is replaced by a fake that sleeps, so the tests can read from
timestamps what ran concurrently. The policy's decisions are scripted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout import metrics as M
from lightning_hybrid_rollout.config import AsyncTrainingConfig, ConfigError, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.rollout.weights import push
from lightning_hybrid_rollout.run.hybrid_pool import HybridReplicaPool
from lightning_hybrid_rollout.run.runtime import RolloutRuntime
from lightning_hybrid_rollout.schedule import DynamicResourceController
from tests.rollout.fakes import FakeReplica, char_tokenize

TRAIN_S = 0.01
PUSH_S = 0.4  # each fake weight push
WAKE_S = 0.15  # each fake wake-up
SLEEP_S = 0.02


class _Events:
    """Timestamped labels, in the order they happened."""

    def __init__(self) -> None:
        self.items: list[tuple[float, str]] = []

    def add(self, label: str) -> None:
        self.items.append((time.monotonic(), label))

    def labels(self, since: int = 0) -> list[str]:
        return [label for _, label in self.items[since:]]

    def at(self, label: str, since: int = 0) -> float:
        return next(t for t, lab in self.items[since:] if lab == label)


class _TimedReplica(FakeReplica):
    """A fake replica whose engine can sleep and wake (taking ``WAKE_S`` / ``SLEEP_S``)."""

    def __init__(self, *args: Any, events: _Events, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events = events
        self.wakes = 0
        self.sleeps = 0

    async def wake_up(self) -> float:
        self.events.add(f"wake:{self.role}:start")
        await asyncio.sleep(WAKE_S)
        self.wakes += 1
        self.events.add(f"wake:{self.role}:end")
        return WAKE_S

    async def sleep(self) -> float:
        await asyncio.sleep(SLEEP_S)
        self.sleeps += 1
        self.events.add(f"sleep:{self.role}")
        return SLEEP_S


class _Strategy:
    def __init__(self, events: _Events) -> None:
        self.events = events
        self.root_device = torch.device("cpu")
        self.is_offloaded = False
        self.broadcasts: list[str] = []

    def barrier(self, *args: Any) -> None:
        pass

    def broadcast(self, obj: str, src: int = 0) -> str:
        self.broadcasts.append(obj)
        return obj

    def offload_training_state(self) -> float:
        self.events.add("offload")
        self.is_offloaded = True
        return 0.0

    def onload_training_state(self) -> float:
        self.events.add("onload")
        self.is_offloaded = False
        return 0.0


class _Module:
    param_version = 0

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass


@pytest.fixture
def fake_push(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace the real weight push: sleeps ``PUSH_S``, records what it pushed and when."""
    pushes: list[dict[str, Any]] = []

    async def push_weights_async(named_tensors: Any, replicas: Any, version: int, **kwargs: Any) -> Any:
        roles = {r.role for r in replicas}
        assert len(roles) == 1
        role = roles.pop()
        rec = {"role": role, "version": version, "ids": [r.replica_id for r in replicas], "start": time.monotonic()}
        pushes.append(rec)
        events = replicas[0].events
        events.add(f"push:{role}:start")
        await asyncio.sleep(PUSH_S)
        for r in replicas:
            r.weight_version = version
        rec["end"] = time.monotonic()
        events.add(f"push:{role}:end")
        return SimpleNamespace(version=version, seconds=rec["end"] - rec["start"], bytes=0)

    monkeypatch.setattr(push, "push_weights_async", push_weights_async)
    return pushes


def drive(
    tmp_path: Path,
    decide: Callable[[str, int], bool],
    steps: int,
    *,
    world_size: int = 1,
    resume_after: int | None = None,
    keep_active: bool = False,
    **async_training: Any,
) -> dict[str, Any]:
    """Run the callback's hooks for ``steps`` optimizer steps; ``decide(phase, step)`` scripts the activation gate
    (``phase`` is ``"early"`` for overlap_sync's question before the sync, ``"controller"`` for after_sync's).
    Active hybrid replicas are deactivated at every cycle start unless ``keep_active``.

    With ``resume_after=k`` the run stops after step k, saves the callback's state and continues with a fresh
    callback and runtime restored from it (as a resumed fit does).
    """
    a = AsyncTrainingConfig(
        mini_batch_size=8,
        trigger_parameter_sync_step=async_training.pop("trigger_parameter_sync_step", 2),
        staleness_threshold=0.5,
        dynamic_schedule_enable_rebalance=async_training.pop("dynamic_schedule_enable_rebalance", False),
        **async_training,
    )
    out: dict[str, Any] = {
        "a": a,
        "events": _Events(),
        "asks": [],
        "boundaries": [],
        "batches": 0,
        "onloaded_when_training": [],
    }
    events = out["events"]
    strategy = _Strategy(events)
    trainer = SimpleNamespace(
        global_step=0,
        is_global_zero=True,
        world_size=world_size,
        strategy=strategy,
        lightning_module=torch.nn.Linear(2, 2),
        loggers=[],
        callback_metrics={},
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
    )
    module = _Module()

    def build(state: dict[str, Any] | None) -> tuple[HybridRolloutCallback, RolloutRuntime]:
        cb = HybridRolloutCallback(RolloutConfig(model_path="unused", hybrid_replicas=1), a, trace=False)
        rt = RolloutRuntime(
            RolloutConfig(model_path="unused", hybrid_replicas=1),
            a,
            workload=None,
            run_dir=tmp_path,
            trace=False,
            trainer=cb._trainer_side,
        )
        rt.standalone = [
            _TimedReplica("standalone-0", token_latency=(0.0005, 0.001), seed=1, events=events),
        ]
        rt.hybrid = [_TimedReplica("hybrid-0", role="hybrid", token_latency=(0.0005, 0.001), seed=2, events=events)]
        prompts = ({"prompt": f"p{i:04d}"} for i in range(100_000))
        rt.rollouter = Rollouter(
            prompts,
            char_tokenize,
            lambda s: 0.0,
            rt.queue,
            sampling=SamplingSpec(max_tokens=6),
            replicas=rt.standalone,
            max_required_samples=a.max_required_samples,
            concurrent_samples_per_replica=4,
        )
        phases: list[str] = []
        trace_phase = rt.trace_phase

        def record_phase(phase: str, start: float, end: float, **args: Any) -> None:
            phases.append(phase if not args.get("op") else f"{phase}:{args['op']}")
            out.setdefault("spans", []).append((phases[-1], start, end))
            trace_phase(phase, start, end, **args)

        rt.trace_phase = record_phase  # type: ignore[method-assign]
        out.setdefault("phases", []).append(phases)
        cb.run.runtime = rt
        cb.run.run_dir = tmp_path
        cb.run.controller = DynamicResourceController(
            rt.pool,
            cb.policy,
            clock=time.monotonic,
            enable_rebalance=a.dynamic_schedule_enable_rebalance,
            has_hybrid=True,
        )
        policy = cb.policy

        def should_activate_after_step(global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
            phase = "early" if cb.run.call_log and cb.run.call_log[-1] == "overlap_should_activate" else "controller"
            events.add(f"ask:{phase}")
            out["asks"].append((phase, global_steps, len(ctx.step_wait_samples), ctx.trigger_parameter_sync_step))
            return decide(phase, global_steps)

        policy.should_activate_after_step = should_activate_after_step  # type: ignore[method-assign]
        policy.should_deactivate = lambda step, active, ctx: active and not keep_active  # type: ignore[method-assign]
        policy.deactivate_wait_samples = lambda ctx: 1  # type: ignore[method-assign]
        if state is not None:
            cb.load_state_dict(state)
        return cb, rt

    cb, rt = build(None)
    try:
        cb.on_train_start(trainer, module)  # type: ignore[arg-type]
        for step in range(steps):
            if resume_after is not None and step == resume_after:
                state = cb.state_dict()
                out["saved"] = state
                rt.stop()
                out["first"] = cb
                cb, rt = build(state)
                cb.on_train_start(trainer, module)  # type: ignore[arg-type]
            trainer.global_step = step
            cb.on_train_batch_start(trainer, module, None, step)  # type: ignore[arg-type]
            out["onloaded_when_training"].append(not strategy.is_offloaded)
            cb.run.next_batch()
            out["batches"] += 1
            time.sleep(TRAIN_S)
            trainer.global_step = step + 1
            mark = {
                "step": step + 1,
                "events": len(events.items),
                "calls": len(rt.pool.calls),
                "log": len(cb.run.call_log),
                "broadcasts": len(strategy.broadcasts),
            }
            t0 = time.monotonic()
            cb.on_train_batch_end(trainer, module, None, None, step)  # type: ignore[arg-type]
            if cb.run.is_sync_boundary(trainer.global_step):  # type: ignore[arg-type]
                mark["seconds"] = time.monotonic() - t0
                mark["pool_calls"] = rt.pool.calls[mark["calls"] :]
                mark["call_log"] = cb.run.call_log[mark["log"] :]
                mark["labels"] = events.labels(mark["events"])
                mark["broadcast"] = strategy.broadcasts[mark["broadcasts"] :]
                mark["active"] = cb.controller.is_hybrid_active  # type: ignore[union-attr]
                mark["awake"] = rt.pool.awake
                mark["param_version"] = cb.run.param_version
                mark["metrics"] = dict(cb.run.last_cycle_metrics)
                out["boundaries"].append(mark)
    finally:
        rt.stop()
    out.update(cb=cb, rt=rt, strategy=strategy)
    return out


SEED_ACTIVATE = ["wake_up_replicas", "sync_weights", "add_replicas", "resume_generation_replicas"]
PREPARED_ACTIVATE = [
    "wake_up_replicas (overlapped)",
    "sync_weights (overlapped)",
    "wake_up_replicas (no-op: awake)",
    "sync_weights (no-op: current)",
    "add_replicas",
    "resume_generation_replicas",
]


def test_without_overlap_sync_the_cycle_end_keeps_the_seed_order(tmp_path: Path, fake_push: list[Any]) -> None:
    # cycle 1 activates (then the next cycle start deactivates), cycle 2 does not
    run = drive(tmp_path, lambda phase, step: step == 1, steps=4, world_size=2)
    first, second = run["boundaries"]
    assert first["labels"] == [
        "push:standalone:start",
        "push:standalone:end",
        "ask:controller",
        "offload",
        "wake:hybrid:start",
        "wake:hybrid:end",
        "push:hybrid:start",
        "push:hybrid:end",
    ]
    assert first["pool_calls"] == SEED_ACTIVATE
    assert first["call_log"] == [
        "sync_standalone",
        "should_activate_after_step",
        "offload",
        "activate",
        "update_after_step",
    ]
    assert first["broadcast"] == ["offload"] and first["active"]
    # the next cycle: deactivated at its start, standalone sync only, no activation
    assert second["labels"] == ["push:standalone:start", "push:standalone:end", "ask:controller"]
    assert second["pool_calls"] == [] and second["broadcast"] == ["stay"]
    assert [p["role"] for p in fake_push] == ["standalone", "hybrid", "standalone"]
    assert [phase for phase, *_ in run["asks"]] == ["controller"] * 3
    assert "overlap_should_activate" not in run["cb"].run.call_log and run["cb"].run.overlap.events == []
    assert all(run["onloaded_when_training"])


def test_the_rebalance_after_an_activation_is_traced_as_its_own_switch_after_the_activation(
    tmp_path: Path, fake_push: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's activate -> rebalance: each its own ``switching`` span (the planner's fit reads
    ``op=rebalance_requests`` as ``switch.rebalance_s``), back to back, the activation not shifted by the rebalance."""
    rebalance = Rollouter.rebalance_requests

    def slow_rebalance(self: Rollouter, *args: Any, **kwargs: Any) -> int:
        time.sleep(0.2)  # a rebalance that takes long enough to see where its span lies
        return rebalance(self, *args, **kwargs)

    monkeypatch.setattr(Rollouter, "rebalance_requests", slow_rebalance)
    run = drive(tmp_path, lambda phase, step: step == 1, steps=2, dynamic_schedule_enable_rebalance=True)
    spans = [sp for sp in run["spans"] if sp[0].startswith("switching")]
    (_, a0, a1), (_, r0, r1) = spans
    assert [name for name, *_ in spans] == ["switching:activate", "switching:rebalance_requests"]
    assert a1 == pytest.approx(r0, abs=1e-6) and r1 - r0 >= 0.2  # back to back; the rebalance holds its sleep
    # the activation's span is the controller's activation alone (its own clock readings), the rebalance not in it,
    # and starts after the policy chose to activate
    assert a1 - a0 == pytest.approx(run["cb"].controller.last_activate_duration_s, abs=1e-6)
    assert run["events"].at("ask:controller", run["boundaries"][0]["events"]) <= a0
    assert run["boundaries"][0]["pool_calls"] == [*SEED_ACTIVATE, "rebalance_requests"]


def test_cycle_sync_metrics_mean_this_cycles_pushes_and_whether_it_skipped_the_hybrid_sync(
    tmp_path: Path, fake_push: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``weight_sync_time_s`` = standalone + hybrid push seconds of the cycle; ``hybrid_sync_skipped`` 0/1 per cycle."""
    standalone_s: list[float] = []  # each cycle's standalone push, as the runtime measured it
    hybrid_s: list[float] = []  # each reading of the pool's hybrid push seconds (the start-up one first)
    push_standalone, take_cycle_sync_s = RolloutRuntime.push_standalone, HybridReplicaPool.take_cycle_sync_s

    def recorded_push_standalone(self: RolloutRuntime, *args: Any) -> float:
        standalone_s.append(push_standalone(self, *args))
        return standalone_s[-1]

    def recorded_take_cycle_sync_s(self: HybridReplicaPool) -> float:
        hybrid_s.append(take_cycle_sync_s(self))
        return hybrid_s[-1]

    monkeypatch.setattr(RolloutRuntime, "push_standalone", recorded_push_standalone)
    monkeypatch.setattr(HybridReplicaPool, "take_cycle_sync_s", recorded_take_cycle_sync_s)
    run = drive(tmp_path, lambda phase, step: step == 1, steps=6)
    first, second, third = (b["metrics"] for b in run["boundaries"])
    sync, skipped, total = M.WEIGHT_SYNC_TIME_S, M.HYBRID_SYNC_SKIPPED, M.HYBRID_SYNC_SKIPPED_TOTAL
    assert len(standalone_s) == 3 and len(hybrid_s) == 4 and all(s >= PUSH_S - 0.02 for s in standalone_s)
    assert hybrid_s[1] >= PUSH_S - 0.02 and hybrid_s[2:] == [0.0, 0.0]  # the activation's hybrid push, then none
    # each cycle's metric is exactly its own standalone push plus its own hybrid push (none after the first cycle)
    assert [first[sync], second[sync], third[sync]] == [a + b for a, b in zip(standalone_s, hybrid_s[1:])]
    assert [first[skipped], second[skipped], third[skipped]] == [0.0, 1.0, 1.0]
    assert [first[total], second[total], third[total]] == [1.0, 2.0, 3.0]  # the start decision skipped too


def test_overlap_sync_asks_first_and_wakes_and_syncs_hybrid_during_the_standalone_sync(
    tmp_path: Path, fake_push: list[Any]
) -> None:
    run = drive(
        tmp_path,
        lambda phase, step: step == 1,
        steps=2,
        world_size=2,
        overlap_sync=True,
        dynamic_schedule_enable_rebalance=True,
    )
    (b,) = run["boundaries"]
    ev, since = run["events"], b["events"]
    # the policy is asked before anything moves, then every rank offloads (one broadcast), then both halves start
    labels = b["labels"]
    assert labels[:2] == ["ask:early", "offload"], labels
    assert b["broadcast"] == ["offload"]
    s0, s1 = ev.at("push:standalone:start", since), ev.at("push:standalone:end", since)
    w0, w1 = ev.at("wake:hybrid:start", since), ev.at("wake:hybrid:end", since)
    h0, h1 = ev.at("push:hybrid:start", since), ev.at("push:hybrid:end", since)
    assert ev.at("offload", since) <= min(s0, w0)
    assert max(s0, w0) < min(s1, w1)  # started together: each started before the other ended
    assert w1 <= h0 < s1  # the hybrid sync follows the wake-up and starts while the standalone sync still runs
    # the controller is asked after the standalone sync, as in the seed; its activation only adds and resumes
    assert ev.at("ask:controller", since) >= max(s1, h1)
    assert labels.count("wake:hybrid:start") == 1 and labels.count("push:hybrid:start") == 1
    assert b["pool_calls"] == [*PREPARED_ACTIVATE, "rebalance_requests"]
    assert b["call_log"] == [
        "overlap_should_activate",
        "offload",
        "overlap_prepare",
        "sync_standalone",
        "should_activate_after_step",
        "activate",
        "request_rebalance",
        "update_after_step",
    ]
    assert b["active"] and b["awake"]
    hybrid = [p for p in fake_push if p["role"] == "hybrid"]
    assert [p["version"] for p in hybrid] == [b["param_version"]] == [1]
    # blocked for max(standalone, wake + hybrid sync), not their sum
    sequential = PUSH_S + WAKE_S + PUSH_S
    assert b["seconds"] < sequential - 0.25, b["seconds"]
    (event,) = run["cb"].run.overlap.events
    assert event["activated"] and event["hybrid_error"] is None
    # saved: min(standalone, wake + hybrid sync), what the seed's order adds on top of the longer half
    assert event["saved_s"] > PUSH_S - 0.1, event
    assert run["cb"].run.last_cycle_metrics["dynamic_resource/overlap_saved_s"] == event["saved_s"]
    # the hybrid replica is routable and generating for the rollouter
    lb = run["rt"].rollouter.load_balancer
    assert "hybrid-0" in lb.routable_replica_ids()


def test_overlap_sync_traces_the_sync_and_the_overlapped_switch(tmp_path: Path, fake_push: list[Any]) -> None:
    run = drive(tmp_path, lambda phase, step: step == 1, steps=2, overlap_sync=True)
    phases = run["phases"][0]
    i = phases.index("weight_sync")
    assert phases[i - 1] == "switching:offload" or "switching:offload" not in phases  # offload may take 0 s
    assert phases[i + 1] == "switching:hybrid wake/sync (overlapped)"
    assert phases[i + 2] == "switching:activate"


def test_overlap_sync_puts_the_replicas_back_to_sleep_when_the_policy_changes_its_mind(
    tmp_path: Path, fake_push: list[Any]
) -> None:
    # yes before the sync, no after it (the post-sync context)
    run = drive(tmp_path, lambda phase, step: phase == "early", steps=4, world_size=2, overlap_sync=True)
    first, second = run["boundaries"]
    for b in (first, second):
        assert b["labels"][:2] == ["ask:early", "offload"]
        assert b["labels"][-1] == "sleep:hybrid"
        assert b["pool_calls"] == ["wake_up_replicas (overlapped)", "sync_weights (overlapped)", "sleep_replicas"]
        assert b["call_log"] == [
            "overlap_should_activate",
            "offload",
            "overlap_prepare",
            "sync_standalone",
            "should_activate_after_step",
            "overlap_undo",
            "update_after_step",
        ]
        assert b["broadcast"] == ["offload"]
        assert not b["active"] and not b["awake"]
    cb = run["cb"]
    assert [e["activated"] for e in cb.run.overlap.events] == [False, False]
    assert all("undo_s" in e for e in cb.run.overlap.events)
    assert cb.run.switch_events == [] and cb.controller.activate_count == 0
    # the trainer is onloaded at the next cycle start, as after a deactivation: every step trained onloaded
    assert all(run["onloaded_when_training"])
    assert run["events"].labels().count("onload") == 1  # the second boundary is the last step
    assert run["strategy"].is_offloaded
    assert cb.run.hybrid_sync_skipped == 1  # the start decision only: the cycles synced the hybrid replica


def test_overlap_sync_does_nothing_extra_when_the_policy_will_not_activate(
    tmp_path: Path, fake_push: list[Any]
) -> None:
    run = drive(tmp_path, lambda phase, step: False, steps=4, overlap_sync=True)
    for b in run["boundaries"]:
        assert b["labels"] == ["ask:early", "push:standalone:start", "push:standalone:end", "ask:controller"]
        assert b["pool_calls"] == [] and b["broadcast"] == []
    assert [p["role"] for p in fake_push] == ["standalone", "standalone"]
    assert run["cb"].run.overlap.events == [] and run["cb"].run.hybrid_sync_skipped == 3


def test_overlap_sync_is_not_asked_while_hybrid_is_active(tmp_path: Path, fake_push: list[Any]) -> None:
    # activated by the start decision (seed path: nothing to overlap there) and kept active through the cycle
    run = drive(tmp_path, lambda phase, step: True, steps=2, overlap_sync=True, keep_active=True)
    (b,) = run["boundaries"]
    assert b["labels"] == ["push:standalone:start", "push:standalone:end", "ask:controller"]
    assert b["pool_calls"] == [] and b["active"]
    assert run["rt"].pool.calls == SEED_ACTIVATE and run["cb"].run.overlap.events == []


def test_overlap_sync_prepares_again_after_a_deactivation(tmp_path: Path, fake_push: list[Any]) -> None:
    run = drive(tmp_path, lambda phase, step: True, steps=4, overlap_sync=True)
    # the start decision activates (seed path); each cycle start deactivates; each cycle end prepares under the sync
    assert run["rt"].pool.calls[:4] == SEED_ACTIVATE
    for b in run["boundaries"]:
        assert b["labels"][:2] == ["ask:early", "offload"] and b["pool_calls"] == PREPARED_ACTIVATE
    assert [e["kind"] for e in run["cb"].run.switch_events] == [
        "activate",
        "deactivate",
        "activate",
        "deactivate",
        "activate",
    ]


def test_overlap_sync_asks_with_the_cycles_measurements(tmp_path: Path, fake_push: list[Any]) -> None:
    run = drive(tmp_path, lambda phase, step: False, steps=4, overlap_sync=True)
    early = [a for a in run["asks"] if a[0] == "early"]
    assert [(step, n) for _, step, n, _ in early] == [(1, 2), (2, 2)]  # the whole cycle's collections


def test_a_failed_hybrid_half_falls_back_to_the_seed_activation(
    tmp_path: Path, fake_push: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = {"left": 1}
    wake_up = _TimedReplica.wake_up

    async def flaky(self: _TimedReplica) -> float:
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("wake failed")
        return await wake_up(self)

    monkeypatch.setattr(_TimedReplica, "wake_up", flaky)
    run = drive(tmp_path, lambda phase, step: step == 1, steps=2, world_size=2, overlap_sync=True)
    (b,) = run["boundaries"]
    assert b["pool_calls"] == ["wake_up_replicas (overlapped)", "sleep_replicas", *SEED_ACTIVATE]
    assert b["broadcast"] == ["offload"]  # still one broadcast for the boundary
    assert b["active"] and run["cb"].run.overlap.events[0]["hybrid_error"]


# ------------------------------------------------------------------------------------------- early_first_sync


def test_early_first_sync_syncs_after_step_one_then_every_m_steps(tmp_path: Path, fake_push: list[Any]) -> None:
    early = drive(tmp_path / "early", lambda p, s: False, steps=7, trigger_parameter_sync_step=3, early_first_sync=True)
    seed = drive(tmp_path / "seed", lambda p, s: False, steps=7, trigger_parameter_sync_step=3)
    assert [b["step"] for b in early["boundaries"]] == [1, 3, 6]
    assert [b["step"] for b in seed["boundaries"]] == [3, 6]
    # same optimizer steps and samples, one more sync and param version
    assert early["batches"] == seed["batches"] == 7
    assert early["cb"].run.samples_consumed == seed["cb"].run.samples_consumed == 7 * early["a"].required_samples
    assert early["cb"].run.param_version == early["cb"].run.cycles_done == 3
    assert seed["cb"].run.param_version == seed["cb"].run.cycles_done == 2
    assert [p["version"] for p in fake_push if p["role"] == "standalone"] == [1, 2, 3, 1, 2]
    # the policy decides after each sync; the first cycle has one collection, the context keeps m
    assert [(s, n, m) for _, s, n, m in early["asks"]] == [(0, 0, 3), (1, 1, 3), (2, 2, 3), (3, 3, 3)]
    # a cycle starts at step 0 and after every sync: before_step ran at global steps 0, 1, 3, 6
    assert early["cb"].run.call_log.count("should_deactivate") == 4
    assert seed["cb"].run.call_log.count("should_deactivate") == 3


def test_early_first_sync_with_m_one_changes_nothing(tmp_path: Path, fake_push: list[Any]) -> None:
    run = drive(tmp_path, lambda p, s: False, steps=3, trigger_parameter_sync_step=1, early_first_sync=True)
    assert [b["step"] for b in run["boundaries"]] == [1, 2, 3] and run["cb"].run.param_version == 3


@pytest.mark.parametrize("resume_after", [1, 2])
def test_early_first_sync_resumes_on_the_same_cadence(tmp_path: Path, fake_push: list[Any], resume_after: int) -> None:
    run = drive(
        tmp_path,
        lambda p, s: False,
        steps=7,
        trigger_parameter_sync_step=3,
        early_first_sync=True,
        resume_after=resume_after,
    )
    assert run["saved"]["param_version"] == run["saved"]["cycles_done"] == 1
    assert [b["step"] for b in run["boundaries"]] == [1, 3, 6]
    assert run["cb"].run.param_version == run["cb"].run.cycles_done == 3
    assert run["cb"].run.call_log.count("should_deactivate") == (3 if resume_after == 1 else 2)


def test_early_first_sync_and_overlap_sync_prepare_the_first_activation_after_one_step(
    tmp_path: Path, fake_push: list[Any]
) -> None:
    run = drive(
        tmp_path,
        lambda phase, step: step == 1,
        steps=3,
        trigger_parameter_sync_step=3,
        early_first_sync=True,
        overlap_sync=True,
    )
    first = run["boundaries"][0]
    assert first["step"] == 1 and first["pool_calls"] == PREPARED_ACTIVATE and first["active"]


def test_new_flags_default_off_and_are_checked() -> None:
    a = AsyncTrainingConfig()
    assert a.overlap_sync is False and a.early_first_sync is False
    with pytest.raises(ConfigError, match="overlap_sync"):
        AsyncTrainingConfig(overlap_sync="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="early_first_sync"):
        AsyncTrainingConfig(early_first_sync=1)  # type: ignore[arg-type]


def test_the_runtime_and_its_rollouter_share_the_trainer_process_one_event_loop(
    tmp_path: Path, fake_push: list[Any]
) -> None:
    run = drive(tmp_path, lambda phase, step: step == 1, steps=2)
    rt = run["rt"]
    assert rt.rollouter.loop_thread is rt.loop  # the weight pushes and the production run on one loop thread
