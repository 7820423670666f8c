"""The runtime and the simulator turn the same cycle measurements into the same contexts and the same metrics.

The simulator runs a real scenario; every call it makes into the per-cycle core (:class:`CycleLedger`) is recorded.
Those measurements (waits, queue sizes, trained tokens, compute, sync and switch seconds, per-role production, the
rollouter's history) are then fed through the runtime path: the real :class:`HybridRolloutCallback` hooks, the real
controller and the same policy, against a fake runtime whose queries answer with the simulator's values and whose
hybrid pool charges the scenario's switch costs on a virtual clock. The callback measures everything itself (on that
clock) and must build the same policy context at every decision and log the same ``dynamic_resource/*`` values at
every cycle end. (The simulator's last cycle is left out: the simulated fit ends with its last weight sync, and
never asks the policy after it.)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout.config import RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.run.runtime import RuntimeQueries
from lightning_hybrid_rollout.schedule import DynamicResourceController
from lightning_hybrid_rollout.schedule.cycle import CycleEnd, CycleLedger, ProductionByRole, Totals
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateScheduleContext
from lightning_hybrid_rollout.sim import runner
from lightning_hybrid_rollout.sim.presets import get_preset
from tests.lightning.fakes import fake_trainer


class _SpyLedger(CycleLedger):
    """A ledger that records every call (and what it returned)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[Any, ...]] = []

    def add_deactivate_wait(self, seconds: float, samples: int) -> None:
        self.events.append(("deactivate_wait", seconds, samples))
        super().add_deactivate_wait(seconds, samples)

    def add_batch(self, wait_s: float, queue_before: int, samples: int, tokens: int) -> None:
        self.events.append(("batch", wait_s, queue_before, samples, tokens))
        super().add_batch(wait_s, queue_before, samples, tokens)

    def add_compute(self, compute_s: float) -> None:
        self.events.append(("compute", compute_s))
        super().add_compute(compute_s)

    def context(self, totals: Totals, production: ProductionByRole | None = None) -> RateScheduleContext:
        ctx = super().context(totals, production)
        self.events.append(("context", totals, production, ctx))
        return ctx

    def close(self, end: CycleEnd) -> dict[str, float]:
        out = super().close(end)
        self.events.append(("close", end, dict(out)))
        return out


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _Pool:
    """The hybrid pool on the virtual clock, charging the scenario's costs with the simulator pool's no-op rules."""

    def __init__(self, rt: _ReplayRuntime, costs: Any) -> None:
        self.rt, self.costs = rt, costs
        self.awake = False
        self.synced_version = -1
        self.cycle_sync_s = 0.0

    def _spend(self, seconds: float) -> None:
        self.rt.clock.advance(seconds)
        self.rt.q = self.rt.q_after  # the queue the simulator saw once the switch was over

    def wake_up_replicas(self) -> None:
        if not self.awake:
            self._spend(self.costs.wake_s)
            self.awake = True

    def sync_weights(self) -> None:
        if self.synced_version != self.rt.version:
            self.synced_version = self.rt.version
            t0 = self.rt.clock.now
            self._spend(self.costs.hybrid_sync_s)
            self.cycle_sync_s += self.rt.clock.now - t0

    def add_replicas(self) -> None:
        self._spend(self.costs.add_s)

    def resume_generation_replicas(self) -> None:
        self._spend(self.costs.resume_s)

    def remove_replicas(self) -> None:
        self._spend(self.costs.remove_s)

    def abort_replicas(self) -> None:
        self._spend(self.costs.abort_s)

    def sleep_replicas(self) -> None:
        self._spend(self.costs.sleep_s)
        self.awake = False
        self.synced_version = -1

    def rebalance_requests(self) -> None:
        self._spend(self.costs.rebalance_s)

    def take_cycle_sync_s(self) -> float:
        seconds, self.cycle_sync_s = self.cycle_sync_s, 0.0
        return seconds


