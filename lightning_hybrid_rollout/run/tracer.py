"""RunTracer: one run's Chrome trace (``trace.json``), in the conventions of :mod:`lightning_hybrid_rollout.trace`.

Replica tracks ``replica/<kind>_<i>`` are named by their state, ``trainer/trainer`` by the trainer's phase; the
counters ``queue_depth``, ``in_flight``, ``replica_restarts`` and the running totals (``trained_*``,
``decoded_tokens.<role>``, ``serving_s.<role>``: what ``lhr report`` and ``lhr simulate --from-run`` read back),
and one ``step_metrics`` event per sync cycle. Every method is a no-op on a run without a trace.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.trace import TOOLS_GROUP, TraceWriter

__all__ = ["RunTracer", "trace_track"]


def trace_track(replica_id: str) -> str:
    """``standalone-0`` -> ``replica/standalone_0``."""
    return "replica/" + replica_id.replace("-", "_")


class RunTracer:
    """The run's trace writer, its replica states, its running totals and its clock origin.

    Args:
        path: Where ``trace.json`` goes; None: no trace (every method does nothing).
        run_name: The run's name in the trace's metadata.
    """

    def __init__(self, path: Path | None, run_name: str = "") -> None:
        #: The writer (None without a trace).
        self.writer: TraceWriter | None = TraceWriter(path, metadata={"run": run_name}) if path is not None else None
        #: The trace's time origin (``time.monotonic()`` seconds).
        self.t0 = time.monotonic()
        self._states: dict[str, tuple[str, float]] = {}
        #: Running totals (a real run's balance bound, ``run_bound``): samples and response tokens the trainer took;
        #: per role, tokens decoded and seconds serving (the sum of the role windows taken).
        self.totals: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        """The run writes a trace and it is still open."""
        return self.writer is not None and not self.writer.closed

    def ts(self, t: float) -> float:
        """``time.monotonic()`` seconds as the trace's (since the tracer was made)."""
        return max(0.0, t - self.t0)

    def describe_tracks(
        self,
        concurrency: int,
        s_cores: list[list[int]],
        h_cores: list[list[int]],
        kv_tokens: Mapping[str, int | None] | None = None,
    ) -> None:
        """Each replica track's kind, devices, concurrency and its engine's KV-cache capacity in tokens (what
        ``lhr simulate --from-run`` fits ``kv_cache_tokens`` from; omitted when the engine did not report it)."""
        if self.writer is None:
            return
        for kind, all_cores in (("standalone", s_cores), ("hybrid", h_cores)):
            for i, cores in enumerate(all_cores):
                kv = (kv_tokens or {}).get(f"{kind}-{i}")
                extra = {"kv_cache_tokens": kv} if kv else {}
                self.writer.describe_track(
                    trace_track(f"{kind}-{i}"), kind=kind, devices=cores, concurrency=concurrency, **extra
                )
        self.writer.describe_track("trainer/trainer", kind="trainer", devices=sorted({c for h in h_cores for c in h}))

    def set_state(self, replica_ids: Sequence[str], state: str, t: float | None = None) -> None:
        """Close each replica's current state span and open ``state``."""
        if self.writer is None:
            return
        now = time.monotonic() if t is None else t
        for rid in replica_ids:
            prev = self._states.get(rid)
            if prev is not None and prev[0] != state:
                self.writer.span(trace_track(rid), prev[0], self.ts(prev[1]), self.ts(now))
            if prev is None or prev[0] != state:
                self._states[rid] = (state, now)

    def phase(self, phase: str, start: float, end: float, **args: Any) -> None:
        """A trainer phase span (``waiting``, ``training``, ``weight_sync``, ``switching``)."""
        if self.writer is not None and end > start:
            self.writer.span("trainer/trainer", phase, self.ts(start), self.ts(end), args)

    def add_totals(self, **amounts: float) -> None:
        """Add to the running totals (written at each cycle's end)."""
        for name, amount in amounts.items():
            self.totals[name] = self.totals.get(name, 0.0) + float(amount)

    def counter(self, name: str, t: float, value: float) -> None:
        """One counter value at ``time.monotonic()`` time ``t``."""
        if self.writer is not None:
            self.writer.counter(name, self.ts(t), value)

    def cycle(self, step: int, t: float, metrics: dict[str, float], queue_size: int, in_flight: int | None) -> None:
        """A cycle's end: the queue depth and in-flight counters, the running totals, the cycle's metrics."""
        if self.writer is None:
            return
        self.writer.counter("queue_depth", self.ts(t), queue_size)
        if in_flight is not None:
            self.writer.counter("in_flight", self.ts(t), in_flight)
        for name, total in sorted(self.totals.items()):
            self.writer.counter(name, self.ts(t), total)
        self.writer.step_metrics(step, self.ts(t), metrics)

    def tool_call(self, name: str, start: float, end: float, args: Mapping[str, Any]) -> None:
        """One ended tool call or environment reset/step on a ``tools/lane_<k>`` track (concurrent calls get lanes
        of their own); a call ending after the trace closed is dropped."""
        if self.enabled:
            assert self.writer is not None
            self.writer.lane_span(TOOLS_GROUP, name, self.ts(start), self.ts(max(start, end)), args)

    def close(self, t: float | None = None) -> None:
        """End every replica's open state span (at ``t``, default now) and close the file."""
        if self.writer is None:
            return
        now = time.monotonic() if t is None else t
        for rid, (state, since) in list(self._states.items()):
            self.writer.span(trace_track(rid), state, self.ts(since), self.ts(now))
        self._states.clear()
        self.writer.close()
