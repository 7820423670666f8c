"""``lhr simulate --from-run``: a scenario fitted to a run's trace (``sim/calibrate.py``).

The round trip: a known scenario is simulated with its trace, the trace is fitted, and every number the trace
measures comes back within 5% (the config's settings exactly). The recorded CPU-miniature run in ``tests/data`` fits
to sane values, and its saved config reads back exactly. The recorded pair of real runs (issue #15's
``planner_fidelity``) fits the runtime's newer counters (prompt tokens, the lengths' spread, the concurrency, the
trainer's untraced time), each fit simulates its own run within 3%, and ``Calibration.scenario_for`` converts the
rates across the swap static <-> dynamic as documented.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_hybrid_rollout.analysis.run_bound import read_run
from lightning_hybrid_rollout.sim import simulate
from lightning_hybrid_rollout.sim.calibrate import (
    CalibrationError,
    _clipped_moments,
    _fit_lognormal,
    calibrate_run,
)
from lightning_hybrid_rollout.sim.calibration import SHARED_2VCPU
from lightning_hybrid_rollout.sim.cli import simulate_main
from lightning_hybrid_rollout.sim.scenario import Scenario, SwitchCosts

REAL_RUN = Path(__file__).resolve().parents[1] / "data" / "cpu_miniature_default_8_steps"
#: The recorded runs' host's figures (the CPU miniature's 2 vCPUs), named where a test converts their rates.
HYBRID_SPEED_RATIO, STANDALONE_SPEED_WITH_HYBRID = (
    SHARED_2VCPU.hybrid_speed_ratio,
    SHARED_2VCPU.standalone_speed_with_hybrid,
)


def _generating() -> Scenario:
    """Long enough responses that the simulator's 2-s coalesced in_flight counter follows the replicas' load."""
    return Scenario.from_dict(
        {
            "name": "generating",
            "steps": 12,
            "async_training": {"mini_batch_size": 32, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.5},
            "concurrent_samples_per_replica": 4,
            "lengths": {"mean_tokens": 3000, "sigma": 0.1, "max_tokens": 50000, "drift_per_step": 0.05},
            "replica": {
                "devices": 1,
                "tokens_per_s": 40.0,
                "batch_slowdown": 0.05,
                "kv_cache_tokens": 200000,
                "speed_while_training": 0.85,
            },
            "hybrid_replica": {"devices": 1, "tokens_per_s": 25.0, "batch_slowdown": 0.05, "kv_cache_tokens": 90000},
            "trainer": {"device_s_per_token": 0.0003},
            "switch": {
                "standalone_sync_s": 2.0,
                "hybrid_sync_s": 1.5,
                "wake_s": 1.2,
                "sleep_s": 0.8,
                "add_s": 0.1,
                "resume_s": 0.3,
                "remove_s": 0.2,
                "abort_s": 0.4,
                "rebalance_s": 0.6,
            },
            "runs": [
                {
                    "name": "dyn",
                    "train_devices": 2,
                    "rollout_devices": 2,
                    "hybrid": True,
                    "async_training": {"dynamic_schedule_policy": "rate_matched"},
                }
            ],
        }
    )


def _record(sc: Scenario, out: Path, config: bool = True) -> Path:
    """Simulate ``sc``'s run into a run folder: ``trace.json`` and (optionally) its saved config."""
    result = simulate(sc, trace_dir=out / "sim").runs[0]
    run = out / "run"
    run.mkdir()
    shutil.copy(result.trace_path, run / "trace.json")
    if config:
        section = dataclasses.asdict(sc.runs[0].config)
        (run / "config.yaml").write_text(
            yaml.safe_dump({"trainer": {"callbacks": [{"init_args": {"async_training": section}}]}})
        )
    return run


def _at(data: dict[str, Any], name: str) -> Any:
    for key in name.replace("runs[0]", "runs.0").split("."):
        data = data[int(key)] if isinstance(data, list) else data[key]
    return data


