"""`lhr report RUN_DIR`: a run's bound and breakdown printed, its trace rendered, readable errors."""

from __future__ import annotations

import json

import pytest
import yaml

from lightning_hybrid_rollout.analysis.report import report_main
from lightning_hybrid_rollout.sim.cli import simulate_main
from tests.sim.conftest import tiny_scenario


def _scenario_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario().to_dict()))
    return path


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


def test_report_of_a_folder_without_a_trace_is_one_readable_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report_main([str(tmp_path)])
    assert "no trace.json" in capsys.readouterr().err


def _pixels_of(png, hex_color: str) -> int:
    """How many pixels of ``png`` have exactly the color ``#rrggbb``."""
    import matplotlib.image
    import numpy as np

    rgb = np.round(matplotlib.image.imread(png)[..., :3] * 255).astype(int)
    want = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)])
    return int((rgb == want).all(axis=-1).sum())


def test_report_timeline_shows_the_tool_and_environment_calls_of_a_multi_turn_run(tmp_path, capsys):
    from lightning_hybrid_rollout.trace import TOOLS_GROUP, TraceWriter
    from lightning_hybrid_rollout.trace_plots import COLORS

    with TraceWriter(tmp_path / "trace.json", {"run": "agentic", "train_devices": 1}) as tw:
        tw.describe_track("replica/standalone_0", kind="standalone", devices=[1])
        tw.span("replica/standalone_0", "active", 0.0, 10.0)
        tw.span("trainer/trainer", "waiting", 0.0, 2.0, {"hybrid": False})
        tw.span("trainer/trainer", "training", 2.0, 9.0)
        tw.lane_span(TOOLS_GROUP, "env.reset", 0.0, 0.5, {"kind": "environment", "turn": 0, "status": "ok"})
        tw.lane_span(TOOLS_GROUP, "add", 1.0, 4.0, {"kind": "tool", "turn": 1, "status": "ok"})
        tw.lane_span(TOOLS_GROUP, "bad", 5.0, 5.002, {"kind": "tool", "turn": 2, "status": "error"})  # 2 ms
    assert report_main([str(tmp_path)]) == 0
    capsys.readouterr()
    png = tmp_path / "plots" / "timeline_agentic.png"
    assert _pixels_of(png, COLORS["tool"]) > 100  # the calls' lane
    assert _pixels_of(png, COLORS["tool_error"]) > 20  # the failed 2 ms call: drawn, flagged
