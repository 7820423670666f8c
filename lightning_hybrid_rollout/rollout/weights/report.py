"""What a weight push did (:class:`SyncReport`) and the verdict on the replicas' answers (:func:`check_replies`).

Shared by every transport: each replica answers a push with the checksum its engine computed over what it loaded;
the trainer's checksum decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_hybrid_rollout.errors import WeightSyncError

if TYPE_CHECKING:
    import torch

    from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver

Reply = tuple[str, float]
"""One replica's answer: ``(engine-side checksum, seconds from the start of its part of the push)``."""


@dataclass
class SyncReport:
    """What one weight push did.

    Args:
        version: Weight version pushed.
        bytes: Serialized bytes of the full weights (one copy; every replica received all of them).
        num_replicas: Replicas the weights went to.
        num_buckets: Buckets the weights were cut into.
        seconds: Wall time of the whole push (trainer-side packing + ``ray.put`` + all replicas loaded and verified).
        prepare_seconds: Trainer-side time writing the buckets into the node staging file and/or ``ray.put`` (bucket
            after bucket, overlapping the replicas' loading of the previous buckets; the trainer's hashing also runs
            concurrently).
        per_replica_seconds: ``replica_id -> seconds`` from the start of the fan-out to that replica's verified load.
        checksum: The trainer-side :func:`~.format.checksum_state`.
        replica_checksums: ``replica_id -> checksum`` as reported by each replica.
        transport: The transport(s) that ran: ``"node_shm"``, ``"ray_object_store"``, ``"collective"``,
            ``"cuda_ipc"`` (several joined by ``+`` when replicas took different ones).
        per_replica_transport: ``replica_id -> `` the transport that replica took.
        per_replica_commit_seconds: Staged pushes: ``replica_id -> seconds`` the replica stopped generating (from
            ``begin_weight_update`` to its verified load).
        encoding: What the replicas received (``rollout.weight_encoding``): ``"full"``, ``"delta"``, or both joined
            by ``+`` (:mod:`.delta`); ``bytes`` is then the sum of every payload made once.
        per_replica_encoding: ``replica_id -> `` the encoding that replica's verified weights came in (delta runs).
        full_bytes: Delta runs: the bytes a full sync in the engine's dtype moves (0: not a delta run).
        changed_fraction: Delta runs: the share of elements that changed since the previous version, in the engine's
            dtype (None: the first version, or not a delta run).
        encode_seconds: Delta runs: trainer-side seconds casting and diffing this version (0 when an earlier push
            of the same version already did).
        repaired: Replicas whose delta failed (checksum, base) and that a full sync in the same push repaired.
    """

    version: int
    bytes: int
    num_replicas: int
    num_buckets: int
    seconds: float
    prepare_seconds: float
    per_replica_seconds: dict[str, float] = field(default_factory=dict)
    checksum: str = ""
    replica_checksums: dict[str, str] = field(default_factory=dict)
    transport: str = "ray_object_store"
    per_replica_transport: dict[str, str] = field(default_factory=dict)
    per_replica_commit_seconds: dict[str, float] = field(default_factory=dict)
    encoding: str = "full"
    per_replica_encoding: dict[str, str] = field(default_factory=dict)
    full_bytes: int = 0
    changed_fraction: float | None = None
    encode_seconds: float = 0.0
    repaired: list[str] = field(default_factory=list)

    def take_replicas_of(self, other: SyncReport) -> None:
        """Add ``other``'s per-replica entries (seconds, checksums, transport, commit, encoding, repaired) to
        these: the one merge of two pushes' replicas, whatever their totals mean."""
        self.per_replica_seconds.update(other.per_replica_seconds)
        self.replica_checksums.update(other.replica_checksums)
        self.per_replica_transport.update(other.per_replica_transport)
        self.per_replica_commit_seconds.update(other.per_replica_commit_seconds)
        self.per_replica_encoding.update(other.per_replica_encoding)
        self.repaired += [x for x in other.repaired if x not in self.repaired]

    @property
    def gb_per_s(self) -> float:
        """Delivered bandwidth: ``bytes * num_replicas / seconds`` (GB = 1e9 bytes)."""
        return self.bytes * self.num_replicas / max(self.seconds, 1e-9) / 1e9

    def as_dict(self) -> dict[str, Any]:
        """Flat dict for logging."""
        return {
            "weight_sync/version": self.version,
            "weight_sync/bytes": self.bytes,
            "weight_sync/replicas": self.num_replicas,
            "weight_sync/seconds": self.seconds,
            "weight_sync/prepare_seconds": self.prepare_seconds,
            "weight_sync/gb_per_s": self.gb_per_s,
        }


def check_replies(
    report: SyncReport,
    replicas: Sequence[WeightReceiver],
    replies: Sequence[Reply | BaseException],
    failures: dict[str, str] | None = None,
) -> None:
    """Record each replica's reply in ``report`` and judge it against ``report.checksum``.

    Args:
        report: The push's report (``per_replica_seconds`` and ``replica_checksums`` are filled in).
        replicas: The replicas, in the order of ``replies``.
        replies: Each replica's :data:`Reply`, or the exception its load raised.
        failures: Failures found before the replies (``replica_id -> why``); added to.

    Raises:
        WeightSyncError: A replica failed to load, or its checksum differs from the trainer's.
    """
    failures = {} if failures is None else failures
    for r, res in zip(replicas, replies):
        if isinstance(res, BaseException):
            failures[r.replica_id] = f"load failed: {type(res).__name__}: {res}"
            continue
        got, secs = res
        report.per_replica_seconds[r.replica_id] = secs
        report.replica_checksums[r.replica_id] = got
        if got != report.checksum:
            failures[r.replica_id] = f"checksum mismatch: expected {report.checksum}, got {got}"
    if failures:
        raise WeightSyncError(failures, report)


async def verified_sessions(
    transport: str,
    named: list[tuple[str, torch.Tensor]],
    replicas: Sequence[WeightReceiver],
    version: int,
    load: Callable[[WeightReceiver], Awaitable[object]] | None,
    nbytes: int,
    num_buckets: int,
    keep: bool = False,
    checksum: str | None = None,
) -> SyncReport:
    """One update session per replica around ``load`` (``begin_weight_update`` → ``load`` →
    ``finish_weight_update``), the trainer hashing ``named`` meanwhile (unless the caller knows the ``checksum``);
    judged by :func:`check_replies`."""
    from lightning_hybrid_rollout.rollout.weights.format import checksum_state

    t0 = time.perf_counter()
    if checksum is None:
        checksum_job = asyncio.ensure_future(asyncio.to_thread(checksum_state, named))
    else:
        checksum_job = asyncio.ensure_future(asyncio.sleep(0, checksum))

    async def one(r: WeightReceiver) -> Reply:
        s = time.perf_counter()
        await r.begin_weight_update(version, 0, keep)
        try:
            assert load is not None
            await load(r)
        except BaseException:
            with contextlib.suppress(Exception):
                await r.abort_weight_update()
            raise
        return await r.finish_weight_update(), time.perf_counter() - s

    replies = await asyncio.gather(*(one(r) for r in replicas), return_exceptions=True)
    report = SyncReport(version, nbytes, len(replicas), num_buckets, 0.0, 0.0, checksum=await checksum_job)
    report.seconds = time.perf_counter() - t0
    report.transport = transport if replicas else "none"
    report.per_replica_transport = {r.replica_id: transport for r in replicas}
    check_replies(report, replicas, replies)
    return report
