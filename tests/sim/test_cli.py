"""`lhr simulate` / `lhr report` entry points: JSON schema, table, plots, and report on a trace directory."""

from __future__ import annotations

import json

import pytest
import yaml

from lightning_hybrid_rollout.sim import Scenario, get_preset
from lightning_hybrid_rollout.sim.cli import report_main, simulate_main

from .conftest import tiny_scenario

_RUN_KEYS = {
    "name",
    "policy",
    "train_devices",
    "rollout_devices",
    "hybrid",
    "time_s",
    "efficiency",
    "resource_utilization",
    "breakdown_s",
    "version_lag_mean",
    "version_lag_max",
}


def test_simulate_json_schema_seed(capsys):
    assert simulate_main(["--preset", "seed", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # exactly one JSON object on stdout
    assert set(doc) == {"scenario", "balance_bound_s", "runs"}
    assert doc["scenario"] == "seed" and isinstance(doc["balance_bound_s"], float)
    names = [r["name"] for r in doc["runs"]]
    assert {"static_16_16", "static_8_24", "dynamic_default"} <= set(names)
    for r in doc["runs"]:
        assert set(r) == _RUN_KEYS
        assert r["policy"] is None if not r["hybrid"] else isinstance(r["policy"], str)
        assert isinstance(r["train_devices"], int) and isinstance(r["rollout_devices"], int)
        assert r["time_s"] >= doc["balance_bound_s"] and 0 < r["efficiency"] <= 1
        assert isinstance(r["breakdown_s"], dict) and all(isinstance(v, float) for v in r["breakdown_s"].values())
        assert sum(r["breakdown_s"].values()) == pytest.approx(r["time_s"], rel=1e-9)


def _scenario_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario().to_dict()))
    return path


def test_simulate_table_and_plot_write_non_empty_pngs(tmp_path, capsys):
    out = tmp_path / "plots"
    assert simulate_main([str(_scenario_file(tmp_path)), "--plot", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dynamic_rate_matched" in text and "efficiency" in text
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"mq_size.png", "utilization.png", "breakdown.png", "timeline_dynamic_default.png"} <= set(pngs)
    for p in out.glob("*.png"):
        assert p.stat().st_size > 1000 and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for t in out.glob("trace_*.json"):
        json.loads(t.read_text())


def test_simulate_markdown_and_gap_tables(tmp_path, capsys):
    assert simulate_main([str(_scenario_file(tmp_path)), "--markdown", "--gap"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "| run | policy | train+rollout | hybrid | time (h) | efficiency | utilization | faster than 1st |" in lines
    assert any(line.startswith("| dynamic_rate_matched_overlap | rate_matched | 2+2 | yes |") for line in lines)
    assert any(line.startswith("| run | training_compute |") for line in lines)
    gap_header = next(line for line in lines if line.startswith("| seconds |"))
    assert "dynamic_default" in gap_header and any(line.startswith("| total |") for line in lines)
    assert any(line.startswith("| standalone_paused_for_sync |") for line in lines)
    assert simulate_main([str(_scenario_file(tmp_path)), "--gap", "--runs", "dynamic_default"]) == 0
    text = capsys.readouterr().out
    assert "beyond each run's one-ratio balance term" in text and "standalone_paused_for_sync" in text


def test_report_renders_a_run_directory(tmp_path, capsys):
    plots = tmp_path / "sim"
    assert (
        simulate_main([str(_scenario_file(tmp_path)), "--runs", "dynamic_default", "--plot", str(plots), "--json"]) == 0
    )
    capsys.readouterr()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (plots / "trace_dynamic_default.json").rename(run_dir / "trace.json")
    assert report_main([str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    written = [line for line in lines if line.endswith(".png")]
    assert {p.split("/")[-1] for p in written} == {"timeline_dynamic_default.png", "mq_size.png", "utilization.png"}
    # before the PNGs: the run's bound and breakdown (a simulated trace carries the runtime's token counters)
    assert lines[0] == "dynamic_default:" and lines[1].startswith("  balance bound ") and "efficiency" in lines[1]
    assert lines[3].startswith("  time: training ") and "waiting with hybrid generating" in lines[3]
    assert all((run_dir / "plots" / p.split("/")[-1]).stat().st_size > 1000 for p in written)


def test_report_reads_metrics_jsonl_when_the_trace_has_no_step_metrics(tmp_path, capsys):
    from lightning_hybrid_rollout.trace import TraceWriter

    with TraceWriter(tmp_path / "trace.json", {"run": "real", "train_devices": 1}) as tw:
        tw.describe_track("replica/standalone_0", kind="standalone", devices=[1])
        tw.span("replica/standalone_0", "active", 0.0, 10.0)
        tw.span("trainer/trainer", "waiting", 0.0, 2.0, {"hybrid": False})
        tw.span("trainer/trainer", "training", 2.0, 9.0)
    rows = [{"step": i, "dynamic_resource/mq_size": i, "dynamic_resource/resource_utilization": 0.5} for i in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert report_main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "mq_size.png").stat().st_size > 1000


def test_cli_errors_are_readable(tmp_path, capsys):
    with pytest.raises(SystemExit):
        simulate_main([])
    assert "exactly one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        simulate_main(["--preset", "nope"])
    assert "unknown preset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report_main([str(tmp_path)])
    assert "no trace.json" in capsys.readouterr().err


def test_list_and_dump_presets(capsys):
    assert simulate_main(["--list-presets"]) == 0
    assert "seed:" in capsys.readouterr().out
    assert simulate_main(["--dump-preset", "seed"]) == 0
    dumped = yaml.safe_load(capsys.readouterr().out)
    assert dumped["name"] == "seed" and dumped["async_training"]["mini_batch_size"] == 128
    assert Scenario.from_dict(dumped).to_dict() == get_preset("seed").to_dict()  # a starting point that loads back


_RUN = {"name": "r", "train_devices": 2, "rollout_devices": 2}


@pytest.mark.parametrize(
    ("old", "rewrite"),
    [
        ({"required_samples": 8}, "write `async_training: {mini_batch_size: 8}` instead"),
        ({"runs": [{**_RUN, "sequencing": "overlap_sync"}]}, "write `async_training: {overlap_sync: true}` instead"),
    ],
)
def test_an_old_flat_scenario_file_is_refused_with_the_new_spelling(tmp_path, capsys, old, rewrite):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"name": "old", "runs": [_RUN], **old}))
    with pytest.raises(SystemExit):
        simulate_main([str(path), "--json"])
    err = capsys.readouterr().err
    assert rewrite in err and "docs/simulator.md" in err
