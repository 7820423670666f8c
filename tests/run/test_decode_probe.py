"""Decode-progress probes (``run/decode_probe.py``): each standalone replica's generated tokens, read at the
trainer's ``training`` boundaries into the trace, without ever holding up the trainer's thread.

Fake replicas answer ``health()`` on a real :class:`EventLoopThread`; the samples are read back from a real
``trace.json`` (:class:`TraceWriter` + :func:`load_trace`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.rollout.event_loop import EventLoopThread
from lightning_hybrid_rollout.run.decode_probe import DecodeProgressProbe
from lightning_hybrid_rollout.run.runtime import RolloutRuntime
from lightning_hybrid_rollout.trace import GENERATED_TOKENS, TraceWriter, load_trace
from tests.lightning.test_callback_context import _FakeRuntime, run_cycles
from tests.rollout.fakes import wait_for

HERE_NODE = "node-trainer"
T0 = time.monotonic()


def ts(t: float) -> float:
    return t - T0


class _Replica:
    """A replica's ``health()`` as the runtime's handle returns it: tokens generated (finished and in flight), the
    node it runs on and its ``time.monotonic()`` when it read them; with a ``gate``, it answers once the gate is
    set (or after 3 s)."""

    def __init__(
        self,
        replica_id: str,
        generated: int = 100,
        in_flight: int = 20,
        *,
        node_id: str = HERE_NODE,
        delay_s: float = 0.0,
        error: Exception | None = None,
        counts: bool = True,
        gate: threading.Event | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.generated, self.in_flight = generated, in_flight
        self.node_id = node_id
        self.delay_s = delay_s
        self.error = error
        self.counts = counts
        self.gate = gate
        self.calls = 0
        self.read_at: list[float] = []

    async def health(self) -> dict[str, Any]:
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.gate is not None:
            await asyncio.to_thread(self.gate.wait, 3.0)
        if self.error is not None:
            raise self.error
        if not self.counts:  # an engine that does not count tokens
            return {"replica_id": self.replica_id, "state": "active"}
        now = time.monotonic()
        self.read_at.append(now)
        return {
            "tokens_generated": self.generated,
            "tokens_in_flight": self.in_flight,
            "inflight": 3,  # requests in flight
            "node_id": self.node_id,
            "monotonic": now,
        }


@pytest.fixture
def loop() -> Iterator[EventLoopThread]:
    loop = EventLoopThread("test-probe")
    yield loop
    loop.close()


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[TraceWriter]:
    tw = TraceWriter(tmp_path / "trace.json")
    yield tw
    tw.close()


def make_probe(writer: TraceWriter, loop: EventLoopThread, clock: Any = time.monotonic) -> DecodeProgressProbe:
    return DecodeProgressProbe(
        writer, loop, ts, RolloutRuntime.trace_track, local_node_id=lambda: HERE_NODE, timeout_s=5.0, clock=clock
    )


def samples(writer: TraceWriter, name: str) -> list[Any]:
    writer.close()
    return load_trace(writer.path).counter_series(f"{GENERATED_TOKENS}.{name}")


def test_each_answering_replica_gets_one_sample_of_its_total_and_requests_at_the_time_it_read_them(
    writer: TraceWriter, loop: EventLoopThread
) -> None:
    probe = make_probe(writer, loop)
    here = _Replica("standalone-0", 100, 20)
    assert probe.probe([here]) == 1
    readings = iter([100.0, 104.0])  # the trainer's clock when the call to the other node was sent, and answered
    other = make_probe(writer, loop, clock=lambda: next(readings))
    elsewhere = _Replica("standalone-1", 7, 5, node_id="node-other")
    assert other.probe([elsewhere]) == 1
    wait_for(lambda: probe.outstanding == 0 and other.outstanding == 0)
    assert probe.written == other.written == 1 and probe.failed == other.failed == 0
    writer.close()
    trace = load_trace(writer.path)
    (s0,) = trace.counter_series("generated_tokens.standalone_0")
    (s1,) = trace.counter_series("generated_tokens.standalone_1")
    assert s0.value == 120 and s1.value == 12  # finished + in flight
    # with its requests in flight at the same moment (the fit keeps only stretches where the replica was full)
    (r0,) = trace.counter_series("in_flight.standalone_0")
    assert r0.value == 3 and r0.t == s0.t
    # on the trainer's node: the replica's own reading (the file keeps microseconds)
    assert s0.t == pytest.approx(ts(here.read_at[0]), abs=2e-6)
    # on another node: the middle of the call on the trainer's clock (its own clock is not the trainer's)
    assert s1.t == pytest.approx(ts(102.0), abs=2e-6)


def test_probe_returns_before_the_replica_answers(writer: TraceWriter, loop: EventLoopThread) -> None:
    probe = make_probe(writer, loop)
    gate = threading.Event()
    slow = _Replica("standalone-0", gate=gate)  # answers only once the gate opens, after probe() returned
    try:
        assert probe.probe([slow]) == 1
        assert slow.read_at == [] and probe.outstanding == 1 and probe.written == 0  # returned, still unanswered
    finally:
        gate.set()
    wait_for(lambda: probe.outstanding == 0, timeout=5.0)
    assert [c.value for c in samples(writer, "standalone_0")] == [120]


def test_a_replica_whose_previous_probe_has_not_answered_is_skipped(writer: TraceWriter, loop: EventLoopThread) -> None:
    probe = make_probe(writer, loop)
    gate = threading.Event()
    slow, fast = _Replica("standalone-0", gate=gate), _Replica("standalone-1")  # slow: answers once the gate opens
    try:
        assert probe.probe([slow, fast]) == 2
        wait_for(lambda: fast.calls == 1 and probe.outstanding == 1)
        assert probe.probe([slow, fast]) == 1  # the slow one is still out: only the fast one is asked again
    finally:
        gate.set()
    wait_for(lambda: probe.outstanding == 0)
    assert (slow.calls, fast.calls, probe.skipped) == (1, 2, 1)
    assert probe.probe([slow]) == 1  # answered: asked again
    wait_for(lambda: probe.outstanding == 0)
    assert slow.calls == 2
    writer.close()
    trace = load_trace(writer.path)
    assert len(trace.counter_series("generated_tokens.standalone_0")) == 2
    assert len(trace.counter_series("generated_tokens.standalone_1")) == 2


def test_a_failing_or_non_counting_replica_writes_nothing_and_breaks_nothing(
    writer: TraceWriter, loop: EventLoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    probe = make_probe(writer, loop)
    broken = _Replica("standalone-0", error=RuntimeError("EngineDeadError"))
    silent = _Replica("standalone-1", counts=False)
    no_health = type("NoHealth", (), {"replica_id": "standalone-2"})()
    ok = _Replica("standalone-3", 5, 0)
    with caplog.at_level("DEBUG", logger="lightning_hybrid_rollout.run.decode_probe"):
        assert probe.probe([broken, silent, no_health, ok]) == 4
        wait_for(lambda: probe.outstanding == 0)
    assert probe.written == 1 and probe.failed == 2  # the error and the missing method; the silent one is skipped
    assert "EngineDeadError" in caplog.text
    writer.close()
    trace = load_trace(writer.path)
    assert {c.name for c in trace.counters} == {"generated_tokens.standalone_3", "in_flight.standalone_3"}


def test_close_drops_the_calls_still_out_and_nothing_is_written_after_it(
    writer: TraceWriter, loop: EventLoopThread
) -> None:
    probe = make_probe(writer, loop)
    gate = threading.Event()
    slow = _Replica("standalone-0", gate=gate)  # answers only once the gate opens: after the close
    assert probe.probe([slow]) == 1
    probe.close()
    writer.close()  # what the runtime's stop does next
    gate.set()
    time.sleep(0.5)  # the call would have answered by now
    assert probe.outstanding == 0 and probe.written == 0 and probe.failed == 0
    assert probe.probe([slow]) == 0
    assert not load_trace(writer.path).counters
    assert loop.run(asyncio.sleep(0, result=True))  # the loop is fine


def test_the_runtime_probes_its_standalone_replicas_into_its_trace_and_stops_cleanly(tmp_path: Path) -> None:
    rt = RolloutRuntime(RolloutConfig(), AsyncTrainingConfig(), workload=None, run_dir=tmp_path, trace=True)
    rt.standalone = [_Replica("standalone-0", 40, 2)]
    rt.hybrid = [_Replica("hybrid-0", 9, 9)]
    try:
        rt.probe_decode_progress()
        probe = rt._decode_probe
        assert probe is not None
        wait_for(lambda: probe.outstanding == 0)
        rt.standalone[0].delay_s = 5.0
        rt.probe_decode_progress()  # still out when the runtime stops
    finally:
        rt.stop()
    trace = load_trace(tmp_path / "trace.json")
    assert sorted((c.name, c.value) for c in trace.counters) == [
        ("generated_tokens.standalone_0", 42.0),
        ("in_flight.standalone_0", 3.0),
    ]
    untraced = RolloutRuntime(RolloutConfig(), AsyncTrainingConfig(), workload=None, run_dir=tmp_path, trace=False)
    untraced.standalone = [_Replica("standalone-0")]
    untraced.probe_decode_progress()
    untraced.stop()
    assert untraced.standalone[0].calls == 0


def test_the_callback_probes_at_both_boundaries_of_every_training_span(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(_FakeRuntime, "probe_decode_progress", lambda self: events.append("probe"))
    monkeypatch.setattr(_FakeRuntime, "trace_phase", lambda self, phase, *a, **k: events.append(phase))
    run = run_cycles("static_fully_async", cycles=2)
    steps = len(run["batches"])
    assert steps == 4
    # after the batch is taken (training starts) and right before the training span is written (it ends)
    assert [e for e in events if e in ("probe", "training")] == ["probe", "probe", "training"] * steps
    assert all(events[i - 1] == "probe" for i, e in enumerate(events) if e == "training")
