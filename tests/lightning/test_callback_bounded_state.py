"""The callback's memory and checkpoint stay flat over a long fit (fast: the replay runtime on a virtual clock).

The callback's hooks drive hundreds of sync cycles, each switching the hybrid replicas off at its start and on at its
end (with and without ``overlap_sync``), and every container the callback keeps (its own, its helpers', the
controller's and the policy's) and its pickled ``state_dict()`` are compared after 50 and after 200 cycles.
"""

from __future__ import annotations

import pickle
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.schedule import available_policies
from lightning_hybrid_rollout.sim.scenario import SwitchCosts
from tests.lightning.fakes import fake_trainer
from tests.lightning.test_callback_matches_simulator import _Clock, _Pool, _ReplayRuntime

CHECKED, LONG = 50, 200  # cycles


class _Runtime(_ReplayRuntime):
    """The replay runtime with what a checkpoint and ``overlap_sync`` read of it."""

    def rollouter_state(self) -> dict[str, Any]:
        return {"queue": self.q}

    def peek_role_window(self) -> Any:
        return self.window

    def push_standalone_overlapped(self, weights: Any, version: int) -> Any:
        start = self.clock.now
        self.pool.wake_up_replicas()
        self.pool.sync_weights()
        self.clock.advance(self.sync_s)
        end = self.clock.now
        return SimpleNamespace(
            start_s=start, standalone_end_s=end, end_s=end, saved_s=0.0, standalone_s=self.sync_s, wake_s=0.0,
            hybrid_sync_s=0.0, wall_s=end - start, hybrid_error=None,
        )  # fmt: skip


def _elements(value: Any, seen: set[int]) -> int:
    """Items in every container reachable from ``value`` (through containers and plain objects' attributes)."""
    if id(value) in seen or isinstance(value, (str, bytes, int, float, bool, type(None), torch.Tensor)):
        return 0
    if callable(value) and not hasattr(value, "__dict__"):
        return 0
    seen.add(id(value))
    if isinstance(value, (_ReplayRuntime, _Pool, _Clock, torch.nn.Module)):  # the test's stand-ins, not the callback
        return 0
    if isinstance(value, dict):
        return len(value) + sum(_elements(k, seen) + _elements(v, seen) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset, deque)):
        return len(value) + sum(_elements(v, seen) for v in value)
    attrs = getattr(value, "__dict__", None)
    return 0 if attrs is None else _elements(attrs, seen)


def _run(policy: str, overlap_sync: bool) -> dict[int, tuple[int, int]]:
    """``cycles -> (items the callback keeps, pickled state_dict bytes)`` after ``CHECKED`` and ``LONG`` cycles."""
    a = AsyncTrainingConfig(
        mini_batch_size=8,
        trigger_parameter_sync_step=2,
        dynamic_schedule_policy=policy,
        dynamic_schedule_enable_rebalance=False,
        overlap_sync=overlap_sync,
    )
    cb = HybridRolloutCallback(RolloutConfig(model_path="unused", hybrid_replicas=1), a, trace=False)
    clock = _Clock()
    rt = _Runtime(clock, SwitchCosts())
    cb.run.clock, cb.run.runtime = clock, rt
    cb.run.controller = cb.run.build_controller(rt.pool)  # type: ignore[arg-type]
    # every cycle switches: off at its start, on at its end (the policy's own state still updates every cycle)
    cb.policy.should_activate_after_step = lambda step, active, ctx: True  # type: ignore[method-assign]
    cb.policy.should_deactivate = lambda step, active, ctx: active  # type: ignore[method-assign]
    cb.policy.deactivate_wait_samples = lambda ctx: 1  # type: ignore[method-assign]
    trainer = fake_trainer()
    trainer.strategy.broadcast = lambda obj, src=0: obj
    module = SimpleNamespace(param_version=0, log=lambda *args, **kwargs: None)
    rt.q, rt.batch_tokens, rt.sync_s = 100, 40, 0.5
    cb.on_train_start(trainer, module)  # type: ignore[arg-type]
    out: dict[int, tuple[int, int]] = {}
    for step in range(LONG * a.trigger_parameter_sync_step):
        trainer.global_step = step
        cb.on_train_batch_start(trainer, module, None, step)  # type: ignore[arg-type]
        cb.run.next_batch()
        clock.advance(1.0)
        trainer.global_step = step + 1
        rt.generated += 8
        cb.on_train_batch_end(trainer, module, None, None, step)  # type: ignore[arg-type]
        if cb.run.cycles_done in (CHECKED, LONG) and trainer.global_step % a.trigger_parameter_sync_step == 0:
            out[cb.run.cycles_done] = (_elements(cb, set()), len(pickle.dumps(cb.state_dict())))
    assert cb.run.switch_totals["activate"]["count"] == LONG + 1  # the start decision's and one per cycle
    assert cb.run.switch_totals["deactivate"]["count"] == LONG
    assert len(cb.run.overlap.events) == (cb.run.overlap.events.maxlen if overlap_sync else 0)
    return out


@pytest.mark.parametrize("overlap_sync", [False, True], ids=["seed_order", "overlap_sync"])
@pytest.mark.parametrize("policy", available_policies())
def test_the_callbacks_state_and_checkpoint_do_not_grow_with_the_cycles(policy: str, overlap_sync: bool) -> None:
    sizes = _run(policy, overlap_sync)
    (items_checked, ckpt_checked), (items_long, ckpt_long) = sizes[CHECKED], sizes[LONG]
    assert items_long == items_checked, (policy, sizes)
    assert ckpt_long - ckpt_checked <= 16, (policy, sizes)  # a few counters take a byte more, nothing per cycle


def test_a_checkpoint_with_every_switch_event_loads_as_totals() -> None:
    """A version-1 checkpoint saved each switch event; they load as the totals (and are not kept)."""
    a = AsyncTrainingConfig(mini_batch_size=8, trigger_parameter_sync_step=2)
    cb = HybridRolloutCallback(RolloutConfig(model_path="unused", hybrid_replicas=1), a, trace=False)
    old = {
        "version": 1,
        "param_version": 3,
        "cycles_done": 3,
        "samples_consumed": 48,
        "switch_events": [
            {"kind": "activate", "cycle": 0, "duration_s": 1.5},
            {"kind": "deactivate", "cycle": 1, "duration_s": 0.5},
            {"kind": "activate", "cycle": 1, "duration_s": 2.5},
        ],
        "policy": cb.policy.state_dict(),
    }
    cb.load_state_dict(old)
    assert cb.run.switch_totals == {
        "activate": {"count": 2, "seconds": 4.0},
        "deactivate": {"count": 1, "seconds": 0.5},
    }
    assert cb.run.switch_events == [] and "switch_events" not in cb.state_dict()
