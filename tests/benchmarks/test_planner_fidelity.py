"""``benchmarks/planner_fidelity.py`` (issue #15's acceptance) on a recorded pair of real CPU-miniature runs.

``tests/data/planner_fidelity_pair`` holds the static and the ``rate_matched`` run of one ``planner_fidelity.py``
run (64 steps each: ``trace.json``, ``metrics.csv``, the saved ``hybrid_rollout_config.yaml``). The comparison runs
offline on them (``--reuse``): the last line is ``worst relative error: X``, the one before it the speedup's, and
every error comes from both sides, the real trace's wall and the prediction's (a stretched real trace moves the
real side only: the prediction of the dynamic run reads nothing of it but its configuration).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_hybrid_rollout.run_bound import read_run
from lightning_hybrid_rollout.sim.calibrate import CalibrationError

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "tests" / "data" / "planner_fidelity_pair"
STATIC, DYNAMIC = PAIR / "static_fully_async_r1", PAIR / "rate_matched_r1"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("planner_fidelity", ROOT / "benchmarks" / "planner_fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["planner_fidelity"] = module
    spec.loader.exec_module(module)
    return module


def _copy_pair(tmp_path: Path) -> tuple[Path, Path]:
    return shutil.copytree(STATIC, tmp_path / STATIC.name), shutil.copytree(DYNAMIC, tmp_path / DYNAMIC.name)


def _stretch(trace_path: Path, factor: float) -> None:
    """Every time in the trace × ``factor`` (a run ``factor`` times slower, same counts)."""
    doc = json.loads(trace_path.read_text())
    for event in doc["traceEvents"]:
        for key in ("ts", "dur"):
            if key in event:
                event[key] *= factor
        if event.get("ph") == "C" and str(event.get("name", "")).startswith("serving_s."):
            event["args"] = {k: v * factor for k, v in event["args"].items()}
    trace_path.write_text(json.dumps(doc))


def test_the_last_lines_are_the_speedup_error_then_the_worst_relative_error(capsys):
    comparison = _bench().main(["--reuse", str(STATIC), str(DYNAMIC)])
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"worst relative error: \d+\.\d{3}", lines[-1]), lines[-1]
    assert re.fullmatch(r"speedup .*: real \d\.\d{3}, predicted \d\.\d{3} .*speedup error: \d\.\d{3}", lines[-2])
    assert float(lines[-1].rsplit(" ", 1)[1]) == pytest.approx(comparison.worst_relative_error, abs=5e-4)
    assert float(lines[-2].rsplit(" ", 1)[1]) == pytest.approx(comparison.speedup_error, abs=5e-4)
    counted = [(p.run, p.calibrated_from) for p in comparison.predictions if p.counted]
    assert counted == [
        ("static_fully_async", "static_fully_async (itself)"),
        ("rate_matched", "static_fully_async"),
        ("static_fully_async", "rate_matched"),
    ]
    # the worst of the three wall-time errors, each |predicted / real - 1|
    errors = [abs(p.predicted_s / p.real_s - 1) for p in comparison.predictions if p.counted]
    assert comparison.worst_relative_error == pytest.approx(max(errors))
    # the recorded pair's figures (issue #15's targets: 10% and 0.07)
    assert comparison.worst_relative_error < 0.10 and comparison.speedup_error < 0.07


def test_the_errors_are_computed_from_the_real_and_the_predicted_side(tmp_path):
    bench = _bench()
    base = bench.compare(STATIC, DYNAMIC)
    real = {p.run: p.real_s for p in base.predictions}
    assert real["static_fully_async"] == pytest.approx(read_run(STATIC).wall_s)  # the traced wall, as lhr report
    assert real["rate_matched"] == pytest.approx(read_run(DYNAMIC).wall_s)
    assert base.real_speedup == pytest.approx(real["static_fully_async"] / real["rate_matched"])
    static_self, dynamic_pred = (p.predicted_s for p in base.predictions[:2])
    assert base.predicted_speedup == pytest.approx(static_self / dynamic_pred)

    # the real dynamic run 1.25 times slower: its real side moves, its prediction (static calibration) does not
    static_dir, dynamic_dir = _copy_pair(tmp_path)
    _stretch(dynamic_dir / "trace.json", 1.25)
    slow = bench.compare(static_dir, dynamic_dir)
    before, after = base.predictions[1], slow.predictions[1]
    assert after.real_s == pytest.approx(1.25 * before.real_s, rel=1e-6)
    assert after.predicted_s == pytest.approx(before.predicted_s, rel=1e-9)
    assert after.relative_error == pytest.approx(abs(before.predicted_s / (1.25 * before.real_s) - 1), rel=1e-6)
    assert slow.real_speedup == pytest.approx(base.real_speedup / 1.25, rel=1e-6)
    assert slow.predicted_speedup == pytest.approx(base.predicted_speedup, rel=1e-9)
    # calibrated from the slower run, the static run is predicted slower
    assert slow.predictions[2].predicted_s > base.predictions[2].predicted_s


def test_another_workload_is_not_predicted(tmp_path):
    static_dir, dynamic_dir = _copy_pair(tmp_path)
    path = dynamic_dir / "hybrid_rollout_config.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["async_training"]["mini_batch_size"] = 128
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(CalibrationError, match="another workload"):
        _bench().compare(static_dir, dynamic_dir)