#: What the simulator's trace measures (each must come back within 5%).
MEASURED = (
    "replica.tokens_per_s",
    "replica.speed_while_training",
    "hybrid_replica.tokens_per_s",
    "trainer.device_s_per_token",
    "lengths.mean_tokens",
    "lengths.drift_per_step",
    "switch.standalone_sync_s",
    "switch.hybrid_sync_s",
    "switch.wake_s",
    "switch.sleep_s",
    "switch.add_s",
    "switch.resume_s",
    "switch.remove_s",
    "switch.abort_s",
    "switch.rebalance_s",
)
EXACT = (
    "steps",
    "concurrent_samples_per_replica",
    "replica.devices",
    "hybrid_replica.devices",
    "replica.kv_cache_tokens",
    "hybrid_replica.kv_cache_tokens",
    "runs[0].train_devices",
    "runs[0].rollout_devices",
    "async_training.mini_batch_size",
    "async_training.trigger_parameter_sync_step",
    "async_training.staleness_threshold",
    "runs[0].async_training.dynamic_schedule_policy",
)


def test_round_trip_simulate_trace_fit_gives_the_generating_parameters(tmp_path):
    sc = _generating()
    # the numbers the trace cannot measure come from the generating scenario (they would be the defaults)
    fit = calibrate_run(_record(sc, tmp_path), defaults=sc)
    generating, fitted = sc.to_dict(), fit.scenario.to_dict()
    errors = {}
    for name in MEASURED:
        p = fit.parameter(name)
        assert p.measured and p.observations >= 2, (name, p.source)
        errors[name] = abs(_at(fitted, name) / _at(generating, name) - 1.0)
    assert max(errors.values()) < 0.05, errors
    for name in EXACT:
        assert _at(fitted, name) == _at(generating, name), name
        assert fit.parameter(name).measured, name
    assert fit.scenario.runs[0].hybrid
    # the defaults it kept are said to be defaults
    for name in ("lengths.sigma", "lengths.prompt_tokens", "replica.batch_slowdown", "switch.standalone_commit_s"):
        assert fit.parameter(name).source.startswith("default, not measured"), name
    assert any("not measured by this run" in n for n in fit.notes)


def test_without_a_saved_config_the_workload_comes_from_the_trace(tmp_path):
    sc = _generating()
    fit = calibrate_run(_record(sc, tmp_path, config=False))
    assert fit.scenario.required_samples == sc.required_samples
    assert fit.scenario.trigger_parameter_sync_step == sc.trigger_parameter_sync_step
    assert fit.parameter("async_training.staleness_threshold").source.startswith("default, not measured")
    assert fit.scenario.runs[0].policy == "rate_matched"  # the simulator's trace metadata


def test_the_fitted_yaml_is_a_scenario_file(tmp_path):
    fit = calibrate_run(_record(_generating(), tmp_path), defaults=_generating())
    path = fit.write_yaml(tmp_path / "fitted.yaml")
    again = Scenario.from_yaml(path)
    assert again.to_dict() == fit.scenario.to_dict()
    assert simulate(again).runs[0].time_s > 0


def test_the_recorded_real_run_fits_to_sane_values_and_reads_its_config_back():
    fit = calibrate_run(REAL_RUN)
    sc = fit.scenario
    saved = yaml.safe_load((REAL_RUN / "config.yaml").read_text())["trainer"]["callbacks"][0]["init_args"]
    at, rollout = saved["async_training"], saved["rollout"]
    for key in ("mini_batch_size", "trigger_parameter_sync_step", "staleness_threshold"):
        assert getattr(sc.async_training, key) == at[key], key
    run = sc.runs[0]
    assert (
        run.policy == at["dynamic_schedule_policy"]
        and run.config.dynamic_schedule_deactivate_ratio == at["dynamic_schedule_deactivate_ratio"]
    )
    assert run.enable_rebalance == at["dynamic_schedule_enable_rebalance"]
    assert sc.concurrent_samples_per_replica == rollout["concurrent_samples_per_replica"]
    assert sc.group_size == rollout["n"] and sc.lengths.max_tokens == rollout["response_length"]
    assert (run.train_devices, run.rollout_devices, run.hybrid) == (1, 1, True)
    assert sc.steps == 2  # 8 optimizer steps, a weight sync every 4
    assert sc.replica.tokens_per_s > 0 and sc.hybrid_model.tokens_per_s > 0
    assert sc.hybrid_model.tokens_per_s < sc.replica.tokens_per_s  # rho 0.57 in docs/simulator.md
    assert 0 < sc.trainer.device_s_per_token < 1e-3
    assert 5 < sc.lengths.mean_tokens <= rollout["response_length"]
    for name in ("standalone_sync_s", "hybrid_sync_s", "wake_s", "sleep_s"):
        assert 0 < getattr(sc.switch, name) < 1.0, name
        assert fit.parameter(f"switch.{name}").measured
    assert fit.parameter("info.standalone_tokens_per_s_per_replica").value == pytest.approx(
        4508, rel=0.01
    )  # lhr report's


