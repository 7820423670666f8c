"""Test doubles for the schedule tests: a fake clock, a recording replica pool, a scripted policy."""

from __future__ import annotations

from typing import Any

from lightning_hybrid_rollout.schedule.base import DynamicScheduleContext, DynamicSchedulePolicyBase

POOL_METHODS = (
    "wake_up_replicas",
    "sync_weights",
    "add_replicas",
    "resume_generation_replicas",
    "remove_replicas",
    "abort_replicas",
    "sleep_replicas",
    "rebalance_requests",
)


class FakeClock:
    """A manual clock: ``clock()`` reads it, ``advance(s)`` moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingPool:
    """Records every call into ``log`` (shared with the policy), advances the clock by ``costs[method]``, and
    raises for a method as many times as ``failures[method]`` says (the failing call is recorded too)."""

    def __init__(self, clock: FakeClock, log: list[str], costs: dict[str, float] | None = None) -> None:
        self.clock = clock
        self.log = log
        self.costs = dict(costs or {})
        self.failures: dict[str, int] = {}

    def fail(self, method: str, times: int = 1) -> None:
        self.failures[method] = times

    def _call(self, method: str) -> None:
        self.log.append(method)
        self.clock.advance(self.costs.get(method, 0.0))
        if self.failures.get(method, 0) > 0:
            self.failures[method] -= 1
            raise OSError(f"{method} boom")

    def wake_up_replicas(self) -> None:
        self._call("wake_up_replicas")

    def sync_weights(self) -> None:
        self._call("sync_weights")

    def add_replicas(self) -> None:
        self._call("add_replicas")

    def resume_generation_replicas(self) -> None:
        self._call("resume_generation_replicas")

    def remove_replicas(self) -> None:
        self._call("remove_replicas")

    def abort_replicas(self) -> None:
        self._call("abort_replicas")

    def sleep_replicas(self) -> None:
        self._call("sleep_replicas")

    def rebalance_requests(self) -> None:
        self._call("rebalance_requests")


class ScriptedPolicy(DynamicSchedulePolicyBase):
    """Answers what it is told, logs each hook (with the is_hybrid_active it saw), and records the ctx durations
    update_after_step saw."""

    def __init__(
        self, log: list[str], *, deactivate: bool = True, wait: int = 0, activate: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.log = log
        self.deactivate = deactivate
        self.wait = wait
        self.activate = activate
        self.seen_durations: list[tuple[float, float]] = []

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        self.log.append(f"policy.should_deactivate(active={is_hybrid_active})")
        return self.deactivate

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        self.log.append("policy.deactivate_wait_samples")
        return self.wait

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        self.log.append(f"policy.should_activate_after_step(active={is_hybrid_active})")
        return self.activate

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        self.log.append("policy.request_rebalance")

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        self.log.append("policy.update_after_step")
        self.seen_durations.append((ctx.last_activate_duration_s, ctx.last_deactivate_duration_s))
