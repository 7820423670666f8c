"""``hysteresis_ratio`` (verl v1 ``separate_async``'s switch rule) runs in every preset, beside ``default`` and
``rate_matched``, and moves its ratio there only as verl's rule allows."""

from __future__ import annotations

import itertools

import pytest

from lightning_hybrid_rollout.sim import get_preset, preset_names, simulate
from lightning_hybrid_rollout.sim.runner import run_once
from tests.sim.conftest import dynamic_run, tiny_scenario

RUN = "dynamic_hysteresis_ratio"


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_runs_it_beside_default_and_rate_matched(preset):
    sc = get_preset(preset)
    ours = [r for r in sc.runs if r.policy == "hysteresis_ratio"]
    assert [r.name for r in ours] == [RUN]
    spec = ours[0]
    assert spec.policy_kwargs["deactivate_ratio"] == 0.4  # verl's switch_threshold_ratio default
    split = (spec.train_devices, spec.rollout_devices)
    for other in ("default", "rate_matched"):
        assert any(r.policy == other and (r.train_devices, r.rollout_devices) == split for r in sc.runs)

    result = run_once(sc, spec)
    assert result.time_s > 0 and sum(result.breakdown_s.values()) == pytest.approx(result.time_s)
    ratios = [0.4] + [s["sim/deactivate_ratio"] for s in result.steps]
    floor = 1.0 / sc.trigger_parameter_sync_step
    for before, after in itertools.pairwise(ratios):
        step = round(after - before, 9)
        # verl: +0.05 after 2 idle cycles (capped at 1), −0.03 after 2 calm ones (floored at one mini-batch), else 0
        assert step in (0.0, 0.05, -0.03) or after in (1.0, floor), (before, after)
    active = [s["dynamic_resource/hybrid_active"] for s in result.steps[:-1]]
    if preset == "standalone_sufficient":
        assert not any(active)  # only the start (nothing measured, empty queue) lends
    if preset == "rollout_bound":
        assert all(active)  # the queue is always short of the threshold and lending pays


def test_it_runs_with_overlap_sync_and_no_standalone_replicas():
    runs = [
        dynamic_run("hr", "hysteresis_ratio"),
        dynamic_run("hr_overlap", "hysteresis_ratio", overlap_sync=True),
        dynamic_run("hr_colocated", "hysteresis_ratio", train=2, rollout=0),
    ]
    result = simulate(tiny_scenario(runs=runs))
    assert [r.name for r in result.runs] == ["hr", "hr_overlap", "hr_colocated"]
    assert all(r.time_s > 0 for r in result.runs)
    colocated = result.run("hr_colocated")
    assert all(s["dynamic_resource/hybrid_active"] for s in colocated.steps[:-1])  # only_hybrid: always lends
