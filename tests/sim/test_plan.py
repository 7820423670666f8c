"""`lhr plan`: the candidates it enumerates, their ranking, the JSON schema, the plot, a known best plan, bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from lightning_hybrid_rollout.errors import HybridRolloutError, PlanError
from lightning_hybrid_rollout.schedule import DynamicSchedulePolicyBase, available_policies
from lightning_hybrid_rollout.schedule import base as registry
from lightning_hybrid_rollout.sim.cli import plan_main
from lightning_hybrid_rollout.sim.plan import (
    OPTION_SETS,
    candidate_runs,
    candidate_scenario,
    plan,
    scale_sync,
    simulate_candidates,
    with_base_scenario,
)
from lightning_hybrid_rollout.sim.scenario import Scenario

from .conftest import tiny_scenario

RUN_DIR = Path(__file__).resolve().parents[1] / "data" / "cpu_miniature_default_8_steps"
PROBED_DIR = RUN_DIR.parent / "cpu_miniature_static_probed"  # a static pilot that measured speed_while_training
FREE_SWITCHES = {k: 0.0 for k in ("standalone_sync_s", "standalone_commit_s", "hybrid_sync_s", "wake_s", "sleep_s")}
FREE_SWITCHES.update(add_s=0.0, resume_s=0.0, remove_s=0.0, abort_s=0.0, rebalance_s=0.0)
COSTLY_SWITCHES = {"standalone_sync_s": 1.0, "hybrid_sync_s": 20.0, "wake_s": 30.0, "sleep_s": 30.0}
_ROW_KEYS = {
    "rank",
    "name",
    "train_devices",
    "rollout_devices",
    "hybrid",
    "policy",
    "options",
    "async_training",
    "time_s",
    "efficiency",
    "speedup_vs_static",
    "breakdown_s",
    "staleness",
    "activations",
    "hybrid_replicas",
    "lent_replicas",
    "error",
}
_STALENESS_KEYS = {
    "max_samples",
    "mean_samples",
    "budget_samples",
    "carried_mean_samples",
    "step_samples",
    "version_lag_mean",
    "version_lag_max",
}


class _NeverDeactivates(DynamicSchedulePolicyBase):
    """Activates at every sync and never gives the devices back: the simulator refuses to train (a failed run)."""

    def should_deactivate(self, global_steps, is_hybrid_active, ctx):
        return False

    def deactivate_wait_samples(self, ctx):
        return 0

    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
        return True


@pytest.fixture
def probe_policy(monkeypatch: pytest.MonkeyPatch) -> str:
    """A policy registered for this test only (the registry entry is removed afterwards)."""
    monkeypatch.setitem(registry._REGISTRY, "plan_probe_never_deactivates", _NeverDeactivates)
    return "plan_probe_never_deactivates"


def _scenario_file(tmp_path: Path, **overrides) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**overrides).to_dict()))
    return path


def test_candidates_are_every_split_static_and_hybrid_with_every_registered_policy_and_option_set(probe_policy):
    runs = candidate_runs(tiny_scenario(), 4)  # replicas of 1 device: every split
    got = {(r.train_devices, r.rollout_devices, r.hybrid, r.policy, _set_of(r.async_training, r.hybrid)) for r in runs}
    policies = available_policies()
    assert probe_policy in policies  # the registry is read, not a list of names
    expected = {(t, 4 - t, False, None, o) for t in (1, 2, 3) for o in OPTION_SETS}
    expected |= {(t, 4 - t, True, p, o) for t in (1, 2, 3, 4) for p in policies for o in OPTION_SETS}
    assert got == expected and len(runs) == len(expected)
    assert len({r.name for r in runs}) == len(runs)
    assert all(r.hybrid for r in runs if r.rollout_devices == 0)  # colocated only with hybrid replicas


def _set_of(changes: dict, hybrid: bool) -> str:
    (name,) = [
        n for n, o in OPTION_SETS.items() if all(changes[k] == v for k, v in (o.hybrid if hybrid else o.static).items())
    ]
    return name


def test_splits_follow_the_replica_sizes():
    sizes = {"replica": {"devices": 2, "tokens_per_s": 40.0}, "hybrid_replica": {"devices": 4, "tokens_per_s": 40.0}}
    sc = tiny_scenario(**sizes, runs=[])  # the plan ignores a scenario's runs
    runs = candidate_runs(sc, 8, policies=["default"], option_sets=["defaults"])
    assert {(r.train_devices, r.rollout_devices) for r in runs if not r.hybrid} == {(6, 2), (4, 4), (2, 6)}
    assert {(r.train_devices, r.rollout_devices) for r in runs if r.hybrid} == {(4, 4), (8, 0)}
    big = tiny_scenario(replica={"devices": 4, "tokens_per_s": 40.0}, runs=[])
    with pytest.raises(PlanError, match="no split of 3 devices fits"):
        candidate_runs(big, 3)


def test_rows_are_ranked_by_predicted_time_with_failed_candidates_last(probe_policy):
    result = plan(
        tiny_scenario(steps=4), 4, policies=["default", "rate_matched", probe_policy], option_sets=["defaults"]
    )
    ok = [r for r in result.rows if r.error is None]
    failed = [r for r in result.rows if r.error is not None]
    assert [r.rank for r in result.rows] == list(range(1, len(result.rows) + 1))
    assert [r.time_s for r in ok] == sorted(r.time_s for r in ok)
    assert failed and all(r.policy == probe_policy for r in failed) and result.rows[-len(failed) :] == failed
    assert "SimulationError" in failed[0].error
    static = result.row(result.best_static)
    assert not static.hybrid and static.time_s == min(r.time_s for r in ok if not r.hybrid)
    assert result.balance_bound_s == min(r.work_bound_s for r in ok)
    for r in ok:
        assert r.efficiency == pytest.approx(result.balance_bound_s / r.time_s)
        assert r.speedup_vs_static == pytest.approx(static.time_s / r.time_s)
        assert sum(r.breakdown_s.values()) == pytest.approx(r.time_s)
        assert 0 < r.staleness.mean_samples <= r.staleness.max_samples <= r.staleness.budget_samples


def test_the_known_best_plan_wins():
    # costly switches: lending the trainer's devices never pays, the balanced static split is the best plan
    costly = plan(tiny_scenario(steps=4, switch=COSTLY_SWITCHES), 4, policies=["default", "rate_matched"])
    assert not costly.best.hybrid and costly.best.split == "2+2" and costly.best.speedup_vs_static == 1.0
    # free switches, cheap training: every device both trains and generates, colocated hybrid replicas win
    free = plan(
        tiny_scenario(steps=4, switch=FREE_SWITCHES, trainer={"device_s_per_token": 0.0005}),
        4,
        policies=["default", "rate_matched"],
    )
    assert free.best.hybrid and free.best.split == "4+0" and free.best.speedup_vs_static > 1.05


def test_plan_json_is_one_object_with_the_documented_schema(tmp_path, capsys):
    argv = ["--scenario", str(_scenario_file(tmp_path, steps=3)), "--devices", "3", "--json", "--policies", "default"]
    assert plan_main(argv) == 0
    doc = json.loads(capsys.readouterr().out)  # stdout holds exactly one JSON object
    assert set(doc) == {"scenario", "devices", "balance_bound_s", "best_static", "candidates", "rows"}
    assert doc["devices"] == 3 and doc["candidates"] == len(doc["rows"]) == 2 * 2 + 3 * 2
    for i, row in enumerate(doc["rows"], 1):
        assert set(row) == _ROW_KEYS and row["rank"] == i and row["error"] is None
        assert set(row["staleness"]) == _STALENESS_KEYS
        assert row["policy"] == ("default" if row["hybrid"] else None) and row["options"] in OPTION_SETS
        assert row["time_s"] >= doc["balance_bound_s"] and 0 < row["efficiency"] <= 1
    assert [r["time_s"] for r in doc["rows"]] == sorted(r["time_s"] for r in doc["rows"])
    assert plan_main([*argv, "--top", "2"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 2


def test_plan_table_and_plot_write_the_best_plans_timeline(tmp_path, capsys):
    out = tmp_path / "plots"
    argv = ["--scenario", str(_scenario_file(tmp_path, steps=3)), "--devices", "2", "--plot", str(out)]
    assert plan_main([*argv, "--policies", "default", "--options", "defaults"]) == 0
    text = capsys.readouterr().out
    best = text.split("; best ", 1)[1].split()[0]
    assert "static_1_1" in text and "dynamic_1_1_default" in text and "efficiency" in text
    for png in (out / f"timeline_{best}.png", out / "timeline_static_1_1.png", out / "breakdown.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000, png
    assert (out / f"trace_{best}.json").is_file()


def test_plan_from_a_recorded_run(capsys):
    assert plan_main(["--from-run", str(RUN_DIR), "--devices", "2", "--json", "--policies", "default"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "fitted to" in captured.err  # the fit's note goes to stderr with --json
    assert {r["name"] for r in doc["rows"]} >= {"static_1_1", "dynamic_1_1_default", "dynamic_2_0_default"}
    assert doc["best_static"] in ("static_1_1", "static_1_1_staged_keep")


def test_a_plan_from_a_static_pilot_slows_the_standalone_replicas_of_its_serving_candidates_by_the_machine_figure():
    """``lhr plan --from-run`` plans from the pilot's Calibration: a serving candidate runs the standalone replicas at
    the host's ``standalone_speed_with_hybrid`` of the pilot's rate in every phase (``Calibration.scenario_for``,
    what planner_fidelity checks against real runs), not the pilot's own ``speed_while_training`` (one run's figure
    does not carry over to the next) and not only while the trainer trains; a candidate like the pilot runs as
    fitted."""
    from lightning_hybrid_rollout.sim.calibrate import calibrate_run
    from lightning_hybrid_rollout.sim.calibration import SHARED_2VCPU
    from lightning_hybrid_rollout.sim.runner import run_once

    f_host = SHARED_2VCPU.standalone_speed_with_hybrid  # the pilot's host's figure
    fit = calibrate_run(PROBED_DIR, host=SHARED_2VCPU)
    own = fit.scenario.replica.speed_while_training
    assert own < 0.95 and own != pytest.approx(f_host, abs=1e-3)  # the pilot measured its own
    fit = with_base_scenario(fit, Scenario.from_dict({**fit.scenario.to_dict(), "steps": 4}))
    result = plan(fit, 2, policies=["rate_matched"], option_sets=["defaults"])
    dynamic = result.row("dynamic_1_1_rate_matched").spec()
    converted = candidate_scenario(fit, dynamic)
    rate = fit.scenario.replica.tokens_per_s
    assert converted.replica.tokens_per_s == pytest.approx(rate * f_host)
    assert converted.replica.speed_while_training == 1.0  # slowed throughout, not a second time while training
    assert result.row("dynamic_1_1_rate_matched").time_s == pytest.approx(run_once(converted, converted.runs[0]).time_s)
    unconverted = fit.scenario.with_runs([dynamic])
    assert result.row("dynamic_1_1_rate_matched").time_s > run_once(unconverted, unconverted.runs[0]).time_s
    static = result.row("static_1_1").spec()
    assert candidate_scenario(fit, static).replica == fit.scenario.replica  # like the pilot: as fitted
    as_fitted = fit.scenario.with_runs([static])
    assert result.row("static_1_1").time_s == pytest.approx(run_once(as_fitted, as_fitted.runs[0]).time_s)
    # another machine's figure (--standalone-speed-with-hybrid): 1.0, the pilot's rate kept; so without a host preset
    other = dataclasses.replace(fit, standalone_factor=1.0)
    assert candidate_scenario(other, dynamic).replica.tokens_per_s == pytest.approx(rate)
    assert candidate_scenario(dataclasses.replace(fit, host=None), dynamic).replica.tokens_per_s == pytest.approx(rate)


def test_plan_takes_the_machines_figures_for_a_pilot_from_the_command_line(capsys):
    """``--host-preset shared_2vcpu`` (the pilot's host), then ``--standalone-speed-with-hybrid`` and
    ``--hybrid-speed-ratio`` over it, reach the serving candidates of a static pilot's plan: a cluster whose rollout
    devices share nothing with the trainer's (1.0, 1.0) plans them faster, as does no preset (1.0 each, not given).
    The plan says which figures it converted by: the preset's, given, or the defaults."""
    base = ["--from-run", str(PROBED_DIR), "--devices", "2", "--json", "--policies", "rate_matched"]
    base += ["--options", "defaults", "--steps", "4"]
    preset = ["--host-preset", "shared_2vcpu"]
    times = []
    for extra in (
        preset,
        [*preset, "--standalone-speed-with-hybrid", "1.0"],
        [*preset, "--standalone-speed-with-hybrid", "1.0", "--hybrid-speed-ratio", "1.0"],
        [],
    ):
        assert plan_main(base + extra) == 0
        captured = capsys.readouterr()
        rows = {r["name"]: r for r in json.loads(captured.out)["rows"]}
        times.append((rows["dynamic_1_1_rate_matched"]["time_s"], rows["static_1_1"]["time_s"]))
        conversion = next(line for line in captured.err.splitlines() if line.startswith("candidates of the other"))
        f = {0: "0.91 (host preset shared_2vcpu", 3: "1 (default: no slowdown assumed"}.get(len(times) - 1, "1 (given")
        assert f"standalone_speed_with_hybrid {f}" in conversion, conversion
        r = (
            "1 (given)"
            if "--hybrid-speed-ratio" in extra
            else "0.71 (host preset shared_2vcpu)"
            if extra
            else "1 (default)"
        )
        assert f"hybrid_speed_ratio {r}" in conversion and "--host-preset NAME (shared_2vcpu;" in conversion
    assert times[0][0] > times[1][0] > times[2][0]  # each figure at 1.0 speeds the serving candidate up
    # the static candidate: as the pilot measured itself unless F is given, then its replica slowed by F while the
    # trainer trains (1.0: not at all, faster than the pilot's 0.918); rho does not touch it
    assert times[0][1] > times[1][1] == times[2][1]
    assert times[3] == (times[2][0], times[0][1])  # no preset: 1.0 each for the serving candidate, none given


def test_a_host_preset_converts_a_pilot_run_only(capsys):
    with pytest.raises(SystemExit):
        plan_main(["--preset", "verl_32_devices", "--devices", "4", "--host-preset", "shared_2vcpu"])
    assert "--host-preset convert a pilot run: use --from-run" in capsys.readouterr().err


def test_a_pilot_whose_hybrid_replicas_served_says_it_ignores_a_given_hybrid_speed_ratio(capsys):
    argv = ["--from-run", str(RUN_DIR), "--devices", "2", "--json", "--policies", "default", "--options", "defaults"]
    assert plan_main([*argv, "--hybrid-speed-ratio", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "the hybrid rate the pilot measured (--hybrid-speed-ratio ignored: its hybrid replicas served)" in err


def test_parallel_jobs_give_the_same_plan():
    sc = tiny_scenario(steps=3)
    one = plan(sc, 3, policies=["rate_matched"], option_sets=["all"])
    two = plan(sc, 3, policies=["rate_matched"], option_sets=["all"], jobs=2)
    assert [(r.name, r.time_s) for r in one.rows] == [(r.name, r.time_s) for r in two.rows]


def test_sync_bandwidth_sets_the_standalone_sync_as_bytes_over_bandwidth():
    sc = scale_sync(tiny_scenario(), model_gb=70.0, sync_gbps=100.0)
    assert sc.switch.standalone_sync_s == pytest.approx(5.6)
    assert sc.switch.hybrid_sync_s == tiny_scenario().switch.hybrid_sync_s  # device-local: as measured
    with pytest.raises(PlanError, match="--sync-gbps must be a number > 0"):
        scale_sync(sc, 70.0, 0.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "verl_32_devices", "--devices", "1"], "--devices must be an integer >= 2"),
        (["--preset", "nope", "--devices", "4"], "unknown preset 'nope'"),
        (["--from-run", "EMPTY", "--devices", "4"], "no trace.json"),
        (["--preset", "verl_32_devices", "--devices", "3"], "no split of 3 devices fits"),
        (["--preset", "verl_32_devices", "--devices", "8", "--policies", "nope"], "unknown policy ['nope']"),
        (
            ["--preset", "verl_32_devices", "--devices", "8", "--model-gb", "70"],
            "--model-gb and --sync-gbps go together",
        ),
        (["--devices", "8"], "one of the arguments --from-run --scenario --preset is required"),
        (
            ["--preset", "verl_32_devices", "--devices", "4", "--hybrid-speed-ratio", "1"],
            "convert a pilot run: use --from-run",
        ),
        (
            ["--from-run", "EMPTY", "--devices", "4", "--standalone-speed-with-hybrid", "0"],
            "must be a finite number > 0",
        ),
        (
            ["--from-run", "EMPTY", "--devices", "4", "--hybrid-speed-ratio", "inf"],
            "must be a finite number > 0, got inf",
        ),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_status_2(tmp_path, capsys, argv, message):
    argv = [str(tmp_path) if a == "EMPTY" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        plan_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("lhr plan: error: ")
    assert err[0].startswith("usage: lhr plan") and sum("error" in line for line in err) == 1  # usage, one line


def test_plan_errors_subclass_the_package_error():
    with pytest.raises(HybridRolloutError):
        candidate_runs(tiny_scenario(), 1)


def test_lhr_dispatches_plan():
    from lightning_hybrid_rollout.lightning import cli

    assert "plan" in cli._SIM_COMMANDS
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", "--preset", "nope", "--devices", "4"])
    assert exc.value.code == 2


def _ratios(runs, policy: str) -> set:
    return {r.async_training.get("dynamic_schedule_deactivate_ratio") for r in runs if r.policy == policy}


def test_other_policies_start_from_their_own_ratio_the_scenarios_policy_from_the_scenarios():
    at = {"mini_batch_size": 8, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.5}
    own_default = tiny_scenario(async_training={**at, "dynamic_schedule_deactivate_ratio": 0.2})
    runs = candidate_runs(own_default, 2, policies=["default", "hysteresis_ratio"])
    assert _ratios(runs, "default") == {None}  # no change: the scenario's own 0.2
    assert _ratios(runs, "hysteresis_ratio") == {0.4}  # the policy's own start, verl's
    # the simulator runs it from there: the ratio after the first cycle is 0.4 moved by at most one step
    (spec,) = [r for r in runs if r.policy == "hysteresis_ratio" and r.train_devices == 1][:1]
    (result,) = simulate_candidates(own_default, [spec])
    assert result.steps[0]["sim/deactivate_ratio"] == pytest.approx(0.4, abs=0.05)

    own_hysteresis = tiny_scenario(
        async_training={**at, "dynamic_schedule_policy": "hysteresis_ratio", "dynamic_schedule_deactivate_ratio": 0.25}
    )
    runs = candidate_runs(own_hysteresis, 2, policies=["default", "hysteresis_ratio"])
    assert _ratios(runs, "hysteresis_ratio") == {None}  # the user's own 0.25 stays
    assert _ratios(runs, "default") == {0.3}  # the other policy from its own start
