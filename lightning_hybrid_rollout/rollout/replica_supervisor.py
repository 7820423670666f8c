"""ReplicaSupervisor: finds dead or unresponsive replicas and starts their replacements.

A replica whose actor died, or that missed a health check (then killed), is replaced from the same
:class:`~lightning_hybrid_rollout.rollout.replica.ReplicaSpec` in the background; the owner pushes the current
weights to each replacement before it takes requests, and a slot whose replacements keep failing is abandoned after
``max_restarts`` tries. Routing is not its concern: the load balancer already avoids dead replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.errors import is_replica_dead_error

log = logging.getLogger(__name__)

__all__ = ["ReplicaEvent", "ReplicaSupervisor"]


@dataclass(frozen=True)
class ReplicaEvent:
    """One thing that happened to a replica slot (the trace and the logs show them).

    Args:
        t: ``time.monotonic()`` reading.
        replica_id: The slot (``standalone-0``, ``hybrid-1``, ...).
        kind: ``"dead"`` (its actor died), ``"unresponsive"`` (no health answer in time; killed), ``"restarting"``
            (a replacement was launched), ``"start_failed"``, ``"restarted"`` (the replacement holds the current
            weights and takes requests), ``"abandoned"`` (``max_restarts`` replacements failed in a row).
        detail: Why, in words.
    """

    t: float
    replica_id: str
    kind: str
    detail: str = ""


StartFn = Callable[[Any], Awaitable[Any]]


class ReplicaSupervisor:
    """Health checks and replacements of a run's replicas (async methods run on the runtime's loop).

    Args:
        start: ``await start(spec)`` launches one replica and returns its handle once its engine is up (raises if it
            cannot start); ``RolloutRuntime`` passes its ``RayRuntime``'s, which also tracks it for the shutdown.
        health_timeout_s: Seconds a health check may take before the replica counts as unresponsive.
        max_restarts: Replacements tried per slot in a row before the slot is abandoned (0: never replace).
        clock: Time source of the events.
    """

    def __init__(
        self,
        start: StartFn,
        *,
        health_timeout_s: float = 60.0,
        max_restarts: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._start = start
        self.health_timeout_s = health_timeout_s
        self.max_restarts = max_restarts
        self._clock = clock
        #: Replacements that joined (took the current weights and requests): ``dynamic_resource/replica_restarts``.
        self.restarts = 0
        #: Slots given up on.
        self.abandoned: set[str] = set()
        self.events: list[ReplicaEvent] = []
        self._failures: dict[str, int] = {}
        self._starting: dict[str, tuple[Any, asyncio.Task[Any]]] = {}  # slot -> (spec, start task)

    # ------------------------------------------------------------------------------------------------ queries

    @property
    def starting(self) -> list[str]:
        """Slots whose replacement is being started."""
        return sorted(self._starting)

    @property
    def launching(self) -> list[str]:
        """Slots whose replacement has not finished starting yet (``starting`` less those up, waiting to join)."""
        return sorted(rid for rid, (_, task) in self._starting.items() if not task.done())

    def _event(self, replica_id: str, kind: str, detail: str = "") -> None:
        self.events.append(ReplicaEvent(self._clock(), replica_id, kind, detail))

    # ------------------------------------------------------------------------------------------------ checks

    async def find_failed(self, replicas: Sequence[Any], *, probe: bool) -> list[tuple[Any, str]]:
        """The replicas that are dead, each with why; with ``probe``, each live one answers a health check first.

        A replica that does not answer within ``health_timeout_s``, or whose engine reports itself broken, is
        killed here (so nothing it still holds can come back later).
        """

        async def check(replica: Any) -> str | None:
            if not replica.is_alive:
                return "its actor died"
            if not probe:
                return None
            try:
                await asyncio.wait_for(replica.health(), self.health_timeout_s)
            except TimeoutError:
                replica.kill()
                return f"no health answer within {self.health_timeout_s:g}s (killed)"
            except Exception as err:
                if is_replica_dead_error(err):
                    return "its actor died"
                replica.kill()
                return f"its engine failed its health check: {type(err).__name__}: {err} (killed)"
            return None

        verdicts = await asyncio.gather(*(check(r) for r in replicas))
        return [(r, why) for r, why in zip(replicas, verdicts, strict=True) if why is not None]

    # --------------------------------------------------------------------------------------------- replacing

    def replace(self, replica: Any, why: str) -> None:
        """Kill what is left of ``replica`` and start its replacement in the background (on the running loop)."""
        rid = replica.replica_id
        with contextlib.suppress(Exception):
            replica.kill()
        kind = "unresponsive" if "health" in why else "dead"
        self._event(rid, kind, why)
        log.warning("replica %s (%s) failed: %s", rid, replica.role, why)
        self._launch(rid, replica.spec)

    def _launch(self, rid: str, spec: Any) -> None:
        if rid in self._starting or rid in self.abandoned:
            return
        if self._failures.get(rid, 0) >= self.max_restarts:
            self.abandoned.add(rid)
            self._event(rid, "abandoned", f"{self._failures.get(rid, 0)} replacement(s) failed in a row")
            log.error(
                "replica %s: giving up after %d failed replacement(s) (rollout.max_replica_restarts=%d)",
                rid,
                self._failures.get(rid, 0),
                self.max_restarts,
            )
            return
        spec = dataclasses.replace(spec, generation=spec.generation + 1)
        self._starting[rid] = (spec, asyncio.ensure_future(self._start(spec)))
        self._event(rid, "restarting", f"generation {spec.generation}")
        log.warning("replica %s: starting a replacement (generation %d)", rid, spec.generation)

    def take_ready(self) -> list[Any]:
        """Replacements that are up since the last call (to be synced and registered by the owner).

        A replacement that failed to start is retried (or its slot abandoned after ``max_restarts``).
        """
        ready: list[Any] = []
        for rid, (spec, task) in list(self._starting.items()):
            if not task.done():
                continue
            del self._starting[rid]
            err = task.exception()
            if err is None:
                ready.append(task.result())
                continue
            self._failures[rid] = self._failures.get(rid, 0) + 1
            self._event(rid, "start_failed", f"{type(err).__name__}: {err}")
            log.warning("replica %s: the replacement failed to start: %r", rid, err)
            self._launch(rid, spec)
        return ready

    def joined(self, replica: Any) -> None:
        """``replica`` (a replacement) holds the current weights and takes requests."""
        self._failures[replica.replica_id] = 0
        self.restarts += 1
        self._event(replica.replica_id, "restarted", f"generation {replica.spec.generation}")
        log.warning(
            "replica %s: replacement generation %d joined (actor pid %s; replica_restarts=%d)",
            replica.replica_id,
            replica.spec.generation,
            replica.info.get("frontend_pid"),
            self.restarts,
        )

    def failed_to_join(self, replica: Any, err: BaseException) -> None:
        """The replacement came up but its weight sync failed: kill it and try again (counts as a failed start)."""
        self._failures[replica.replica_id] = self._failures.get(replica.replica_id, 0) + 1
        self._event(replica.replica_id, "start_failed", f"weight sync: {type(err).__name__}: {err}")
        with contextlib.suppress(Exception):
            replica.kill()
        self._launch(replica.replica_id, replica.spec)

    async def wait_any(self, timeout: float) -> None:
        """Until a replacement start finishes (or ``timeout``)."""
        tasks = [task for _, task in self._starting.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)

    def cancel(self) -> None:
        """Stop starting replacements (the run ends)."""
        for _, task in self._starting.values():
            task.cancel()
        self._starting.clear()
