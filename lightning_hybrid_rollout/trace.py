"""One event trace for both worlds: the runtime and the simulator write the same Chrome trace-event JSON (replica and
trainer spans, counters, per-step metrics; the tracks are listed in docs/metrics.md, "The trace file"), which ``lhr
report`` and ``lhr simulate --plot`` render (:mod:`lightning_hybrid_rollout.trace_plots`).

Example::

    from lightning_hybrid_rollout.trace import TraceWriter, load_trace

    with TraceWriter("trace.json", metadata={"run": "demo"}) as tw:
        tw.describe_track("replica/standalone_0", kind="standalone", devices=[0, 1])
        tw.span("replica/standalone_0", "active", 0.0, 2.5)
        tw.span("trainer/trainer", "training", 1.0, 2.0, {"step": 1})
        tw.counter("queue_depth", 1.0, 3)
        tw.step_metrics(1, 2.0, {"dynamic_resource/mq_size": 3.0})
    trace = load_trace("trace.json")
    assert trace.spans_of("trainer/trainer")[0].name == "training"
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DECODED_TOKENS",
    "GENERATED_TOKENS",
    "IN_FLIGHT",
    "QUEUE_DEPTH",
    "REPLICA_STATES",
    "SERVING_S",
    "STEP_METRICS",
    "TOOLS_GROUP",
    "TOOL_LANES",
    "TRAINED_PROMPT_TOKENS",
    "TRAINED_SAMPLES",
    "TRAINED_TOKENS",
    "TRAINED_TOKENS_SQ",
    "TRAINER_PHASES",
    "TRAINER_TRACK",
    "Counter",
    "Span",
    "StepMetrics",
    "TraceData",
    "TraceWriter",
    "load_trace",
    "merge_traces",
]

#: States a replica track's spans are named by.
REPLICA_STATES: tuple[str, ...] = ("active", "parked", "syncing", "switching")
#: Phases the trainer track's spans are named by.
TRAINER_PHASES: tuple[str, ...] = ("waiting", "training", "weight_sync", "switching")
#: The trainer's track.
TRAINER_TRACK = "trainer/trainer"
#: The group of the tool and environment call spans (``tools/lane_<k>``; see :meth:`TraceWriter.lane_span`).
TOOLS_GROUP = "tools"
#: The most lanes of one :meth:`TraceWriter.lane_span` group (past it, spans share the lane that frees first).
TOOL_LANES = 32
#: Counter: samples in the message queue.
QUEUE_DEPTH = "queue_depth"
#: Counter: samples being generated (the rollouter's active tasks).
IN_FLIGHT = "in_flight"
#: Instant event carrying one sync cycle's metrics.
STEP_METRICS = "step_metrics"
#: Counter (running total): samples the trainer took from the queue.
TRAINED_SAMPLES = "trained_samples"
#: Counter (running total): response tokens of those samples.
TRAINED_TOKENS = "trained_tokens"
#: Counter (running total): squared response lengths of those samples, summed (their spread).
TRAINED_TOKENS_SQ = "trained_tokens_sq"
#: Counter (running total): prompt tokens of those samples.
TRAINED_PROMPT_TOKENS = "trained_prompt_tokens"
#: Counter prefix (running total, ``decoded_tokens.<role>``): tokens a replica role decoded (aborted segments included).
DECODED_TOKENS = "decoded_tokens"
#: Counter prefix (running total, ``generated_tokens.<replica>``): tokens one standalone replica generated so far
#: (finished and in flight), sampled at the trainer's ``training`` span boundaries.
GENERATED_TOKENS = "generated_tokens"
#: Counter prefix (running total, ``serving_s.<role>``): seconds a replica role was serving (routable, not syncing).
SERVING_S = "serving_s"

_US = 1e6
_COUNTER_PID = 0  # counters live in their own process, "counters"


def _split_track(track: str) -> tuple[str, str]:
    if not isinstance(track, str) or not track:
        raise ValueError(f"track must be a non-empty string like 'replica/hybrid_0', got {track!r}")
    group, sep, name = track.partition("/")
    return (group, name) if sep and name else (track, track)


def _jsonable(value: Any) -> Any:
    """Plain-JSON version of ``value`` (non-finite floats become None: JSON has no NaN)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalars
        return _jsonable(value.item())
    return str(value)


