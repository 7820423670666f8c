"""The ``collective`` transport: a torch.distributed broadcast from the trainer (rank 0) to the replicas' engines.

One code path for both backends: ``gloo`` over CPU tensors, ``nccl`` over CUDA tensors. The group is its own
(a ``TCPStore`` plus a standalone backend object, like vLLM's stateless groups), apart from any default process
group the trainer's strategy holds; the store binds a port the OS picks, so concurrent runs never collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.weights.base import (
    BucketLayout,
    CollectiveBucket,
    CollectiveCommit,
    CollectiveJoin,
    EngineReceiver,
    Items,
    NamedTensors,
    WeightTransport,
)
from lightning_hybrid_rollout.rollout.weights.format import DEFAULT_BUCKET_BYTES, plan_buckets
from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import SyncReport, verified_sessions

logger = logging.getLogger(__name__)


def backend_group(store: Any, name: str, rank: int, world_size: int, backend: str, timeout_s: float) -> Any:
    """A standalone ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` over ``store`` (blocks until every rank joined)."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(name, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)


def broadcast(pg: Any, buf: torch.Tensor) -> None:
    """Broadcast ``buf`` from rank 0 of ``pg`` (in place on the other ranks); blocks until done."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([buf], opts).wait()
    if buf.is_cuda:
        torch.cuda.current_stream(buf.device).synchronize()


def _shutdown(pg: Any) -> None:
    with contextlib.suppress(Exception):
        pg.shutdown()


def _trainer_host() -> str:
    """This node's address as the replicas see it (Ray's node address; loopback without Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # pragma: no cover - Ray missing
        pass
    return "127.0.0.1"


@dataclass
class _Group:
    """One broadcast group: the trainer (rank 0) and ``members`` (ranks 1..N, in order)."""

    name: str
    members: list[WeightReceiver]
    store: Any
    pg: Any = None
    pushes: int = 0
    ids: set[str] = field(default_factory=set)

    def close(self) -> None:
        if self.pg is not None:
            _shutdown(self.pg)
        self.pg = self.store = None


class CollectiveTransport(WeightTransport):
    """Trainer side: one broadcast group per set of replicas (kept across pushes), layer-aligned buckets.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default: ``nccl`` when CUDA is available, else ``gloo``.
        timeout_s: Collective timeout (a replica that died fails the push after this long).
    """

    name: ClassVar[str] = "collective"

    def __init__(self, backend: str | None = None, timeout_s: float = 120.0) -> None:
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None
        self.timeout_s = timeout_s
        self._groups: dict[tuple[tuple[str, int], ...], _Group] = {}

    async def _group_for(self, replicas: Sequence[WeightReceiver]) -> _Group:
        key = tuple((r.replica_id, id(r)) for r in replicas)
        group = self._groups.get(key)
        if group is not None:
            return group
        ids = {r.replica_id for r in replicas}
        for k in [k for k, g in self._groups.items() if g.ids & ids]:  # a replica is in one group at a time
            self._groups.pop(k).close()
        from torch.distributed import TCPStore

        host, world = _trainer_host(), len(replicas) + 1
        store = TCPStore(
            host, 0, world, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=self.timeout_s)
        )
        group = _Group(f"lhr-weights-{uuid.uuid4().hex[:12]}", list(replicas), store, ids=ids)
        t0 = time.perf_counter()
        joins = [
            r.receive_weights(
                self.name,
                CollectiveJoin(host, store.port, i + 1, world, self.backend, group.name, self.timeout_s),
            )
            for i, r in enumerate(replicas)
        ]
        made = asyncio.to_thread(backend_group, store, group.name, 0, world, self.backend, self.timeout_s)
        pg, *joined = await asyncio.gather(made, *joins, return_exceptions=True)
        failures = {
            r.replica_id: f"could not join the {self.backend} broadcast group: {res!r}"
            for r, res in zip(replicas, joined)
            if isinstance(res, BaseException)
        }
        if isinstance(pg, BaseException) or failures:
            if not isinstance(pg, BaseException):
                _shutdown(pg)
            raise WeightSyncError(failures or {r.replica_id: f"group setup failed: {pg!r}" for r in replicas})
        group.pg = pg
        self._groups[key] = group
        logger.info(
            "weight transport collective: %s group %s of %d engines on %s:%d in %.2f s",
            self.backend,
            group.name,
            len(replicas),
            host,
            store.port,
            time.perf_counter() - t0,
        )
        return group

    async def push(
        self,
        named_tensors: NamedTensors,
        replicas: Sequence[WeightReceiver],
        version: int,
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        staged: bool = False,
        on_commit: Callable[[], Awaitable[Any]] | None = None,
        keep: bool = False,
        expected_checksum: str | None = None,
    ) -> SyncReport:
        """Broadcast layer-aligned buckets to every replica at once; each engine loads bucket k while the trainer
        packs bucket k+1. ``staged``: every bucket is received while the engines keep serving, then each pauses
        once to load them (:class:`~.base.CollectiveCommit`)."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        named = [(n, t.detach()) for n, t in items]
        host = [(n, t.cpu()) for n, t in named]  # what the trainer's checksum reads
        buckets = plan_buckets(named, bucket_bytes)
        layouts = [BucketLayout.of(b) for b in buckets]
        nbytes = sum(x.nbytes for x in layouts)
        if not replicas:
            return await verified_sessions(
                self.name, host, [], version, None, nbytes, len(buckets), checksum=expected_checksum
            )
        group = await self._group_for(replicas)
        device = self.device or torch.device("cpu")
        ready = [asyncio.Event() for _ in buckets]  # replica-side receive of bucket k was sent

        async def send() -> None:
            for bucket, ev in zip(buckets, ready):
                buf = await asyncio.to_thread(BucketLayout.pack, bucket, device)
                await ev.wait()
                await asyncio.to_thread(broadcast, group.pg, buf)

        async def receive_all(r: WeightReceiver, stage: bool) -> Any:
            for layout, ev in zip(layouts, ready):
                got = asyncio.ensure_future(r.receive_weights(self.name, CollectiveBucket(group.name, layout, stage)))
                ev.set()
                await got

        async def commit(r: WeightReceiver) -> Any:
            return await r.receive_weights(self.name, CollectiveCommit(group.name))

        sender = asyncio.ensure_future(send())
        try:
            if not staged:
                load = lambda r: receive_all(r, False)  # noqa: E731
                return await verified_sessions(
                    self.name, host, replicas, version, load, nbytes, len(buckets), keep, expected_checksum
                )
            staging = await asyncio.gather(*(receive_all(r, True) for r in replicas), return_exceptions=True)
            failed = {
                r.replica_id: f"staging failed: {e!r}" for r, e in zip(replicas, staging) if isinstance(e, Exception)
            }
            if failed:
                raise WeightSyncError(failed)
        except BaseException:
            self._groups.pop(tuple((r.replica_id, id(r)) for r in replicas), None)
            group.close()  # a half-done broadcast leaves the group unusable: the next push builds a new one
            sender.cancel()
            raise
        finally:
            with contextlib.suppress(BaseException):
                await sender
        if on_commit is not None:
            await on_commit()
        return await verified_sessions(
            self.name, host, replicas, version, commit, nbytes, len(buckets), keep, expected_checksum
        )

    def close(self) -> None:
        """Shut every broadcast group down (the engines drop theirs when they join a new one or stop)."""
        for g in self._groups.values():
            g.close()
        self._groups.clear()


class CollectiveReceiver(EngineReceiver):
    """Engine side: joins the trainer's group, receives each bucket into a fresh buffer, returns views of it."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.pg: Any = None
        self.device = torch.device("cpu")
        self.staged: list[tuple[BucketLayout, torch.Tensor]] = []

    def _recv(self, layout: BucketLayout) -> torch.Tensor:
        buf = torch.empty(layout.nbytes, dtype=torch.uint8, device=self.device)
        broadcast(self.pg, buf)
        return buf

    def receive(self, request: Any) -> Items:
        if isinstance(request, CollectiveJoin):
            self.close()
            from torch.distributed import TCPStore

            timeout = datetime.timedelta(seconds=request.timeout_s)
            store = TCPStore(request.host, request.port, request.world_size, is_master=False, timeout=timeout)
            if request.backend == "nccl":
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.pg = backend_group(
                store, request.group, request.rank, request.world_size, request.backend, request.timeout_s
            )
            self.name = request.group
            return []
        if getattr(request, "group", None) != self.name or self.pg is None:
            raise RuntimeError(f"collective transport: not a member of group {getattr(request, 'group', None)!r}")
        if isinstance(request, CollectiveBucket):
            buf = self._recv(request.layout)
            if request.stage:
                self.staged.append((request.layout, buf))
                return []
            return request.layout.views(buf)
        if isinstance(request, CollectiveCommit):
            staged, self.staged = self.staged, []
            if not staged:
                raise RuntimeError("collective transport: commit with nothing staged")
            return [item for layout, buf in staged for item in layout.views(buf)]
        raise TypeError(f"collective transport: unexpected request {type(request).__name__}")

    def close(self) -> None:
        if self.pg is not None:
            _shutdown(self.pg)
        self.pg, self.name, self.staged = None, None, []
