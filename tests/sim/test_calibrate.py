"""``lhr simulate --from-run``: a scenario fitted to a run's trace (``sim/calibrate.py``).

The round trip: a known scenario is simulated with its trace, the trace is fitted, and every number the trace
measures comes back within 5% (the config's settings exactly). The recorded CPU-miniature run in ``tests/data`` fits
to sane values, and its saved config reads back exactly.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_hybrid_rollout.sim import simulate
from lightning_hybrid_rollout.sim.calibrate import CalibrationError, calibrate_run
from lightning_hybrid_rollout.sim.cli import simulate_main
from lightning_hybrid_rollout.sim.scenario import Scenario

REAL_RUN = Path(__file__).resolve().parents[1] / "data" / "cpu_miniature_default_8_steps"


def _generating() -> Scenario:
    """Long enough responses that the simulator's 2-s coalesced in_flight counter follows the replicas' load."""
    return Scenario.from_dict(
        {
            "name": "generating",
            "steps": 12,
            "async_training": {"mini_batch_size": 32, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.5},
            "concurrent_samples_per_replica": 4,
            "lengths": {"mean_tokens": 3000, "sigma": 0.1, "max_tokens": 50000, "drift_per_step": 0.05},
            "replica": {"devices": 1, "tokens_per_s": 40.0, "batch_slowdown": 0.05},
            "hybrid_replica": {"devices": 1, "tokens_per_s": 25.0, "batch_slowdown": 0.05},
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
