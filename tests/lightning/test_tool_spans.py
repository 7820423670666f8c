"""The runtime's trace gets the episodes' tool and environment calls: each on a ``tools/lane_<k>`` track, at its
time since the run's origin, and a call ending after the trace closed is dropped, not an error."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.run.runtime import RolloutRuntime
from lightning_hybrid_rollout.trace import TOOLS_GROUP, load_trace


def test_tool_calls_land_on_the_tools_lanes_of_the_run_trace(tmp_path: Path) -> None:
    rt = RolloutRuntime(RolloutConfig(), AsyncTrainingConfig(), None, tmp_path)
    try:
        now = time.monotonic()
        rt.trace_tool_call("add", now, now + 2.0, {"kind": "tool", "episode": "u0", "turn": 1, "status": "ok"})
        rt.trace_tool_call("env.step", now + 1.0, now + 1.5, {"kind": "environment", "turn": 1, "status": "timeout"})
        rt.tracer.close()
        rt.trace_tool_call("late", now, now + 1.0, {"status": "ok"})  # after stop(): dropped
    finally:
        rt.loop.close()
    spans = load_trace(tmp_path / "trace.json").group_spans(TOOLS_GROUP)
    assert [(s.name, s.track) for s in spans] == [("add", "tools/lane_0"), ("env.step", "tools/lane_1")]
    assert spans[0].end_s - spans[0].start_s == pytest.approx(2.0) and spans[1].args["status"] == "timeout"