def test_errors_name_what_is_missing(tmp_path):
    with pytest.raises(CalibrationError, match="not a folder"):
        calibrate_run(tmp_path / "nope")
    with pytest.raises(CalibrationError, match=r"no trace\.json"):
        calibrate_run(tmp_path)
    shutil.copy(REAL_RUN / "trace.json", tmp_path / "trace.json")
    with pytest.raises(CalibrationError, match=r"no metrics\.csv"):
        calibrate_run(tmp_path, require_metrics=True)


def test_cli_prints_the_fit_writes_the_yaml_and_simulates(tmp_path, capsys):
    out = tmp_path / "fitted.yaml"
    assert simulate_main(["--from-run", str(REAL_RUN), "--write-scenario", str(out), "--json"]) == 0
    printed = capsys.readouterr()
    assert '"scenario": "fitted_' in printed.out and "replica.tokens_per_s" in printed.err
    assert Scenario.from_yaml(out).runs[0].name == "default_r1"
    assert simulate_main(["--from-run", str(REAL_RUN), "--fit-only"]) == 0
    assert "replica.tokens_per_s" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        simulate_main(["--from-run", str(tmp_path)])
    assert "no trace.json" in capsys.readouterr().err


# ------------------------------------------------------------------- a recorded pair of real runs (issue #15)

#: ``benchmarks/planner_fidelity.py``'s static and rate_matched runs (64 steps, the runtime's new counters).
PAIR = Path(__file__).resolve().parents[1] / "data" / "planner_fidelity_pair"
STATIC_RUN = {
    "name": "static",
    "train_devices": 1,
    "rollout_devices": 1,
    "hybrid": True,
    "async_training": {"dynamic_schedule_policy": "static_fully_async"},
}
DYNAMIC_RUN = {**STATIC_RUN, "name": "dynamic", "async_training": {"dynamic_schedule_policy": "rate_matched"}}


def test_the_runtimes_counters_give_the_prompt_the_spread_the_overhead_and_the_concurrency():
    fit = calibrate_run(PAIR / "static_fully_async_r1")
    for name in ("lengths.prompt_tokens", "lengths.sigma", "trainer.step_overhead_s", "concurrent_samples_per_replica"):
        assert fit.parameter(name).measured, name
    sc = fit.scenario
    assert fit.parameter("concurrent_samples_per_replica").source.startswith("trace: the replica tracks")
    assert 10 <= sc.lengths.prompt_tokens <= 32  # the copy task's prompts, rollout.prompt_length 32 at most
    assert 0 < sc.lengths.sigma < 0.3  # copies of 16-character strings: nearly one length
    assert sc.lengths.min_tokens == 1 and sc.lengths.max_tokens == 24
    assert 0 < sc.trainer.step_overhead_s < 0.1  # Lightning's loop between the traced phases


@pytest.mark.parametrize("run", ["static_fully_async_r1", "rate_matched_r1"])
def test_a_real_runs_fit_simulates_that_run_within_3_percent(run):
    fit = calibrate_run(PAIR / run)
    wall = read_run(PAIR / run).wall_s  # the trainer's traced wall (the simulator's time_s is the same reading)
    assert simulate(fit.scenario).runs[0].time_s == pytest.approx(wall, rel=0.03)