class _ReplayRuntime(RuntimeQueries):
    """Answers the callback's queries with the simulator's values; waits and syncs advance the virtual clock."""

    def __init__(self, clock: _Clock, costs: Any) -> None:
        self.clock = clock
        self.pool = _Pool(self, costs)
        self.standalone, self.hybrid = [object()], [object()]
        self.q = self.q_after = 0
        self.generated = self.put = 0
        self.version = 0
        self.waits: list[tuple[float, int]] = []  # (seconds, samples put meanwhile), consumed in order
        self.batch_tokens = 0
        self.sync_s = 0.0
        self.window: Any = SimpleNamespace(serving_s={}, decoded_tokens={})
        self.stats: Any = SimpleNamespace(history=[], step_generated_samples=0)

    def queue_size(self) -> int:
        return self.q

    def samples_put(self) -> int:
        return self.put

    def wait_for_samples(self, n: int, timeout: float) -> bool:
        seconds, put = self.waits.pop(0) if self.waits else (0.0, 0)
        self.clock.advance(seconds)
        self.put += put
        return True

    def take_samples(self, n: int, timeout: float) -> list[Any]:
        lengths = [self.batch_tokens // n] * n
        lengths[0] += self.batch_tokens - sum(lengths)
        return [SimpleNamespace(response_length=length) for length in lengths]

    def generated_samples(self) -> int:
        return self.generated

    def set_weight_version(self, version: int) -> None:
        self.version = version

    def new_param_version(self, version: int) -> Any:
        self.version = version
        return self.stats

    def take_role_window(self) -> Any:
        window, self.window = self.window, SimpleNamespace(serving_s={}, decoded_tokens={})
        return window

    def push_standalone(self, weights: Any, version: int) -> float:
        t0 = self.clock.now
        self.clock.advance(self.sync_s)
        return self.clock.now - t0

    def start_generation(self) -> None:
        pass

    def check_health(self) -> None:
        pass

    def trace_phase(self, *args: Any, **kwargs: Any) -> None:
        pass

    def trace_cycle(self, *args: Any, **kwargs: Any) -> None:
        pass


def _window(p: ProductionByRole | None) -> Any:
    p = p or ProductionByRole()
    return SimpleNamespace(
        serving_s={"standalone": p.standalone_serving_s, "hybrid": p.hybrid_serving_s},
        decoded_tokens={"standalone": p.standalone_decoded_tokens, "hybrid": p.hybrid_decoded_tokens},
    )


def _simulate(run_name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, _SpyLedger]:
    """Run the simulator; return the scenario, the run and its (spied) ledger."""
    spies: list[_SpyLedger] = []

    def make(*args: Any, **kwargs: Any) -> _SpyLedger:
        spies.append(_SpyLedger(*args, **kwargs))
        return spies[-1]

    scenario = get_preset("verl_32_devices")
    run = scenario.run(run_name)
    with monkeypatch.context() as m:
        m.setattr(runner, "CycleLedger", make)
        runner.run_once(scenario, run)
    return scenario, run, spies[0]


def _cycles(events: list[tuple[Any, ...]]) -> tuple[tuple[Any, ...], list[list[tuple[Any, ...]]]]:
    """The start decision's context and the events of each cycle (split at each ``close``)."""
    assert events[0][0] == "context"
    cycles, current = [], []
    for ev in events[1:]:
        current.append(ev)
        if ev[0] == "close":
            cycles.append(current)
            current = []
    return events[0], cycles


def _replay(
    scenario: Any, run: Any, sim_shape: Any, start: tuple[Any, ...], cycles: list[list[tuple[Any, ...]]]
) -> _SpyLedger:
    """Drive the callback's hooks through the simulator's cycles; return its (spied) ledger."""
    a = run.config  # the run's one AsyncTrainingConfig: the callback builds its policy from it, as the simulator
    rollout = RolloutConfig(
        model_path="unused",
        standalone_replicas=sim_shape.num_standalone_replicas,
        hybrid_replicas=sim_shape.num_hybrid_replicas,
    )
    cb = HybridRolloutCallback(rollout, a, trace=False)
    own = cb.run.ledger.shape  # the callback's own run shape agrees with the simulator's where both know it
    for name in ("required_samples", "trigger_parameter_sync_step", "buffer_samples", "only_hybrid"):
        assert getattr(own, name) == getattr(sim_shape, name), name
    assert (own.num_standalone_replicas, own.num_hybrid_replicas) == (
        sim_shape.num_standalone_replicas,
        sim_shape.num_hybrid_replicas,
    )
    clock = _Clock()
    rt = _ReplayRuntime(clock, scenario.switch)
    cb.run.clock = clock
    cb.run.runtime = rt
    cb.run.controller = DynamicResourceController(
        rt.pool,
        cb.policy,
        clock=clock,
        enable_rebalance=run.enable_rebalance,
        has_hybrid=True,
        num_hybrid_replicas=cb.run.rollout.hybrid_replicas,  # as HybridRun.build_controller
    )
    # device counts: the simulator's (a replica of the seed scenario spans several devices); a = the trainer's
    spy = _SpyLedger(dataclasses.replace(sim_shape, hybrid_devices=0))
    cb.run.ledger = spy
    trainer = SimpleNamespace(
        global_step=0,
        is_global_zero=True,
        world_size=run.train_devices,
        strategy=SimpleNamespace(
            root_device=torch.device("cpu"), barrier=lambda *a: None, broadcast=lambda obj, src=0: obj
        ),
        lightning_module=torch.nn.Linear(2, 2),
        loggers=[],
        callback_metrics={},
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
    )
    module = SimpleNamespace(param_version=0, log=lambda *a, **k: None)
    _, totals, _, _ = start
    rt.q = rt.q_after = totals.queue_size
    rt.generated = totals.total_generated_samples
    cb.on_train_start(trainer, module)  # type: ignore[arg-type]
    step = 0
    for events in cycles:
        contexts = [ev for ev in events if ev[0] == "context"]
        batches = [ev for ev in events if ev[0] == "batch"]
        computes = [ev for ev in events if ev[0] == "compute"]
        waits = [ev for ev in events if ev[0] == "deactivate_wait"]
        _, end, _ = events[-1]
        before, after = contexts[0], contexts[-1]
        for j, (batch, compute) in enumerate(zip(batches, computes, strict=True)):
            _, wait_s, q0, _, tokens = batch
            trainer.global_step = step
            if j == 0:
                rt.q, rt.generated = before[1].queue_size, before[1].total_generated_samples
                rt.waits = [(w[1], w[2]) for w in waits]
            rt.waits.append((wait_s, 0))
            cb.on_train_batch_start(trainer, module, None, step)  # type: ignore[arg-type]
            rt.q, rt.batch_tokens = q0, tokens
            cb.run.next_batch()
            clock.advance(compute[1])
            step += 1
            trainer.global_step = step
            if j == len(batches) - 1:
                rt.q, rt.generated = after[1].queue_size, after[1].total_generated_samples
                rt.q_after = int(end.mq_size)
                rt.window = _window(after[2])
                rt.sync_s = end.standalone_sync_s
                rt.stats = SimpleNamespace(
                    history=list(end.rollout_history), step_generated_samples=end.step_generated_samples
                )
            cb.on_train_batch_end(trainer, module, None, None, step)  # type: ignore[arg-type]
    return spy


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), f"{where}: runtime {a!r} != simulator {b!r}"
    elif isinstance(a, list):
        assert len(a) == len(b), f"{where}: runtime {a!r} != simulator {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: runtime {a!r} != simulator {b!r}"


