"""Request routing across rollout replicas: sticky sessions + least-loaded, with add/remove/abort/dead handling.

The seed's "Rollout LoadBalancer": every generation segment the rollouter sends is acquired here (replica picked,
counted in flight) and released. A removed, dead or paused replica never receives a new request; the routing rule
is described in docs/rollout.md. Not thread-safe: use it from the rollouter's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from lightning_hybrid_rollout.errors import NoReplicaAvailableError as NoReplicaAvailableError  # re-exported
from lightning_hybrid_rollout.errors import is_replica_dead_error as is_replica_dead_error  # re-exported
from lightning_hybrid_rollout.rollout.drain import DrainReport
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec

log = logging.getLogger(__name__)

ReplicaState = Literal["active", "removed", "dead"]

# Names of exception classes that mean "this replica's process is gone" (checked along the MRO, so neither Ray nor
# ``replica.py`` has to be imported here): the replica handle's own error and Ray's actor-death errors.


@runtime_checkable
class ReplicaLike(Protocol):
    """What the load balancer and the rollouter need from a replica handle.

    ``rollout/replica.py``'s ``ReplicaHandle`` satisfies it; so does the in-test fake. ``generate`` returns
    ``finish_reason="abort"`` with the partial tokens when aborted, and raises
    :class:`~lightning_hybrid_rollout.errors.ReplicaDeadError` when the replica's process is gone.
    """

    replica_id: str
    is_alive: bool

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec
    ) -> GenerationResult: ...

    async def abort(self, request_ids: list[str]) -> None: ...


@dataclass
class _Entry:
    replica: ReplicaLike
    state: ReplicaState = "active"
    paused: bool = False
    in_flight: set[str] = field(default_factory=set)
    routed_total: int = 0


class LoadBalancer:
    """Sticky + least-loaded router over rollout replicas with in-flight accounting.

    Args:
        replicas: Replicas to register at construction (routable immediately).
        sticky_capacity: Maximum number of sticky keys remembered (least recently used evicted first).
        acquire_timeout_s: How long :meth:`acquire` waits for a routable replica before raising
            :class:`NoReplicaAvailableError`; ``None`` waits forever.
        abort_timeout_s: Default time :meth:`abort_replicas` waits for aborted requests to be released.

    Example::

        lb = LoadBalancer([replica_a, replica_b])
        replica = await lb.acquire("req-1")
        try:
            result = await replica.generate("req-1", prompt_ids, SamplingSpec(max_tokens=16))
        finally:
            lb.release(replica.replica_id, "req-1")
    """

    def __init__(
        self,
        replicas: Iterable[ReplicaLike] = (),
        *,
        sticky_capacity: int = 10_000,
        acquire_timeout_s: float | None = 300.0,
        abort_timeout_s: float = 60.0,
    ) -> None:
        if sticky_capacity < 0:
            raise ValueError(f"sticky_capacity must be >= 0, got {sticky_capacity}")
        if acquire_timeout_s is not None and acquire_timeout_s <= 0:
            raise ValueError(f"acquire_timeout_s must be > 0 or None, got {acquire_timeout_s}")
        self.sticky_capacity = sticky_capacity
        self.acquire_timeout_s = acquire_timeout_s
        self.abort_timeout_s = abort_timeout_s
        self._entries: dict[str, _Entry] = {}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._request_replica: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []
        self._routable_event: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._release_event: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self.add_replicas(replicas)

    # ------------------------------------------------------------------ pool membership

    def add_replicas(self, replicas: Iterable[ReplicaLike], *, paused: bool = False) -> None:
        """Register replicas (or re-register removed/dead ones, e.g. a restarted actor under the same id).

        Args:
            replicas: Replica handles; a handle whose id is already registered replaces the old handle.
            paused: Register them paused (not routable until :meth:`resume_replicas`).
        """
        changed = False
        for replica in replicas:
            rid = replica.replica_id
            entry = self._entries.get(rid)
            if entry is None:
                self._entries[rid] = _Entry(replica=replica, paused=paused)
            else:
                entry.replica = replica
                entry.state = "active"
                entry.paused = paused
            changed = True
            log.debug("load balancer: added replica %s (paused=%s)", rid, paused)
        if changed:
            self._pool_changed()

    def remove_replicas(self, replica_ids: Iterable[str]) -> None:
        """Cut routing to replicas: they never get a new request; their in-flight requests keep running.

        Args:
            replica_ids: Ids of registered replicas.
        """
        for rid in replica_ids:
            entry = self._entry(rid)
            if entry.state == "active":
                entry.state = "removed"
            log.debug("load balancer: removed replica %s (%d in flight)", rid, len(entry.in_flight))
        self._pool_changed()

    def mark_dead(self, replica_id: str) -> None:
        """Record that a replica's process is gone: never routed again until re-added.

        Args:
            replica_id: Id of a registered replica.
        """
        entry = self._entry(replica_id)
        if entry.state != "dead":
            entry.state = "dead"
            log.warning("load balancer: replica %s marked dead (%d in flight)", replica_id, len(entry.in_flight))
            self._pool_changed()

    def resume_replicas(self, replica_ids: Iterable[str] | None = None) -> None:
        """Let paused replicas accept requests again (verl's ``resume_generation_replicas``).

        Args:
            replica_ids: Ids to resume; ``None`` resumes all registered replicas.
        """
        for rid in self._ids_or_all(replica_ids):
            self._entry(rid).paused = False
        self._pool_changed()

    def clear_sticky_cache(self) -> int:
        """Forget all sticky routes (next routing of every key is least-loaded). Returns how many were dropped."""
        n = len(self._sticky)
        self._sticky.clear()
        return n

    def clear_sticky_key(self, key: str) -> None:
        """Forget one sticky route (its next request is routed least-loaded).

        Args:
            key: A sticky key (the rollouter uses the sample uid).
        """
        self._sticky.pop(key, None)

    # ------------------------------------------------------------------ queries

    def active_server_count(self) -> int:
        """Number of registered, alive replicas (paused ones included): verl's ``get_active_server_count()``."""
        return sum(1 for e in self._entries.values() if e.state == "active" and _alive(e.replica))

    def routable_replica_ids(self) -> list[str]:
        """Ids of replicas that can take a new request now, in registration order."""
        return [rid for rid, e in self._entries.items() if self._routable(e)]

    def replica_ids(self, state: ReplicaState | None = None) -> list[str]:
        """Ids of known replicas, optionally filtered by state, in registration order.

        Args:
            state: ``"active"``, ``"removed"``, ``"dead"`` or ``None`` for all.
        """
        return [rid for rid, e in self._entries.items() if state is None or e.state == state]

    def replica_state(self, replica_id: str) -> ReplicaState:
        """State of a known replica (``"active"``, ``"removed"`` or ``"dead"``)."""
        return self._entry(replica_id).state

    def get_replica(self, replica_id: str) -> ReplicaLike:
        """The handle registered under ``replica_id``."""
        return self._entry(replica_id).replica

    def in_flight(self, replica_id: str) -> int:
        """Number of requests currently counted in flight on a replica."""
        return len(self._entry(replica_id).in_flight)

    def in_flight_counts(self) -> dict[str, int]:
        """In-flight count of every known replica."""
        return {rid: len(e.in_flight) for rid, e in self._entries.items()}

    def in_flight_request_ids(self, replica_id: str) -> list[str]:
        """Request ids currently in flight on a replica."""
        return sorted(self._entry(replica_id).in_flight)

    @property
    def total_in_flight(self) -> int:
        """Requests in flight over all replicas."""
        return len(self._request_replica)

    @property
    def sticky_cache_size(self) -> int:
        """Number of remembered sticky keys."""
        return len(self._sticky)

    def routed_counts(self) -> dict[str, int]:
        """Total requests ever routed to each replica."""
        return {rid: e.routed_total for rid, e in self._entries.items()}

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever the pool changes (add/remove/dead/resume): capacity may have changed.

        Args:
            callback: A cheap synchronous function, called on the event loop thread.
        """
        self._listeners.append(callback)

    # ------------------------------------------------------------------ routing

    async def acquire(
        self, request_id: str, *, sticky_key: str | None = None, timeout: float | None = None
    ) -> ReplicaLike:
        """Pick a replica for a request and count it in flight there; wait while none is routable.

        Removed and paused replicas are expected back, so the timeout runs only while every known replica is dead or
        none is registered.

        Args:
            request_id: Unique id of this engine request (one per segment); released with :meth:`release`.
            sticky_key: Key for sticky routing (default: ``request_id``).
            timeout: Seconds to wait while no replica can come back (default: ``acquire_timeout_s``).

        Returns:
            The chosen replica (a :class:`ReplicaLike`).

        Raises:
            NoReplicaAvailableError: Every replica stayed dead (or none was registered) for the timeout.
            ValueError: ``request_id`` is already in flight.
        """
        return await self.acquire_many([request_id], sticky_key=sticky_key, timeout=timeout)

    async def acquire_many(
        self, request_ids: Sequence[str], *, sticky_key: str | None = None, timeout: float | None = None
    ) -> ReplicaLike:
        """:meth:`acquire` for requests that go to ONE replica together (a prompt group's samples, one call).

        The replica is picked once (sticky, else least loaded) and every id is counted in flight there; release each
        with :meth:`release` (or all with :meth:`release_many`). The rollouter passes the group id as ``sticky_key``,
        so a group's later segments go back to the replica holding its prompt in the prefix cache.

        Args:
            request_ids: Unique ids, at least one (``sticky_key`` defaults to the first).
            sticky_key: Key for sticky routing.
            timeout: As for :meth:`acquire`.
        """
        if not request_ids:
            raise ValueError("acquire_many needs at least one request id")
        for request_id in request_ids:
            if request_id in self._request_replica:
                raise ValueError(
                    f"request id {request_id!r} is already in flight on replica "
                    f"{self._request_replica[request_id]!r}; use a fresh id per engine request (e.g. '<uid>:<segment>')"
                )
        key = request_ids[0] if sticky_key is None else sticky_key
        limit = self.acquire_timeout_s if timeout is None else timeout
        deadline: float | None = None
        while True:
            entry = self._pick(key)
            if entry is not None:
                for request_id in request_ids:
                    self._register(entry, key, request_id)
                return entry.replica
            event = self._event("_routable_event")
            remaining: float | None = None
            if any(e.state != "dead" for e in self._entries.values()):
                deadline = None  # a removed/paused replica can come back: wait for it
            elif limit is not None:
                deadline = time.monotonic() + limit if deadline is None else deadline
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NoReplicaAvailableError(
                        f"no replica for request {request_ids[0]!r} for {limit:.1f}s: every replica is dead or none "
                        f"is registered (replicas: {self._describe()}); add replicas (add_replicas) or raise "
                        "acquire_timeout_s / no_replica_timeout_s"
                    )
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                continue

    def release_many(self, replica_id: str, request_ids: Iterable[str]) -> None:
        """:meth:`release` each of ``request_ids`` (what :meth:`acquire_many` counted in)."""
        for request_id in request_ids:
            self.release(replica_id, request_id)

    def release(self, replica_id: str, request_id: str) -> None:
        """Count a request out of a replica's in-flight set (idempotent).

        Args:
            replica_id: The replica :meth:`acquire` returned.
            request_id: The request id passed to :meth:`acquire`.
        """
        entry = self._entries.get(replica_id)
        if entry is not None:
            entry.in_flight.discard(request_id)
        if self._request_replica.get(request_id) == replica_id:
            del self._request_replica[request_id]
        self._signal("_release_event")

    async def abort_replicas(
        self,
        replica_ids: Iterable[str] | None = None,
        *,
        wait: bool = True,
        timeout: float | None = None,
        resend_interval_s: float = 0.2,
    ) -> int:
        """Abort the requests in flight on the given replicas (a snapshot taken now).

        With ``wait=True`` this returns only once those requests have been released (their callers saw the abort
        and counted them out), re-sending the abort every ``resend_interval_s`` to requests that reached the engine
        after it. Requests routed after the call are not affected: :meth:`remove_replicas` (or pause) first so the
        retries do not land on the same replicas.

        Args:
            replica_ids: Replicas to abort on; ``None`` means every known replica.
            wait: Wait until the aborted requests are released.
            timeout: Seconds to wait (default: ``abort_timeout_s``).
            resend_interval_s: Interval between abort re-sends to requests still in flight.

        Returns:
            Number of requests aborted.

        Raises:
            TimeoutError: Requests were still in flight after ``timeout`` (named in the message).
        """
        snapshot = self._in_flight_snapshot(replica_ids)
        if snapshot:
            limit = self.abort_timeout_s if timeout is None else timeout
            await self._abort_until_released(snapshot, wait, limit, resend_interval_s)
        return sum(len(reqs) for reqs in snapshot.values())

    async def drain_replicas(
        self,
        replica_ids: Iterable[str] | None,
        budget_s: float,
        *,
        timeout: float | None = None,
        resend_interval_s: float = 0.2,
    ) -> DrainReport:
        """Drain-aware :meth:`abort_replicas`: requests that will finish within ``budget_s`` complete, the rest abort.

        A replica without a ``drain`` method is aborted. Then, like :meth:`abort_replicas`, it waits until every
        request in flight at the call has been released. ``budget_s <= 0`` aborts everything at once (verl's
        deactivation). :meth:`remove_replicas` first, so retries land elsewhere.

        Args:
            replica_ids: Replicas to drain; ``None`` means every known replica.
            budget_s: Seconds the replicas may let requests finish.
            timeout: Seconds to wait for every request to be released (default: ``abort_timeout_s``).
            resend_interval_s: Interval between abort re-sends to requests still in flight after the drain.

        Returns:
            A :class:`~lightning_hybrid_rollout.rollout.drain.DrainReport`, summed over the replicas.

        Raises:
            TimeoutError: Requests were still in flight after ``timeout`` (named in the message).
        """
        t0 = time.monotonic()
        snapshot = self._in_flight_snapshot(replica_ids)
        if not snapshot:
            return DrainReport()
        limit = self.abort_timeout_s if timeout is None else timeout
        reports = await asyncio.gather(
            *(self._drain_on(rid, sorted(r), budget_s, limit) for rid, r in snapshot.items())
        )
        await self._abort_until_released(snapshot, True, max(limit - (time.monotonic() - t0), 1.0), resend_interval_s)
        engines = sum(reports, DrainReport())
        total = sum(len(reqs) for reqs in snapshot.values())
        drained = min(engines.drained, total)
        report = DrainReport(
            requests=total,
            drained=drained,
            aborted=total - drained,
            aborted_tokens=engines.aborted_tokens,
            reprefill_tokens=engines.reprefill_tokens,
            seconds=time.monotonic() - t0,
        )
        log.debug("load balancer: drained %s with a %.3fs budget: %s", sorted(snapshot), budget_s, report)
        return report

    # ------------------------------------------------------------------ internals

    def _in_flight_snapshot(self, replica_ids: Iterable[str] | None) -> dict[str, set[str]]:
        """The requests in flight now on the given (known) replicas, per replica with any."""
        ids = [rid for rid in self._ids_or_all(replica_ids) if rid in self._entries]
        return {rid: set(self._entries[rid].in_flight) for rid in ids if self._entries[rid].in_flight}

    async def _abort_until_released(
        self, snapshot: dict[str, set[str]], wait: bool, limit: float, resend_interval_s: float
    ) -> None:
        """Abort the requests of ``snapshot`` still in flight and (``wait``) re-send until all are released."""
        deadline = time.monotonic() + limit
        while True:
            left = {rid: sorted(reqs & self._entries[rid].in_flight) for rid, reqs in snapshot.items()}
            left = {rid: reqs for rid, reqs in left.items() if reqs}
            if not left:
                return
            await asyncio.gather(*(self._abort_on(rid, reqs) for rid, reqs in left.items()))
            if not wait:
                return
            resend_at = time.monotonic() + resend_interval_s
            while True:
                still = any(reqs & self._entries[rid].in_flight for rid, reqs in snapshot.items())
                now = time.monotonic()
                if not still or now >= resend_at:
                    break
                if now >= deadline:
                    left = {rid: sorted(reqs & self._entries[rid].in_flight) for rid, reqs in snapshot.items()}
                    raise TimeoutError(
                        f"aborted requests still in flight after {limit:.1f}s: "
                        f"{ {rid: reqs for rid, reqs in left.items() if reqs} }; the replica may be hung "
                        "(check its health) or the caller is not releasing its requests"
                    )
                event = self._event("_release_event")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(resend_at, deadline) - now)

    async def _drain_on(self, replica_id: str, request_ids: list[str], budget_s: float, limit: float) -> DrainReport:
        """``replica.drain(budget_s)`` (bounded by ``limit``); an abort where it has no ``drain`` or it failed."""
        entry = self._entries[replica_id]
        drain = getattr(entry.replica, "drain", None)
        if entry.state == "dead" or drain is None:
            await self._abort_on(replica_id, request_ids)
            return DrainReport()
        try:
            return await asyncio.wait_for(drain(budget_s), limit)
        except Exception as exc:
            if is_replica_dead_error(exc):
                self.mark_dead(replica_id)
                return DrainReport()
            log.warning("load balancer: drain on replica %s failed (%r); aborting its requests", replica_id, exc)
        await self._abort_on(replica_id, request_ids)
        return DrainReport()

    async def _abort_on(self, replica_id: str, request_ids: list[str]) -> None:
        entry = self._entries[replica_id]
        if entry.state == "dead":
            return
        try:
            await entry.replica.abort(request_ids)
        except Exception as exc:
            if is_replica_dead_error(exc):
                self.mark_dead(replica_id)
            else:
                log.warning("load balancer: abort on replica %s failed: %r", replica_id, exc)

    def _pick(self, key: str) -> _Entry | None:
        sticky = self._sticky.get(key)
        if sticky is not None:
            entry = self._entries.get(sticky)
            if entry is not None and self._routable(entry):
                self._sticky.move_to_end(key)
                return entry
        for rid, entry in list(self._entries.items()):
            if entry.state != "dead" and not _alive(entry.replica):
                self.mark_dead(rid)  # the handle noticed before any request did
        best: _Entry | None = None
        for entry in self._entries.values():
            if self._routable(entry) and (best is None or len(entry.in_flight) < len(best.in_flight)):
                best = entry
        return best

    def _register(self, entry: _Entry, key: str, request_id: str) -> ReplicaLike:
        rid = entry.replica.replica_id
        entry.in_flight.add(request_id)
        entry.routed_total += 1
        self._request_replica[request_id] = rid
        if self.sticky_capacity > 0:
            self._sticky[key] = rid
            self._sticky.move_to_end(key)
            while len(self._sticky) > self.sticky_capacity:
                self._sticky.popitem(last=False)
        return entry.replica

    @staticmethod
    def _routable(entry: _Entry) -> bool:
        return entry.state == "active" and not entry.paused and _alive(entry.replica)

    def _entry(self, replica_id: str) -> _Entry:
        try:
            return self._entries[replica_id]
        except KeyError:
            raise KeyError(
                f"unknown replica id {replica_id!r}; known: {list(self._entries)}; register it with add_replicas"
            ) from None

    def _ids_or_all(self, replica_ids: Iterable[str] | None) -> Sequence[str]:
        return list(self._entries) if replica_ids is None else list(replica_ids)

    def _describe(self) -> str:
        if not self._entries:
            return "none registered"
        return ", ".join(
            f"{rid}={e.state}{'/paused' if e.paused else ''}{'' if _alive(e.replica) else '/not-alive'}"
            for rid, e in self._entries.items()
        )

    def _pool_changed(self) -> None:
        self._signal("_routable_event")
        for callback in self._listeners:
            callback()

    def _event(self, name: str) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        current = getattr(self, name)
        if current is None or current[0] is not loop:
            current = (loop, asyncio.Event())
            setattr(self, name, current)
        return current[1]

    def _signal(self, name: str) -> None:
        # Wake the waiters and arm a fresh event for the next wait (events are per loop; see _event).
        current = getattr(self, name)
        if current is not None:
            current[1].set()
            setattr(self, name, None)


def _alive(replica: ReplicaLike) -> bool:
    return bool(getattr(replica, "is_alive", True))