def test_scenario_for_converts_the_standalone_rate_and_assumes_the_hybrid_one():
    static = calibrate_run(PAIR / "static_fully_async_r1", host="shared_2vcpu")
    v = static.scenario.replica.tokens_per_s
    assert not static.hybrid_served and static.hybrid_speed_ratio == HYBRID_SPEED_RATIO
    assumed = static.parameter("hybrid_replica.tokens_per_s")
    assert not assumed.measured and "hybrid_speed_ratio" in assumed.source
    assert static.scenario.hybrid_model.tokens_per_s == pytest.approx(HYBRID_SPEED_RATIO * v)
    # static fit -> a run whose hybrid replica serves: the standalone rate x f (the machine's figure by default),
    # the hybrid one follows it
    sc = static.scenario_for(DYNAMIC_RUN)
    assert [r.name for r in sc.runs] == ["dynamic"] and sc.runs[0].policy == "rate_matched"
    assert sc.replica.tokens_per_s == pytest.approx(STANDALONE_SPEED_WITH_HYBRID * v)
    assert sc.hybrid_model.tokens_per_s == pytest.approx(HYBRID_SPEED_RATIO * STANDALONE_SPEED_WITH_HYBRID * v)
    slower = static.scenario_for(DYNAMIC_RUN, standalone_speed_with_hybrid=0.8, hybrid_speed_ratio=0.5)
    assert (slower.replica.tokens_per_s, slower.hybrid_model.tokens_per_s) == pytest.approx((0.8 * v, 0.4 * v))
    same = static.scenario_for(STATIC_RUN, standalone_speed_with_hybrid=0.8)  # no hybrid serving: its rate as fitted
    assert same.replica.tokens_per_s == pytest.approx(v)
    assert same.replica.speed_while_training == 0.8  # a given machine figure: slowed by it while the trainer trains
    assert static.scenario_for(STATIC_RUN).replica == static.scenario.replica  # by default: as fitted
    with pytest.raises(CalibrationError, match="must be > 0"):
        static.scenario_for(DYNAMIC_RUN, standalone_speed_with_hybrid=0.0)
    # dynamic fit -> the static run: the standalone rate / f beside an idle trainer core, back to the fitted rate
    # (f of it) while the static run's trainer trains; the measured hybrid rate kept
    dynamic = calibrate_run(PAIR / "rate_matched_r1", host=SHARED_2VCPU)
    assert dynamic.hybrid_served and dynamic.hybrid_speed_ratio is None
    assert dynamic.standalone_speed_with_hybrid() == STANDALONE_SPEED_WITH_HYBRID  # not measurable from a serving run
    assert dynamic.parameter("hybrid_replica.tokens_per_s").measured
    back = dynamic.scenario_for(STATIC_RUN, standalone_speed_with_hybrid=0.8)
    assert back.replica.tokens_per_s == pytest.approx(dynamic.scenario.replica.tokens_per_s / 0.8)
    assert back.replica.speed_while_training == 0.8
    assert dynamic.scenario_for(STATIC_RUN).replica.speed_while_training == STANDALONE_SPEED_WITH_HYBRID
    assert back.hybrid_model.tokens_per_s == dynamic.scenario.hybrid_model.tokens_per_s
    assert dynamic.scenario_for(DYNAMIC_RUN, standalone_speed_with_hybrid=0.8).replica.tokens_per_s == pytest.approx(
        dynamic.scenario.replica.tokens_per_s
    )


def test_switch_costs_a_run_never_paid_are_the_defaults_scaled_by_its_standalone_sync():
    fit = calibrate_run(PAIR / "static_fully_async_r1")
    s, base = fit.scenario.switch, SwitchCosts()
    assert fit.parameter("switch.standalone_sync_s").measured
    scale = s.standalone_sync_s / base.standalone_sync_s
    for name in ("hybrid_sync_s", "wake_s", "sleep_s", "add_s", "abort_s"):
        assert getattr(s, name) == pytest.approx(getattr(base, name) * scale), name
        assert not fit.parameter(f"switch.{name}").measured and "scaled" in fit.parameter(f"switch.{name}").source
    assert s.resume_prefill_ratio == base.resume_prefill_ratio