def _compare(runtime: list[tuple[Any, ...]], sim: list[tuple[Any, ...]]) -> int:
    """Every context and every cycle's metric dict equal (floats to 1e-9); returns how many were compared."""
    r_ctx = [ev[3] for ev in runtime if ev[0] == "context"]
    s_ctx = [ev[3] for ev in sim if ev[0] == "context"]
    assert len(r_ctx) == len(s_ctx), (len(r_ctx), len(s_ctx))
    for i, (rc, sc) in enumerate(zip(r_ctx, s_ctx, strict=True)):
        for f in fields(sc):
            _same(getattr(rc, f.name), getattr(sc, f.name), f"context {i} .{f.name}")
    r_out = [ev[2] for ev in runtime if ev[0] == "close"]
    s_out = [ev[2] for ev in sim if ev[0] == "close"]
    assert len(r_out) == len(s_out)
    for i, (ro, so) in enumerate(zip(r_out, s_out, strict=True)):
        assert set(ro) == set(so), f"cycle {i + 1}: keys differ: {set(ro) ^ set(so)}"
        for key in so:
            _same(ro[key], so[key], f"cycle {i + 1} {key}")
    return len(r_ctx) + len(r_out)


@pytest.mark.parametrize("run_name", ["dynamic_default", "dynamic_rate_matched"])
def test_the_runtime_builds_the_simulators_contexts_and_metrics_from_the_same_measurements(
    run_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario, run, sim = _simulate(run_name, monkeypatch)
    start, cycles = _cycles(sim.events)
    cycles = cycles[:-1]  # the simulated fit never asks the policy after its last sync
    assert len(cycles) >= 30
    spy = _replay(scenario, run, sim.shape, start, cycles)
    sim_events = [start, *(ev for c in cycles for ev in c)]
    compared = _compare(spy.events, sim_events)
    assert compared > 60
    # the scenario exercised what the comparison is about: switches both ways, skipped and done hybrid syncs
    outs = [ev[2] for ev in sim_events if ev[0] == "close"]
    assert any(o["dynamic_resource/activate_duration_s"] > 0 for o in outs)
    assert any(o["dynamic_resource/deactivate_duration_s"] > 0 for o in outs)
    assert any(o["dynamic_resource/weight_sync_time_s"] > scenario.switch.standalone_sync_s + 1 for o in outs)


def test_time_between_two_steps_of_a_cycle_is_the_trainers_turn_too() -> None:
    """A checkpoint or validation between two steps of a cycle counts in ``alloc`` and ``step`` (the cycle's wall)."""
    from lightning_hybrid_rollout import metrics as M
    from lightning_hybrid_rollout.config import AsyncTrainingConfig
    from lightning_hybrid_rollout.sim.scenario import SwitchCosts

    a = AsyncTrainingConfig(
        mini_batch_size=8, trigger_parameter_sync_step=2, dynamic_schedule_policy="static_fully_async"
    )
    cb = HybridRolloutCallback(RolloutConfig(model_path="unused", hybrid_replicas=1), a, trace=False)
    clock = _Clock()
    rt = _ReplayRuntime(clock, SwitchCosts())
    cb.run.clock, cb.run.runtime = clock, rt
    cb.run.controller = DynamicResourceController(
        rt.pool, cb.policy, clock=clock, enable_rebalance=False, has_hybrid=True
    )
    trainer = fake_trainer()
    module = SimpleNamespace(param_version=0, log=lambda *args, **kwargs: None)
    rt.q, rt.batch_tokens, rt.sync_s = 100, 40, 2.0
    cb.on_train_start(trainer, module)  # type: ignore[arg-type]
    t0 = clock.now
    for step in range(2):
        trainer.global_step = step
        cb.on_train_batch_start(trainer, module, None, step)  # type: ignore[arg-type]
        cb.run.next_batch()
        clock.advance(1.0)  # training
        trainer.global_step = step + 1
        cb.on_train_batch_end(trainer, module, None, None, step)  # type: ignore[arg-type]
        if step == 0:
            clock.advance(5.0)  # e.g. a checkpoint save between the two steps
    out = cb.run.last_cycle_metrics
    assert out[M.TRAIN_COMPUTE_TIME_S] == pytest.approx(2.0)
    assert out[M.TRAIN_ALLOCATED_TIME_S] == pytest.approx(clock.now - t0) == pytest.approx(1 + 5 + 1 + 2)
