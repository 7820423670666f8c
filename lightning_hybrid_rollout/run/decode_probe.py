"""DecodeProgressProbe: each standalone replica's generated tokens, read at the trainer's ``training`` boundaries.

The trace counters ``generated_tokens.<replica>`` and ``in_flight.<replica>`` let ``lhr simulate --from-run`` fit
``replica.speed_while_training`` (docs/simulator.md). A probe never holds up or breaks the run: it hands one
``health()`` call per replica to the runtime's loop and returns; answers are written as they arrive, failures dropped.

Example::

    probe = DecodeProgressProbe(trace_writer, loop, ts=lambda t: t - t0, track_of=RolloutRuntime.trace_track)
    probe.probe(runtime.standalone)  # returns at once; the counters follow
    ...
    probe.close()  # before the trace writer closes
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from lightning_hybrid_rollout.rollout.event_loop import EventLoopThread
from lightning_hybrid_rollout.rollout.weights.push import driver_node_id
from lightning_hybrid_rollout.trace import GENERATED_TOKENS, IN_FLIGHT

__all__ = ["DecodeProgressProbe"]

log = logging.getLogger(__name__)


class DecodeProgressProbe:
    """Samples replicas' generated-token totals into the trace without blocking the caller.

    Args:
        trace: The run's :class:`~lightning_hybrid_rollout.trace.TraceWriter` (thread-safe).
        loop: The runtime's event loop; the ``health()`` calls run there.
        ts: Trace time (seconds since the run's origin) of a ``time.monotonic()`` reading.
        track_of: A replica id's trace track (``standalone-0`` -> ``replica/standalone_0``).
        timeout_s: A call unanswered this long is dropped (the replica can be probed again).
        local_node_id: The trainer's Ray node id (default: read from Ray once it is connected).
        clock: The trainer's clock (``time.monotonic``: what ``ts`` converts).
    """

    def __init__(
        self,
        trace: Any,
        loop: EventLoopThread,
        ts: Callable[[float], float],
        track_of: Callable[[str], str],
        *,
        timeout_s: float = 30.0,
        local_node_id: Callable[[], str] = driver_node_id,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trace = trace
        self._loop = loop
        self._ts = ts
        self._track_of = track_of
        self._timeout_s = timeout_s
        self._local_node_id = local_node_id
        self._node_id = ""
        self._clock = clock
        self._lock = threading.Lock()
        #: ``id(replica)`` -> its unanswered call (the call holds the replica, so the id is not reused meanwhile).
        self._pending: dict[int, concurrent.futures.Future[None]] = {}
        self._closed = False
        #: ``health()`` calls sent.
        self.sent = 0
        #: Samples written into the trace.
        self.written = 0
        #: Replicas skipped because their previous call was still out.
        self.skipped = 0
        #: Calls that failed or timed out (nothing written).
        self.failed = 0
        #: The longest round trip of a written sample, seconds.
        self.max_round_trip_s = 0.0

    @property
    def outstanding(self) -> int:
        """Calls sent and not answered yet."""
        with self._lock:
            return len(self._pending)

    def probe(self, replicas: Sequence[Any]) -> int:
        """Ask each replica for its generated tokens, on the event loop; returns at once.

        Args:
            replicas: Replica handles (``replica_id`` and an async ``health()``); the standalone ones.

        Returns:
            Calls sent (a replica whose previous call is still out is skipped).
        """
        sent: list[tuple[int, concurrent.futures.Future[None]]] = []
        with self._lock:
            if self._closed or not self._loop.is_alive:
                return 0
            for replica in list(replicas):
                key = id(replica)
                if key in self._pending:
                    self.skipped += 1
                    continue
                coro = self._probe_one(replica)
                try:
                    future = asyncio.run_coroutine_threadsafe(coro, self._loop.loop)
                except Exception as err:  # the loop closed meanwhile (shutdown)
                    coro.close()
                    log.debug("decode progress probe not sent: %r", err)
                    break
                self._pending[key] = future
                sent.append((key, future))
            self.sent += len(sent)
        for key, future in sent:  # outside the lock: a call already done runs its callback here
            future.add_done_callback(lambda f, k=key: self._done(k, f))
        return len(sent)

    def _done(self, key: int, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            if self._pending.get(key) is future:
                del self._pending[key]

    async def _probe_one(self, replica: Any) -> None:
        """One ``health()`` call; its answer becomes one counter sample (nothing on failure)."""
        rid = getattr(replica, "replica_id", "?")
        try:
            sent = self._clock()
            health = await asyncio.wait_for(replica.health(), self._timeout_s)
            received = self._clock()
            if not isinstance(health, dict) or "tokens_generated" not in health or "tokens_in_flight" not in health:
                return  # an engine that does not count tokens (a test fake)
            tokens = int(health["tokens_generated"]) + int(health["tokens_in_flight"])
            t = self._sample_time(health, sent, received)
            track = self._track_of(rid).partition("/")[2]
            inflight = health.get("inflight")
            with self._lock:  # close() waits for a write in progress; none follows it
                if self._closed:
                    return
                self._trace.counter(f"{GENERATED_TOKENS}.{track}", self._ts(t), tokens)
                if isinstance(inflight, int):
                    self._trace.counter(f"{IN_FLIGHT}.{track}", self._ts(t), inflight)
                self.written += 1
                self.max_round_trip_s = max(self.max_round_trip_s, received - sent)
        except Exception as err:
            with self._lock:
                self.failed += 1
            log.debug("decode progress probe of %s failed: %r", rid, err)

    def _sample_time(self, health: dict[str, Any], sent: float, received: float) -> float:
        """When the replica read its counts, on the trainer's clock: its own reading on the trainer's node (clamped
        into the call), else the call's midpoint."""
        if not self._node_id:  # read once Ray is up
            self._node_id = self._local_node_id()
        remote = health.get("monotonic")
        if self._node_id and health.get("node_id") == self._node_id and isinstance(remote, int | float):
            return min(max(float(remote), sent), received)
        return (sent + received) / 2

    def close(self) -> None:
        """Drop the calls still out (cancelled on the loop) and write nothing more; call before the trace closes."""
        with self._lock:
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        for future in pending:
            future.cancel()
        log.debug(
            "decode progress probes: %d sent, %d written, %d skipped (a call still out), %d failed; longest round "
            "trip %.1f ms",
            self.sent,
            self.written,
            self.skipped,
            self.failed,
            1e3 * self.max_round_trip_s,
        )
