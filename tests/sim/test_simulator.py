"""Simulator invariants: conservation, the time breakdown, the balance bound, and the ideal case."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_hybrid_rollout.sim import BREAKDOWN_KEYS, Scenario, SwitchCosts, simulate
from lightning_hybrid_rollout.sim.runner import GAP_KEYS, run_once
from lightning_hybrid_rollout.trace import load_trace

from .conftest import dynamic_run, tiny_scenario


def _check_invariants(result):
    for r in result.runs:
        # conservation: every generated sample is trained or still queued; every admitted one generated or pending
        assert r.generated == r.consumed + r.queued, r.name
        assert r.admitted == r.generated + r.outstanding, r.name
        assert set(r.breakdown_s) == set(BREAKDOWN_KEYS)
        assert all(v >= 0 for v in r.breakdown_s.values())
        assert math.isclose(sum(r.breakdown_s.values()), r.time_s, rel_tol=1e-9, abs_tol=1e-6), r.name
        # the bound is never beaten, neither the run's own nor the scenario's
        assert r.time_s >= r.work_bound_s * (1 - 1e-9), r.name
        assert r.time_s >= result.balance_bound_s * (1 - 1e-9), r.name
        assert 0 < r.efficiency <= 1 + 1e-9
        assert 0 <= r.resource_utilization <= 1 + 1e-9
        # the gap accounting covers the time beyond the balance term exactly
        parts = sum(v for k, v in r.gap_s.items() if k != "total")
        assert set(r.gap_s) == {*GAP_KEYS, "total"}, r.name
        assert math.isclose(parts, r.gap_s["total"], rel_tol=1e-6, abs_tol=1e-6 * r.time_s + 1e-6), r.name
        assert r.gap_s["total"] >= -1e-6 * r.time_s, r.name


def test_tiny_scenario_invariants(tiny):
    result = simulate(tiny)
    _check_invariants(result)
    sc = tiny
    for r in result.runs:
        assert r.consumed == sc.steps * sc.step_required_samples
        assert len(r.steps) == sc.steps
        assert {"dynamic_resource/mq_size", "dynamic_resource/resource_utilization"} <= set(r.steps[0])
    static = result.run("static_2_2")
    assert static.activations == 0 and static.breakdown_s["hybrid_switching"] == 0


def test_simulation_is_deterministic(tiny):
    a = run_once(tiny, "dynamic_rate_matched")
    b = run_once(tiny, "dynamic_rate_matched")
    assert a.time_s == b.time_s and a.breakdown_s == b.breakdown_s


def test_replicas_slowed_while_the_trainer_trains_decode_less_in_training_spans_and_the_run_takes_longer(tmp_path):
    replica = {"devices": 1, "tokens_per_s": 40.0, "batch_slowdown": 0.05}
    full = run_once(tiny_scenario(replica=replica), "static_2_2")
    slowed = tiny_scenario(replica={**replica, "speed_while_training": 0.6})
    trace_path = tmp_path / "slowed.json"
    result = run_once(slowed, "static_2_2", trace_path=trace_path)
    assert result.time_s > full.time_s * 1.01
    # the gap accounting books the lost speed on its own line, and its parts still sum to the total
    assert result.gap_s["slowed_while_training"] > 0 == full.gap_s["slowed_while_training"]
    assert sum(result.gap_s[k] for k in GAP_KEYS) == pytest.approx(result.gap_s["total"], abs=1e-6)
    trace = load_trace(trace_path)
    tokens = trace.counter_series("generated_tokens.standalone_0")
    spans = [s for s in trace.spans_of("trainer/trainer") if s.name == "training"]

    def at(t: float) -> float:  # the sample written at a span's boundary
        nearest = min(tokens, key=lambda c: abs(c.t - t))
        assert abs(nearest.t - t) < 1e-3
        return nearest.value

    # a full replica (4 in flight) decodes X(4) = 4 x 40 / (1 + 0.05 x 3) tokens/s; inside the spans at most 0.6 of
    # that (a few spans start with fewer samples in flight)
    inside = sum(at(s.end_s) - at(s.start_s) for s in spans) / sum(s.end_s - s.start_s for s in spans)
    full_rate = 4 * 40.0 / (1 + 0.05 * 3)
    assert 0.5 * full_rate < inside <= 0.6 * full_rate * 1.001


def test_a_replica_faster_while_the_trainer_trains_never_lets_a_run_beat_its_balance_bound():
    """A fitted ``speed_while_training`` can exceed 1: the quickstart's dynamic run measured 1.16 (its standalone
    replica decoded faster while the trainer trained than while the hybrid replica served), and `lhr plan` on it
    printed efficiencies of 1.02. The bound credits every replica with that best speed, so no run beats it. The
    scenario is the quickstart's fit (short responses, a generation-bound 1+1 split), 40 steps."""
    data = {
        "name": "faster_while_training",
        "steps": 40,
        "async_training": {"mini_batch_size": 256, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.5},
        "concurrent_samples_per_replica": 64,
        "group_size": 8,
        "lengths": {"mean_tokens": 2.0, "sigma": 0.07, "min_tokens": 1, "max_tokens": 4, "prompt_tokens": 5},
        "replica": {"devices": 1, "tokens_per_s": 82.0, "batch_slowdown": 0.02, "kv_cache_tokens": 32768},
        "hybrid_replica": {"devices": 1, "tokens_per_s": 28.5, "batch_slowdown": 0.02, "kv_cache_tokens": 32768},
        "trainer": {"device_s_per_token": 6.9e-05, "step_overhead_s": 0.03},
        "switch": {"standalone_sync_s": 0.012, "standalone_commit_s": 0.003, "hybrid_sync_s": 0.005},
        "runs": [
            {"name": "static", "train_devices": 1, "rollout_devices": 1},
            {
                "name": "static_staged_keep",
                "train_devices": 1,
                "rollout_devices": 1,
                "async_training": {"staged_standalone_sync": True, "standalone_sync_mode": "keep"},
            },
            dynamic_run("dynamic", "rate_matched", train=1, rollout=1),
        ],
    }
    data["replica"]["speed_while_training"] = 1.16
    for r in simulate(Scenario.from_dict(data)).runs:
        assert r.time_s >= r.work_bound_s, (r.name, r.time_s, r.work_bound_s)