def test_the_length_model_is_fitted_through_its_clip():
    mean, sigma = _fit_lognormal(16.0, 1.5, 1.0, 24.0)
    assert _clipped_moments(mean, sigma, 1.0, 24.0) == pytest.approx((16.0, 1.5), rel=1e-3)
    unclipped, kept = _fit_lognormal(16.0, None, 1.0, 24.0, sigma=0.6)  # no spread measured: sigma kept
    assert kept == 0.6 and unclipped > 16.0  # the clip at 24 cuts the long tail: a larger mean before it
    assert _clipped_moments(unclipped, 0.6, 1.0, 24.0)[0] == pytest.approx(16.0, rel=1e-3)


def _probed_trace(path: Path, idle_outside: bool) -> Any:
    """A standalone replica (cap 4) read at three training spans' boundaries: 80 tokens/s inside them, 100 outside;
    with ``idle_outside`` it also sits empty (nothing in flight, nothing decoded) through one stretch outside."""
    from lightning_hybrid_rollout.trace import TraceWriter, load_trace

    with TraceWriter(path) as tw:
        tw.describe_track("replica/standalone_0", kind="standalone", devices=[1], concurrency=4)
        tw.span("replica/standalone_0", "active", 0.0, 20.0)
        t, tokens = 0.0, 0.0
        for step in range(3):
            start, end = 1.0 + 6.0 * step, 3.0 + 6.0 * step
            tokens += 100.0 * (start - t)
            idle = idle_outside and step == 1
            tw.counter("generated_tokens.standalone_0", start, tokens)
            tw.counter("in_flight.standalone_0", start, 4)
            tw.span("trainer/trainer", "training", start, end)
            tokens += 80.0 * (end - start)
            tw.counter("generated_tokens.standalone_0", end, tokens)
            tw.counter("in_flight.standalone_0", end, 0 if idle else 4)
            if idle:  # empty until the next span, where it is full again
                tw.counter("generated_tokens.standalone_0", end + 3.0, tokens)
                tw.counter("in_flight.standalone_0", end + 3.0, 0)
            t = end + (3.0 if idle else 0.0)
    return load_trace(path)


@pytest.mark.parametrize("idle_outside", [False, True])
def test_speed_while_training_counts_only_stretches_where_the_replica_was_full(tmp_path, idle_outside):
    from lightning_hybrid_rollout.sim.calibration import FitLog
    from lightning_hybrid_rollout.sim.rate_fit import _average_over_outside, _fit_speed_while_training, _Role
    from lightning_hybrid_rollout.sim.scenario import ReplicaModel

    trace = _probed_trace(tmp_path / "trace.json", idle_outside)
    role = _Role("standalone", "replica", [trace.tracks["replica/standalone_0"]], ReplicaModel(devices=1))
    fit = FitLog()
    ratio = _fit_speed_while_training(trace, role, (0.0, 20.0), role.template, 0.0, fit)
    # a replica short of work outside the training spans is not a faster one inside them
    assert ratio == pytest.approx(0.8)
    # the average over the rate outside the spans: 6 s of its 20 active seconds inside them, at 0.8
    assert _average_over_outside(trace, role, (0.0, 20.0), ratio, fit) == pytest.approx(1 - 0.3 + 0.8 * 0.3)
    p = next(p for p in fit.params if p.name == "replica.speed_while_training")
    assert p.observations == (2 if idle_outside else 3)


PROBED = Path(__file__).resolve().parents[1] / "data" / "cpu_miniature_static_probed"


