"""`lhr simulate` entry point: JSON schema, tables, plots and readable errors."""

from __future__ import annotations

import json

import pytest
import yaml

from lightning_hybrid_rollout.sim import Scenario, get_preset
from lightning_hybrid_rollout.sim.cli import simulate_main

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
    assert simulate_main(["--preset", "verl_32_devices", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # exactly one JSON object on stdout
    assert set(doc) == {"scenario", "balance_bound_s", "runs"}
    assert doc["scenario"] == "verl_32_devices" and isinstance(doc["balance_bound_s"], float)
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


def test_cli_errors_are_readable(capsys):
    with pytest.raises(SystemExit):
        simulate_main([])
    assert "exactly one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        simulate_main(["--preset", "nope"])
    assert "unknown preset" in capsys.readouterr().err


def test_list_and_dump_presets(capsys):
    assert simulate_main(["--list-presets"]) == 0
    assert "verl_32_devices:" in capsys.readouterr().out
    assert simulate_main(["--dump-preset", "verl_32_devices"]) == 0
    dumped = yaml.safe_load(capsys.readouterr().out)
    assert dumped["name"] == "verl_32_devices" and dumped["async_training"]["mini_batch_size"] == 128
    # a starting point that loads back
    assert Scenario.from_dict(dumped).to_dict() == get_preset("verl_32_devices").to_dict()