class TraceWriter:
    """Stream Chrome trace events to ``path``; :meth:`close` (or leaving the ``with`` block) finishes the JSON.

    Args:
        path: The file to write (parent directories are created).
        metadata: Run-level facts stored under ``otherData`` (scenario, run name, device counts, ...).

    Example::

        tw = TraceWriter("t.json")
        tw.span("trainer/trainer", "waiting", 0.0, 1.5, {"hybrid": True})
        tw.close()
    """

    def __init__(self, path: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("w", encoding="utf-8")
        self._first = True
        self._closed = False
        self._pids: dict[str, int] = {}
        self._tids: dict[str, tuple[int, int]] = {}
        self._lane_ends: dict[str, list[float]] = {}  # group -> each lane's latest span end (bounded: TOOL_LANES)
        header = {"otherData": _jsonable(dict(metadata or {})), "displayTimeUnit": "ms"}
        # the object's other keys first, then the (streamed) event array, closed by close()
        self._file.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
        self._write_raw({"name": "process_name", "ph": "M", "pid": _COUNTER_PID, "args": {"name": "counters"}})

    # ------------------------------------------------------------------------------------------------ plumbing

    def _write_raw(self, event: dict[str, Any]) -> None:
        if self._closed:
            raise RuntimeError(f"TraceWriter({self.path}) is closed; no more events can be written")
        line = json.dumps(event, allow_nan=False)
        self._file.write(line if self._first else ",\n" + line)
        self._first = False

    def _ids(self, track: str) -> tuple[int, int]:
        ids = self._tids.get(track)
        if ids is not None:
            return ids
        group, name = _split_track(track)
        pid = self._pids.get(group)
        if pid is None:
            pid = self._pids[group] = len(self._pids) + 1
            self._write_raw({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": group}})
            self._write_raw({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        tid = sum(1 for p, _ in self._tids.values() if p == pid) + 1
        self._tids[track] = (pid, tid)
        self._write_raw(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name, "track": track}}
        )
        self._write_raw({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return pid, tid

    @staticmethod
    def _time(t: float, what: str) -> float:
        t = float(t)
        if not math.isfinite(t):
            raise ValueError(f"{what} must be a finite number of seconds, got {t}")
        return t

    # ---------------------------------------------------------------------------------------------------- API

    def describe_track(self, track: str, **info: Any) -> None:
        """Record facts about a track (e.g. ``kind="hybrid", devices=[0, 1, 2, 3]``) for renderers.

        Stored in the track's ``thread_name`` metadata event under ``args.lhr`` (trace viewers ignore it).

        Args:
            track: ``"group/name"``.
            **info: JSON-able facts.
        """
        with self._lock:
            pid, tid = self._ids(track)
            _, name = _split_track(track)
            self._write_raw(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": pid,
                    "tid": tid,
                    "args": {"name": name, "track": track, "lhr": _jsonable(info)},
                }
            )

    def span(self, track: str, name: str, start_s: float, end_s: float, args: Mapping[str, Any] | None = None) -> None:
        """A complete event ("X") on ``track`` from ``start_s`` to ``end_s`` (seconds since the run's origin).

        Args:
            track: ``"group/name"``, e.g. ``"replica/hybrid_0"`` or :data:`TRAINER_TRACK`.
            name: The state or phase (see :data:`REPLICA_STATES`, :data:`TRAINER_PHASES`).
            start_s: Start, seconds.
            end_s: End, seconds (>= start_s).
            args: Extra JSON-able facts shown in the viewer.
        """
        start = self._time(start_s, "start_s")
        end = self._time(end_s, "end_s")
        if end < start:
            raise ValueError(f"span {name!r} on {track!r} ends before it starts: start_s={start}, end_s={end}")
        with self._lock:
            pid, tid = self._ids(track)
            event: dict[str, Any] = {
                "name": str(name),
                "ph": "X",
                "ts": round(start * _US, 3),
                "dur": round((end - start) * _US, 3),
                "pid": pid,
                "tid": tid,
            }
            if args:
                event["args"] = _jsonable(dict(args))
            self._write_raw(event)

    def lane_span(
        self, group: str, name: str, start_s: float, end_s: float, args: Mapping[str, Any] | None = None
    ) -> str:
        """A span of calls that overlap one another (concurrent tool calls): on the first track ``group/lane_<k>``
        free at ``start_s``, so no two spans of one track overlap (what trace viewers draw right).

        Spans may come in any order of start (each is written when its call ends). At most :data:`TOOL_LANES`
        lanes per group; past that the span shares the lane that freed first.

        Args:
            group: The lanes' group, e.g. :data:`TOOLS_GROUP`.
            name: The call (a tool's name, ``env.reset``, ``env.step``).
            start_s: Start, seconds since the run's origin.
            end_s: End, seconds (>= start_s).
            args: Extra JSON-able facts.

        Returns:
            The track written to.
        """
        start = self._time(start_s, "start_s")
        end = self._time(end_s, "end_s")
        with self._lock:
            ends = self._lane_ends.setdefault(group, [])
            lane = next((k for k, e in enumerate(ends) if e <= start), None)
            if lane is None:
                if len(ends) < TOOL_LANES:
                    ends.append(end)
                    lane = len(ends) - 1
                else:
                    lane = min(range(len(ends)), key=ends.__getitem__)
            ends[lane] = max(ends[lane], end)
        track = f"{group}/lane_{lane}"
        self.span(track, name, start, end, args)
        return track

    def counter(self, name: str, t: float, value: float) -> None:
        """A counter sample ("C"): ``name`` has ``value`` from ``t`` on.

        Args:
            name: Counter name, e.g. :data:`QUEUE_DEPTH`.
            t: Seconds since the run's origin.
            value: The value (finite).
        """
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"counter {name!r} needs a finite value, got {value}")
        ts = round(self._time(t, "t") * _US, 3)
        with self._lock:
            self._write_raw({"name": str(name), "ph": "C", "ts": ts, "pid": _COUNTER_PID, "args": {"value": value}})

    def step_metrics(self, step: int, t: float, metrics: Mapping[str, float]) -> None:
        """One sync cycle's metrics: an instant event :data:`STEP_METRICS` plus one counter per metric.

        Args:
            step: The cycle's step (param version).
            t: Seconds since the run's origin (end of the cycle).
            metrics: Metric name → value (non-finite values are written as null and skipped by counters).
        """
        ts = round(self._time(t, "t") * _US, 3)
        with self._lock:
            pid, tid = self._ids(TRAINER_TRACK)
            args = {"step": int(step), **{str(k): _jsonable(float(v)) for k, v in metrics.items()}}
            self._write_raw({"name": STEP_METRICS, "ph": "i", "s": "t", "ts": ts, "pid": pid, "tid": tid, "args": args})
        for key, value in metrics.items():
            if math.isfinite(float(value)):
                self.counter(key, t, value)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (later events would raise)."""
        return self._closed

    def close(self) -> None:
        """Finish the JSON document and close the file (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._file.write("\n]}\n")
            self._file.close()
            self._closed = True

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Span:
    """A complete event read back: ``name`` on ``track`` over ``[start_s, end_s]``."""

    track: str
    name: str
    start_s: float
    end_s: float
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Counter:
    """A counter sample read back."""

    name: str
    t: float
    value: float


@dataclass(frozen=True)
class StepMetrics:
    """One :data:`STEP_METRICS` event read back."""

    step: int
    t: float
    metrics: dict[str, float]


@dataclass
class TraceData:
    """A trace parsed into what renderers need.

    Args:
        metadata: The ``otherData`` object.
        spans: All complete events, in file order.
        counters: All counter samples, in file order.
        steps: The per-step metrics, sorted by step.
        tracks: Track name → the facts given to :meth:`TraceWriter.describe_track`.
    """

    metadata: dict[str, Any] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)
    steps: list[StepMetrics] = field(default_factory=list)
    tracks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def spans_of(self, track: str) -> list[Span]:
        """The spans of one track, sorted by start."""
        return sorted((s for s in self.spans if s.track == track), key=lambda s: (s.start_s, s.end_s))

    def group_spans(self, group: str) -> list[Span]:
        """The spans of every track ``group/*`` (e.g. :data:`TOOLS_GROUP`'s lanes), sorted by start."""
        prefix = f"{group}/"
        return sorted((s for s in self.spans if s.track.startswith(prefix)), key=lambda s: (s.start_s, s.end_s))

    def counter_series(self, name: str) -> list[Counter]:
        """The samples of one counter, sorted by time."""
        return sorted((c for c in self.counters if c.name == name), key=lambda c: c.t)

    def step_series(self, metric: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one per-step metric (steps where it is missing or null are skipped)."""
        xs: list[int] = []
        ys: list[float] = []
        for s in self.steps:
            v = s.metrics.get(metric)
            if v is not None:
                xs.append(s.step)
                ys.append(float(v))
        return xs, ys

    @property
    def end_s(self) -> float:
        """The latest time any event reaches (0.0 for an empty trace)."""
        ends = [s.end_s for s in self.spans] + [c.t for c in self.counters] + [s.t for s in self.steps]
        return max(ends, default=0.0)


def _parse_text(text: str, source: str) -> dict[str, Any]:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    # an unclosed streamed file (crashed run): drop a partial last line, close the array and the object
    body = text.rstrip()
    for _ in range(2):
        for tail in ("\n]}", "]}"):
            try:
                return json.loads(body.rstrip(",") + tail)
            except json.JSONDecodeError:
                continue
        body = body[: body.rfind("\n")] if "\n" in body else body
    raise ValueError(f"{source} is not trace-event JSON (and not a repairable truncated trace)")


def _events_of(doc: Any, source: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if isinstance(doc, list):
        return doc, {}
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        other = doc.get("otherData") or {}
        return doc["traceEvents"], other if isinstance(other, dict) else {}
    raise ValueError(
        f"{source}: expected a trace-event array or an object with 'traceEvents', got {type(doc).__name__}"
    )


def load_trace(path: str | os.PathLike[str]) -> TraceData:
    """Parse a trace written by :class:`TraceWriter` (or any trace-event JSON with the same conventions).

    Args:
        path: The ``trace.json`` file.

    Raises:
        ValueError: The file is not trace-event JSON.
    """
    path = Path(path)
    doc = _parse_text(path.read_text(encoding="utf-8"), str(path))
    events, other = _events_of(doc, str(path))
    groups: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    data = TraceData(metadata=dict(other))
    for ev in events:
        if ev.get("ph") != "M":
            continue
        if ev.get("name") == "process_name":
            groups[ev.get("pid", 0)] = str(ev.get("args", {}).get("name", ev.get("pid")))
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            pid, tid = ev.get("pid", 0), ev.get("tid", 0)
            group = groups.get(pid, str(pid))
            name = str(ev.get("args", {}).get("name", tid))
            track = str(ev.get("args", {}).get("track") or f"{group}/{name}")
            threads[(pid, tid)] = track
            info = ev.get("args", {}).get("lhr")
            if isinstance(info, dict):
                data.tracks.setdefault(track, {}).update(info)
            else:
                data.tracks.setdefault(track, {})

    def track_of(ev: dict[str, Any]) -> str:
        key = (ev.get("pid", 0), ev.get("tid", 0))
        if key in threads:
            return threads[key]
        group = groups.get(key[0], str(key[0]))
        return f"{group}/{key[1]}"

    for ev in events:
        ph = ev.get("ph")
        if ph == "X":
            start = float(ev.get("ts", 0.0)) / _US
            data.spans.append(
                Span(
                    track_of(ev),
                    str(ev.get("name", "")),
                    start,
                    start + float(ev.get("dur", 0.0)) / _US,
                    dict(ev.get("args") or {}),
                )
            )
        elif ph == "C":
            t = float(ev.get("ts", 0.0)) / _US
            for key, value in (ev.get("args") or {}).items():
                name = str(ev.get("name", "")) if key == "value" else f"{ev.get('name', '')}.{key}"
                if value is not None:
                    data.counters.append(Counter(name, t, float(value)))
        elif ph in ("i", "I") and ev.get("name") == STEP_METRICS:
            args = dict(ev.get("args") or {})
            step = int(args.pop("step", len(data.steps)))
            metrics = {k: float(v) for k, v in args.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            data.steps.append(StepMetrics(step, float(ev.get("ts", 0.0)) / _US, metrics))
    data.steps.sort(key=lambda s: s.step)
    return data


def merge_traces(
    paths: Iterable[str | os.PathLike[str]], out: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None
) -> Path:
    """Join traces written by several processes (e.g. the trainer and the rollouter) into one file.

    Tracks keep their names; times must share an origin. ``otherData`` objects are merged (later wins), then
    ``metadata`` on top.

    Args:
        paths: The trace files.
        out: The merged file to write.
        metadata: Extra run-level facts.
    """
    merged: dict[str, Any] = {}
    parsed = []
    for p in paths:
        trace = load_trace(p)
        merged.update(trace.metadata)
        parsed.append(trace)
    merged.update(metadata or {})
    with TraceWriter(out, merged) as tw:
        for trace in parsed:
            for track, info in trace.tracks.items():
                if info:
                    tw.describe_track(track, **info)
            for s in trace.spans:
                tw.span(s.track, s.name, s.start_s, s.end_s, s.args)
            for c in trace.counters:
                tw.counter(c.name, c.t, c.value)
            for st in trace.steps:
                with tw._lock:
                    pid, tid = tw._ids(TRAINER_TRACK)
                    args = {"step": st.step, **st.metrics}
                    tw._write_raw(
                        {
                            "name": STEP_METRICS,
                            "ph": "i",
                            "s": "t",
                            "ts": round(st.t * _US, 3),
                            "pid": pid,
                            "tid": tid,
                            "args": _jsonable(args),
                        }
                    )
    return Path(out)
