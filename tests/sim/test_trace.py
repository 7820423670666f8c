"""The shared Chrome trace-event writer: valid JSON, round trip, crash repair, merge, simulator traces."""

from __future__ import annotations

import itertools
import json

import pytest

from lightning_hybrid_rollout.sim.runner import run_once
from lightning_hybrid_rollout.trace import TRAINER_TRACK, TraceWriter, load_trace, merge_traces

from .conftest import tiny_scenario


def test_writer_produces_valid_trace_event_json(tmp_path):
    path = tmp_path / "t.json"
    with TraceWriter(path, {"run": "demo", "nan": float("nan")}) as tw:
        tw.describe_track("replica/hybrid_0", kind="hybrid", devices=[0, 1])
        tw.span("replica/hybrid_0", "active", 0.0, 1.5, {"note": "x"})
        tw.span(TRAINER_TRACK, "training", 1.5, 3.0)
        tw.counter("queue_depth", 0.5, 7)
        tw.step_metrics(1, 3.0, {"dynamic_resource/mq_size": 7.0})
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["run"] == "demo"
    assert doc["otherData"]["nan"] is None
    for ev in doc["traceEvents"]:
        assert ev["ph"] in {"M", "X", "C", "i"} and "pid" in ev
        if ev["ph"] == "X":
            assert ev["dur"] >= 0 and "ts" in ev and "tid" in ev
    trace = load_trace(path)
    assert trace.tracks["replica/hybrid_0"]["devices"] == [0, 1]
    assert [s.name for s in trace.spans_of(TRAINER_TRACK)] == ["training"]
    assert trace.spans_of("replica/hybrid_0")[0].end_s == pytest.approx(1.5)
    assert trace.counter_series("queue_depth")[0].value == 7
    assert trace.step_series("dynamic_resource/mq_size") == ([1], [7.0])


def test_writer_rejects_bad_input(tmp_path):
    with TraceWriter(tmp_path / "t.json") as tw:
        with pytest.raises(ValueError, match="ends before it starts"):
            tw.span("a/b", "x", 2.0, 1.0)
        with pytest.raises(ValueError, match="finite"):
            tw.counter("c", 0.0, float("inf"))
    with pytest.raises(RuntimeError, match="closed"):
        tw.span("a/b", "x", 0.0, 1.0)


def test_truncated_trace_of_a_crashed_run_is_repaired(tmp_path):
    path = tmp_path / "t.json"
    tw = TraceWriter(path)
    tw.span(TRAINER_TRACK, "waiting", 0.0, 1.0)
    tw.span(TRAINER_TRACK, "training", 1.0, 2.0)
    tw._file.flush()  # the process dies here: no close()
    assert [s.name for s in load_trace(path).spans] == ["waiting", "training"]
    tw.close()


def test_merge_traces_of_two_processes(tmp_path):
    with TraceWriter(tmp_path / "a.json", {"run": "r"}) as a:
        a.span(TRAINER_TRACK, "training", 0.0, 1.0)
    with TraceWriter(tmp_path / "b.json", {"rollouter": True}) as b:
        b.describe_track("replica/standalone_0", kind="standalone", devices=[2])
        b.span("replica/standalone_0", "active", 0.0, 2.0)
        b.counter("queue_depth", 1.0, 3)
    merged = load_trace(merge_traces([tmp_path / "a.json", tmp_path / "b.json"], tmp_path / "m.json"))
    assert merged.metadata == {"run": "r", "rollouter": True}
    assert {s.track for s in merged.spans} == {TRAINER_TRACK, "replica/standalone_0"}
    assert merged.tracks["replica/standalone_0"]["devices"] == [2]


def test_simulator_trace_covers_replicas_trainer_queue_and_steps(tmp_path):
    sc = tiny_scenario()
    result = run_once(sc, "dynamic_rate_matched", tmp_path / "trace.json")
    trace = load_trace(tmp_path / "trace.json")
    assert trace.metadata["source"] == "simulator" and trace.metadata["run"] == "dynamic_rate_matched"
    kinds = {info["kind"] for t, info in trace.tracks.items() if t.startswith("replica/")}
    assert kinds == {"standalone", "hybrid"}
    assert {s.name for s in trace.spans if s.track.startswith("replica/")} <= {
        "active",
        "parked",
        "syncing",
        "switching",
    }
    trainer = trace.spans_of(TRAINER_TRACK)
    assert {"training", "weight_sync"} <= {s.name for s in trainer}
    assert sum(s.end_s - s.start_s for s in trainer if s.name == "training") == pytest.approx(
        result.breakdown_s["training_compute"]
    )
    assert trace.counter_series("queue_depth") and len(trace.steps) == sc.steps
    assert trace.end_s == pytest.approx(result.time_s)


def test_overlapping_calls_get_lanes_of_their_own_and_the_lanes_are_bounded(tmp_path):
    from lightning_hybrid_rollout.trace import TOOL_LANES, TOOLS_GROUP

    path = tmp_path / "t.json"
    # written as the calls end (not in order of start): a long call, two short ones inside it, a later one
    calls = [("a", 1.0, 2.0), ("b", 2.5, 3.0), ("long", 0.0, 10.0), ("c", 4.0, 5.0)]
    with TraceWriter(path) as tw:
        tracks = [tw.lane_span(TOOLS_GROUP, name, a, b, {"status": "ok"}) for name, a, b in calls]
        many = {tw.lane_span("busy", "x", 0.0, 1.0) for _ in range(TOOL_LANES + 5)}
    assert tracks == ["tools/lane_0", "tools/lane_0", "tools/lane_1", "tools/lane_0"]
    assert len(many) == TOOL_LANES  # past the bound, calls share a lane
    trace = load_trace(path)
    assert [s.name for s in trace.group_spans(TOOLS_GROUP)] == ["long", "a", "b", "c"]
    for track in {s.track for s in trace.group_spans(TOOLS_GROUP)}:
        spans = trace.spans_of(track)
        assert all(p.end_s <= n.start_s for p, n in itertools.pairwise(spans))  # no overlap within a lane
