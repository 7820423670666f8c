"""HybridRun: the fit's rollout side and scheduler, driven without Lightning through a FitPort."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Any

from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.rewards import RewardConfig
from lightning_hybrid_rollout.run.hybrid_run import HybridRun
from lightning_hybrid_rollout.run.rank_protocol import BoundaryProtocol
from tests.lightning.test_callback_context import _FakeRuntime


class _Fit:
    """A one-rank FitPort: records onloads, checkpoints and console lines."""

    world_size = 1

    def __init__(self, log: list[str]) -> None:
        self.protocol = BoundaryProtocol(
            broadcast=lambda m: m, offload=lambda: log.append("offload"), barrier=lambda: None
        )
        self.weights: list[tuple[str, Any]] | None = []
        self.lines: list[str] = []
        self.checkpoints: list[str] = []
        self._log = log

    def check_interrupted(self) -> None:
        pass

    def save_checkpoint(self, reason: str) -> None:
        self.checkpoints.append(reason)

    def onload(self) -> None:
        self._log.append("onload")

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warn(self, message: str) -> None:
        self.lines.append(message)


def _run(policy: str) -> HybridRun:
    a = AsyncTrainingConfig(
        dynamic_schedule_policy=policy, mini_batch_size=8, trigger_parameter_sync_step=2, staleness_threshold=0.5
    )
    return HybridRun(
        RolloutConfig(model_path="unused", hybrid_replicas=1),
        a,
        dataset=None,
        task="arithmetic",
        task_kwargs={},
        rewards=RewardConfig(),
        agentic=AgenticConfig(),
        trace=False,
    )


def test_a_run_drives_two_cycles_in_verls_call_order_through_its_fit_port() -> None:
    run = _run("default")
    rt = _FakeRuntime(run.async_training)
    run.runtime = rt
    run.controller = run.build_controller(rt.pool)
    fit = _Fit(run.call_log)
    trained: list[int] = []
    try:
        run.start_fit(fit, world_size=1)
        for step in range(4):
            cycle_start = run.is_sync_boundary(step)
            run.step.begin(cycle_start)
            if cycle_start:
                run.before_step()
                fit.onload()
            run.step.start_training()
            trained.append(len(run.next_batch()))
            run.end_training()
            if run.is_sync_boundary(step + 1):
                closed = run.end_cycle()
                assert closed.end is not None and closed.sync_s >= 0.0
            else:
                run.end_step()
    finally:
        rt.rollouter.stop()
    assert (run.param_version, run.cycles_done, run.samples_consumed) == (2, 2, sum(trained))
    assert trained == [run.async_training.required_samples] * 4
    # verl's order: the start decision; per cycle the deactivation decision at its first step (then, if it
    # deactivates, the switch), the onload, and at its end the standalone sync before the activation decision
    decision = r"should_activate_after_step (activate (request_rebalance )?)?update_after_step "
    cycle = r"should_deactivate (deactivate_wait_samples )?(deactivate )?onload sync_standalone " + decision
    assert re.fullmatch(decision + f"({cycle}){{2}}", " ".join(run.call_log) + " "), run.call_log
    run.runtime = None  # the checkpoint without the rollouter's part (the fake has none)
    state = run.state_dict()
    assert (state["param_version"], state["cycles_done"]) == (2, 2) and "controller" in state


def test_a_resumed_run_applies_its_checkpoint_at_the_fit_start_and_says_so() -> None:
    first = _run("static_fully_async")
    first.param_version, first.cycles_done, first.samples_consumed = 3, 3, 96
    state = {k: v for k, v in first.state_dict().items()}
    run = _run("static_fully_async")
    run.load_state_dict(state)
    assert run.resumed and run.param_version == 3
    rt = _FakeRuntime(run.async_training)
    pushed: list[int] = []
    rt.push_standalone = lambda weights, version: pushed.append(version) or 0.0  # type: ignore[method-assign]
    run.runtime = rt
    run.controller = run.build_controller(rt.pool)
    fit = _Fit(run.call_log)
    try:
        run.start_fit(fit, world_size=1)
    finally:
        rt.rollouter.stop()
    assert pushed == [3] and not run.resumed
    assert fit.lines and fit.lines[0].startswith("[lhr] resumed at param version 3, cycle 3")


def test_the_run_imports_without_lightning() -> None:
    code = (
        "import sys; sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"
        "import lightning_hybrid_rollout.run.hybrid_run, lightning_hybrid_rollout.run.runtime\n"
        "import lightning_hybrid_rollout.validation.attach, lightning_hybrid_rollout.training.shared_prompt\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_clock_a_test_gives_reaches_the_step_times() -> None:
    run = _run("default")
    now = [100.0]
    run.clock = lambda: now[0]
    run.step.begin(cycle_start=True)
    now[0] = 101.5
    run.step.start_training()
    assert run.step.start == 101.5
    assert time.monotonic() != 101.5


def test_partial_lending_is_accepted_for_a_real_run_and_the_controller_lends_subsets() -> None:
    a = AsyncTrainingConfig(
        dynamic_schedule_policy="rate_matched", dynamic_schedule_policy_kwargs={"partial_lending": True}
    )
    run = HybridRun(
        RolloutConfig(model_path="m", hybrid_replicas=2),
        a,
        dataset=None,
        task="arithmetic",
        task_kwargs={},
        rewards=RewardConfig(),
        agentic=AgenticConfig(),
    )
    assert run.policy.partial_lending is True  # type: ignore[attr-defined]
    controller = run.build_controller(object())  # type: ignore[arg-type]
    assert controller.num_hybrid_replicas == 2  # the controller hands the pool `replicas=` the lent subset


def test_a_resume_lends_the_checkpoints_subset_again() -> None:
    """A checkpoint taken while 1 of 2 hybrid replicas was lent: the fresh (parked) pool lends that one again."""

    class Pool:
        def __init__(self) -> None:
            self.calls: list[tuple[str, Any]] = []

        def __getattr__(self, name: str) -> Any:
            return lambda **kw: self.calls.append((name, kw.get("replicas")))

    run = HybridRun(
        RolloutConfig(model_path="m", hybrid_replicas=2),
        AsyncTrainingConfig(),
        dataset=None,
        task="arithmetic",
        task_kwargs={},
        rewards=RewardConfig(),
        agentic=AgenticConfig(),
    )
    before = run.build_controller(Pool())  # type: ignore[arg-type]
    before.activate(3, replicas=[0])
    pool = Pool()
    run.runtime = type("Runtime", (), {"pool": pool})()
    run.controller = run.build_controller(pool)  # type: ignore[arg-type]
    run.controller.load_state_dict(before.state_dict())
    run._restore_pool_state()
    lent = (0,)
    assert pool.calls == [
        ("wake_up_replicas", lent),
        ("sync_weights", lent),
        ("add_replicas", lent),
        ("resume_generation_replicas", lent),
    ]