def test_the_gap_books_the_speed_a_replica_lacks_outside_training_when_training_speeds_it_up():
    replica = {"devices": 1, "tokens_per_s": 40.0, "batch_slowdown": 0.05, "speed_while_training": 1.5}
    result = simulate(tiny_scenario(replica=replica, trainer={"device_s_per_token": 0.002}))
    for r in result.runs:  # dynamic_default's hybrid replica serves outside training: its lack is booked once
        assert r.time_s >= r.work_bound_s
        assert r.gap_s["slowed_while_training"] > 0
        assert sum(r.gap_s[k] for k in GAP_KEYS) == pytest.approx(r.gap_s["total"], abs=1e-6)
        assert abs(r.gap_s["residual"]) < 1e-6 * r.time_s


def test_a_replica_must_keep_some_speed_while_the_trainer_trains():
    with pytest.raises(ValueError, match="speed_while_training"):
        tiny_scenario(replica={"devices": 1, "tokens_per_s": 40.0, "speed_while_training": 0})


_POLICIES = st.sampled_from(["default", "rate_matched", "fixed_ratio", "static_fully_async"])


@st.composite
def scenarios(draw):
    trigger = draw(st.integers(1, 3))
    group = draw(st.integers(1, 2))
    required = group * draw(st.integers(1, 4))
    train = draw(st.integers(1, 3))
    hybrid = draw(st.booleans())
    rollout = draw(st.integers(0 if hybrid else 1, 3))
    options = {
        "overlap_sync": draw(st.booleans()),
        "early_first_sync": draw(st.booleans()),
        "staged_standalone_sync": draw(st.booleans()),
        "dynamic_schedule_enable_rebalance": draw(st.booleans()),
    }
    if hybrid:
        options["dynamic_schedule_policy"] = draw(_POLICIES)
    run = {
        "name": "r",
        "train_devices": train,
        "rollout_devices": rollout,
        "hybrid": hybrid,
        "async_training": options,
        "standalone_sync_aborts": draw(st.booleans()),
    }
    kv = draw(st.none() | st.floats(200, 5000))
    return Scenario.from_dict(
        {
            "name": "random",
            "seed": draw(st.integers(0, 1000)),
            "steps": draw(st.integers(1, 4)),
            "async_training": {
                "mini_batch_size": required,
                "trigger_parameter_sync_step": trigger,
                "staleness_threshold": draw(st.sampled_from([0.0, 0.2, 0.5, 1.0])),
            },
            "concurrent_samples_per_replica": draw(st.integers(1, 6)),
            "group_size": group,
            "lengths": {
                "mean_tokens": draw(st.floats(20, 400)),
                "sigma": draw(st.floats(0, 1)),
                "max_tokens": 3000,
                "prompt_tokens": draw(st.integers(0, 50)),
                "drift_per_step": draw(st.floats(-0.2, 0.5)),
            },
            "replica": {
                "devices": 1,
                "tokens_per_s": draw(st.floats(5, 100)),
                "batch_slowdown": draw(st.floats(0, 0.3)),
                "kv_cache_tokens": kv,
            },
            "hybrid_replica": {
                "devices": 1,
                "tokens_per_s": draw(st.floats(5, 100)),
                "batch_slowdown": draw(st.floats(0, 0.3)),
            },
            "trainer": {"device_s_per_token": draw(st.floats(0.0005, 0.02)), "step_overhead_s": draw(st.floats(0, 2))},
            "switch": {
                k: draw(st.floats(0, 3))
                for k in ("standalone_sync_s", "standalone_commit_s", "hybrid_sync_s", "wake_s", "sleep_s")
            },
            "runs": [run],
        }
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_bound_never_beaten_and_samples_conserved(sc):
    _check_invariants(simulate(sc))


def test_zero_switch_cost_and_ideal_rates_approach_the_bound():
    sc = Scenario.from_dict(
        {
            "name": "ideal",
            "steps": 40,
            "async_training": {"mini_batch_size": 32, "trigger_parameter_sync_step": 2, "staleness_threshold": 1.0},
            "concurrent_samples_per_replica": 8,
            "lengths": {"mean_tokens": 400, "sigma": 0.3, "prompt_tokens": 0},
            "replica": {"devices": 1, "tokens_per_s": 50.0, "batch_slowdown": 0.0},
            "trainer": {"device_s_per_token": 0.004},
            "switch": SwitchCosts.zero().__dict__,
            "runs": [
                {"name": "static_3_1", "train_devices": 3, "rollout_devices": 1},
                dynamic_run("dynamic", "rate_matched", 3, 1),
            ],
        }
    )
    result = simulate(sc)
    _check_invariants(result)
    assert result.run("static_3_1").efficiency < 0.7  # rollout-bound without help
    assert result.run("dynamic").efficiency > 0.93  # free switching closes almost all of it


@pytest.mark.parametrize("sequencing", ["sequential", "overlap_sync"])
def test_colocated_mode_only_hybrid(sequencing):
    sc = tiny_scenario(
        runs=[
            dynamic_run("colocated", "static_fully_async", 2, 0, overlap_sync=sequencing == "overlap_sync"),
        ]
    )
    run = sc.run("colocated")
    assert run.sequencing == sequencing and run.config.only_hybrid  # colocated: the split sets only_hybrid
    result = simulate(sc)
    _check_invariants(result)
    assert result.run("colocated").activations == sc.steps  # at start, then after every sync but the last


def test_overlap_sync_hides_the_hybrid_wake_and_sync_under_the_standalone_sync():
    sc = tiny_scenario(
        runs=[dynamic_run("sequential", "default"), dynamic_run("overlap", "default", overlap_sync=True)]
    )
    result = simulate(sc)
    sequential, overlap = result.run("sequential"), result.run("overlap")
    assert sequential.activations > 1 and overlap.activations > 1
    # only the startup activation (no standalone sync to hide it under) still syncs on the critical path
    assert overlap.breakdown_s["weight_sync_hybrid"] == pytest.approx(sc.switch.hybrid_sync_s)
    switch_sequential = sequential.breakdown_s["hybrid_switching"] + sequential.breakdown_s["weight_sync_hybrid"]
    switch_overlap = overlap.breakdown_s["hybrid_switching"] + overlap.breakdown_s["weight_sync_hybrid"]
    assert switch_overlap / overlap.activations < switch_sequential / sequential.activations
