"""RunTracer: the run's trace, read back through the trace format's own reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_hybrid_rollout.run.tracer import RunTracer, trace_track
from lightning_hybrid_rollout.trace import load_trace


def test_replica_states_phases_totals_and_cycles_land_in_the_trace(tmp_path: Path) -> None:
    tracer = RunTracer(tmp_path / "trace.json", "run-a")
    t0 = tracer.t0
    tracer.describe_tracks(4, [[1]], [[0]], {"standalone-0": 512})
    tracer.set_state(["standalone-0"], "generating", t0 + 1.0)
    tracer.set_state(["standalone-0"], "generating", t0 + 1.5)  # the same state: the span goes on
    tracer.set_state(["standalone-0"], "syncing", t0 + 2.0)
    tracer.phase("training", t0 + 0.5, t0 + 2.5)
    tracer.phase("waiting", t0 + 3.0, t0 + 3.0)  # empty: not written
    tracer.add_totals(trained_samples=8)
    tracer.add_totals(trained_samples=8, trained_tokens=40)
    tracer.cycle(1, t0 + 3.0, {"dynamic_resource/mq_size": 2.0}, queue_size=2, in_flight=None)
    tracer.close(t0 + 4.0)
    tracer.tool_call("late", t0, t0 + 1.0, {})  # after the close: dropped, no error
    data = load_trace(tmp_path / "trace.json")
    assert data.metadata["run"] == "run-a" and data.tracks[trace_track("standalone-0")]["kv_cache_tokens"] == 512
    states = [(s.name, s.start_s, s.end_s) for s in data.spans_of("replica/standalone_0")]
    assert states[0] == ("generating", pytest.approx(1.0), pytest.approx(2.0)) and states[1][0] == "syncing"
    assert [s.name for s in data.spans_of("trainer/trainer")] == ["training"]
    assert [c.value for c in data.counter_series("trained_samples")] == [16.0]
    assert data.counter_series("in_flight") == [] and [c.value for c in data.counter_series("queue_depth")] == [2]
    assert data.step_series("dynamic_resource/mq_size") == ([1], [2.0])


def test_a_run_without_a_trace_writes_nothing_and_every_call_is_a_no_op(tmp_path: Path) -> None:
    tracer = RunTracer(None)
    tracer.set_state(["hybrid-0"], "sleeping")
    tracer.phase("training", 0.0, 1.0)
    tracer.cycle(1, 1.0, {}, queue_size=0, in_flight=0)
    tracer.tool_call("add", 0.0, 1.0, {})
    tracer.close()
    assert not tracer.enabled and list(tmp_path.iterdir()) == []