def test_a_real_run_measures_its_standalone_replica_slower_while_the_trainer_trains():
    """A real static CPU-miniature run (64 steps, 2026-12-03) with the runtime's decode progress counters: its one
    standalone replica, on the core beside the trainer's, decodes ~8% slower while the trainer trains."""
    fit = calibrate_run(PROBED, host="shared_2vcpu")
    p = fit.parameter("replica.speed_while_training")
    assert p.measured and p.observations >= 48, p.source  # nearly every one of the 64 training spans
    assert 0.8 < p.value < 0.97
    assert p.spread is not None and p.spread < 0.3
    # the rate outside the training spans: above the running totals' average, which mixes both
    rate = fit.parameter("replica.tokens_per_s")
    assert "outside the training spans" in rate.source
    assert fit.scenario.replica.speed_while_training == p.value
    # the assumed hybrid rate is hybrid_speed_ratio x the standalone replica's average rate (what rho is relative to)
    mix = fit.parameter("info.standalone_average_over_outside_training").value
    assert 0.95 < mix < 1.0 and mix == fit.standalone_average_over_outside
    hybrid = fit.scenario.hybrid_model.tokens_per_s
    assert hybrid == pytest.approx(HYBRID_SPEED_RATIO * fit.scenario.replica.tokens_per_s * mix)
    # swapped for a dynamic run (the trainer's core busy nearly throughout, training or lent to the hybrid replica):
    # the standalone rate x the machine's figure throughout, not the run's own speed_while_training (which does not
    # carry over to another run), not slowed again while training; the assumed hybrid rate follows that rate
    assert fit.standalone_speed_with_hybrid() == STANDALONE_SPEED_WITH_HYBRID != p.value
    swapped = fit.scenario_for(DYNAMIC_RUN)
    v = fit.scenario.replica.tokens_per_s
    assert swapped.replica.tokens_per_s == pytest.approx(STANDALONE_SPEED_WITH_HYBRID * v, rel=1e-9)
    assert swapped.replica.speed_while_training == 1.0
    assert swapped.hybrid_model.tokens_per_s == pytest.approx(
        HYBRID_SPEED_RATIO * swapped.replica.tokens_per_s, rel=1e-9
    )
    # a given factor the same way (1.0: a machine whose rollout devices share nothing with the trainer's)
    given = fit.scenario_for(DYNAMIC_RUN, standalone_speed_with_hybrid=1.0)
    assert given.replica.tokens_per_s == pytest.approx(v, rel=1e-9)
    assert given.replica.speed_while_training == 1.0
    assert given.hybrid_model.tokens_per_s == pytest.approx(HYBRID_SPEED_RATIO * v, rel=1e-9)
    # the static run itself: as fitted
    same = fit.scenario_for(STATIC_RUN)
    assert (same.replica.tokens_per_s, same.replica.speed_while_training) == (
        fit.scenario.replica.tokens_per_s,
        p.value,
    )


def test_without_a_host_preset_the_swap_assumes_no_slowdown():
    """The library's figures are 1.0 each (replicas on devices of their own): a static fit's serving run keeps the
    standalone rate and its hybrid replica decodes as fast; ``shared_2vcpu`` (the CPU miniature's host) is named."""
    static = calibrate_run(PAIR / "static_fully_async_r1")
    v, mix = static.scenario.replica.tokens_per_s, static.standalone_average_over_outside
    assert static.host is None and static.hybrid_speed_ratio == 1.0 and static.standalone_speed_with_hybrid() == 1.0
    assert static.scenario.hybrid_model.tokens_per_s == pytest.approx(v * mix)
    sc = static.scenario_for(DYNAMIC_RUN)
    assert (sc.replica.tokens_per_s, sc.replica.speed_while_training) == (pytest.approx(v), 1.0)
    assert sc.hybrid_model.tokens_per_s == pytest.approx(v)
    assert static.scenario_for(STATIC_RUN).replica == static.scenario.replica  # as fitted, not given a figure
    named = calibrate_run(PAIR / "static_fully_async_r1", host="shared_2vcpu")
    assert (
        named.host is SHARED_2VCPU and named.standalone_speed_with_hybrid() == 0.91 and named.hybrid_speed_ratio == 0.71
    )
    assert named.scenario_for(DYNAMIC_RUN).replica.tokens_per_s == pytest.approx(0.91 * v)
    assert (
        calibrate_run(PAIR / "static_fully_async_r1", host=SHARED_2VCPU, hybrid_speed_ratio=0.5).hybrid_speed_ratio
        == 0.5
    )
    with pytest.raises(CalibrationError, match="unknown host preset 'gpu'; known: shared_2vcpu"):
        calibrate_run(PAIR / "static_fully_async_r1", host="gpu")


def test_lhr_simulate_fits_with_the_host_preset_named(capsys):
    argv = ["--from-run", str(PAIR / "static_fully_async_r1"), "--fit-only"]
    assert simulate_main([*argv, "--host-preset", "shared_2vcpu"]) == 0
    assert "hybrid_speed_ratio 0.71 x" in capsys.readouterr().out
    assert simulate_main(argv) == 0
    assert "hybrid_speed_ratio 1 x" in capsys.readouterr().out
