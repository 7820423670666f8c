"""Trainer → rollout-engine weight sync: bucketed full weights, verified by checksum on every replica.

How weights travel (CPU / any multi-node Ray cluster, the path tested here):

1. The trainer's ``(name, tensor)`` pairs are cut into layer-aligned buckets of about ``bucket_bytes`` (a decoder
   layer is never split across buckets, so an engine can process each bucket's layers as soon as it arrives).
2. Each bucket is a :class:`WeightBucket`: a safetensors header plus the tensors' raw bytes as zero-copy numpy views.
   Replicas on the trainer's node (every hybrid replica; standalone ones placed there): the trainer writes the
   bucket **once** into a node-local shared-memory file (:class:`NodeStaging`, reused across pushes) and every such
   replica's vLLM worker loads zero-copy tensor views straight from it (``attach_node_staging`` once, then
   ``load_weight_from_node_staging`` per bucket). Replicas on other nodes: the bucket is ``ray.put`` once; each
   replica actor copies it into its engine's own shared-memory staging file and the worker loads views from that
   (``load_weight_bucket``). Buckets stream: while the trainer writes bucket k+1 the replicas already load bucket k
   (each replica: ``begin_weight_update`` → one load per bucket → ``finish_weight_update``).
3. The worker feeds the views to vLLM's layer-wise in-place reload (see
   :mod:`lightning_hybrid_rollout.rollout.vllm_engine`).
4. Verification: the vLLM worker hashes the tensors it actually received and fed to ``load_weights`` (same
   :func:`checksum_state` as the trainer), checks that every model parameter was loaded, and reads back every
   parameter vLLM keeps materialized; the driver compares each replica's checksum with the trainer's and raises
   :class:`WeightSyncError` naming the replica on any mismatch.

GPU paths (written, not testable on the CPU machines this project is developed on; tests marked ``gpu``):
:func:`cuda_ipc_bucket` hands colocated (hybrid) engines CUDA IPC handles of the trainer's tensors, and
:class:`NcclWeightBroadcaster` broadcasts buckets to standalone engines over NCCL.

The checksum (:func:`checksum_state`): per tensor, xxh3-128 (fallback: blake2b-128) over ``name``, dtype, shape and
the raw bytes; the state checksum hashes the sorted ``name:digest`` lines. It is a strong non-cryptographic hash:
it catches corruption, truncation, stale or missing tensors, reordering and renames, not a deliberate attacker.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import mmap
import os
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_hybrid_rollout.errors import WeightSyncError as WeightSyncError  # re-exported
from lightning_hybrid_rollout.rollout.run_guard import default_staging_dir
from lightning_hybrid_rollout.rollout.weights.format import (  # the wire format, re-exported for old import paths
    DEFAULT_BUCKET_BYTES as DEFAULT_BUCKET_BYTES,
)
from lightning_hybrid_rollout.rollout.weights.format import HASH_ALGO as HASH_ALGO
from lightning_hybrid_rollout.rollout.weights.format import SAFETENSORS_DTYPES, WeightBucket, checksum_state
from lightning_hybrid_rollout.rollout.weights.format import combine_digests as combine_digests
from lightning_hybrid_rollout.rollout.weights.format import make_bucket as make_bucket
from lightning_hybrid_rollout.rollout.weights.format import parse_safetensors as parse_safetensors
from lightning_hybrid_rollout.rollout.weights.format import plan_buckets as plan_buckets
from lightning_hybrid_rollout.rollout.weights.format import tensor_digest as tensor_digest

if TYPE_CHECKING:
    from lightning_hybrid_rollout.rollout.replica import ReplicaHandle

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# node-local shared memory (replicas on the trainer's node)
# ---------------------------------------------------------------------------------------------------------------
_NODE_STAGING_PREFIX = "node-weights-"


class NodeStaging:
    """A shared-memory file on the trainer's node that a push writes its buckets into **once**.

    Every replica on the same node maps it (``attach_node_staging``) and its vLLM worker loads zero-copy views
    straight from it, so a bucket costs one trainer-side copy however many local replicas there are, and no copy on
    the replica side (the Ray path costs a ``ray.put`` copy plus one copy per replica into its engine's staging
    file). The file is reused by later pushes (its pages stay resident: no page faults after the first push) and is
    removed by :meth:`close`, at interpreter exit, or with the run's staging directory (by the run's watchdog or the
    next run's sweep, :mod:`.run_guard`) if this process died. The file is created 0600.

    Args:
        directory: Where to create it (default: the run's private staging directory,
            :func:`~.run_guard.default_staging_dir`).
    """

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or str(default_staging_dir())
        self.path: str | None = None
        self.size = 0
        self.inode = 0
        self._mm: mmap.mmap | None = None
        self._finalizer: weakref.finalize | None = None

    def ensure(self, nbytes: int) -> None:
        """Make the file at least ``nbytes`` long (a larger one replaces it: replicas re-attach by path)."""
        if self._mm is not None and self.size >= nbytes:
            return
        self.close()
        size = max(int(nbytes), 1 << 20)
        path = os.path.join(self.directory, f"{_NODE_STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
            self.inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self.path, self.size = path, size
        self._finalizer = weakref.finalize(self, _unlink_quietly, path)
        np.frombuffer(self._mm, dtype=np.uint8)[:] = 0  # fault the pages in now, not during the first push

    def write(self, bucket: WeightBucket, offset: int) -> int:
        """Copy ``bucket`` into the file at ``offset``; returns the bytes written."""
        if self._mm is None or offset + bucket.nbytes > self.size:
            raise ValueError(f"node staging: bucket of {bucket.nbytes} bytes at {offset} does not fit ({self.size})")
        return bucket.write_into(np.frombuffer(self._mm, dtype=np.uint8), offset)

    def view(self) -> np.ndarray:
        """The file's bytes (tests use it to tamper with what the replicas will read)."""
        if self._mm is None:
            raise ValueError("node staging is not allocated")
        return np.frombuffer(self._mm, dtype=np.uint8)

    def close(self) -> None:
        """Unlink and unmap (replicas keep their own mappings until they attach a newer file)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        if self._mm is not None:
            with contextlib.suppress(BufferError):
                self._mm.close()
        self._mm, self.path, self.size, self.inode = None, None, 0, 0


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


_FREE_NODE_STAGINGS: list[NodeStaging] = []


def _acquire_node_staging() -> NodeStaging:
    """A staging file no running push uses (concurrent pushes, e.g. standalone and hybrid, get separate files)."""
    return _FREE_NODE_STAGINGS.pop() if _FREE_NODE_STAGINGS else NodeStaging()


def _release_node_staging(staging: NodeStaging) -> None:
    _FREE_NODE_STAGINGS.append(staging)


def release_node_stagings() -> None:
    """Free the node staging files kept for later pushes (call when the run ends; also runs at exit)."""
    while _FREE_NODE_STAGINGS:
        _FREE_NODE_STAGINGS.pop().close()


atexit.register(release_node_stagings)


def _driver_node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # pragma: no cover - Ray missing or not connected
        return ""


# ---------------------------------------------------------------------------------------------------------------
# the push
# ---------------------------------------------------------------------------------------------------------------
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
        checksum: The trainer-side :func:`checksum_state`.
        replica_checksums: ``replica_id -> checksum`` as reported by each replica.
        transport: ``"node_shm"``, ``"ray_object_store"`` (both joined by ``+`` when mixed), ``"cuda_ipc"`` or
            ``"nccl"``.
        per_replica_transport: ``replica_id -> "node_shm" | "ray_object_store"`` (CPU path).
        per_replica_commit_seconds: Staged pushes: ``replica_id -> seconds`` the replica stopped generating (from
            ``begin_weight_update`` to its verified load).
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


#: ``hook(replica_id, bucket) -> bucket``: lets a test tamper with what one replica receives.
BucketHook = Callable[[str, WeightBucket], WeightBucket]


def _to_cpu_items(named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> list:
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()
    for name, t in items:
        if name in seen:
            raise ValueError(f"push_weights: duplicate tensor name {name!r}")
        seen.add(name)
        t = t.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        out.append((name, t.contiguous()))
    return out


async def push_weights_async(
    named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    replicas: Sequence[ReplicaHandle],
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    bucket_hook: BucketHook | None = None,
    expected_checksum: str | None = None,
    transport: str = "auto",
    staging_hook: Callable[[NodeStaging, int, int, int], None] | None = None,
    staged: bool = False,
    on_commit: Callable[[], Awaitable[Any]] | None = None,
) -> SyncReport:
    """Push full weights to replicas and verify every replica's checksum.

    Replicas on the trainer's node load from one node-local shared-memory file the trainer writes each bucket into
    once (:class:`NodeStaging`); replicas on other nodes get the buckets through Ray's object store (``ray.put``
    once per bucket, a zero-copy view per replica on the same node as the object). Either way buckets stream: the
    replicas load bucket k while the trainer writes bucket k+1.

    Args:
        named_tensors: The trainer's full (unsharded) weights with HF checkpoint names.
        replicas: Driver-side handles of the replicas to update (an empty list only computes the checksum).
        version: The weight version the replicas will report after loading.
        bucket_bytes: Target bucket size.
        bucket_hook: Test hook: ``hook(replica_id, bucket) -> bucket``; a bucket it changes is ``ray.put`` separately
            for that replica (how tests inject corruption; such a replica always takes the Ray path).
        expected_checksum: Skip hashing on the trainer when the caller already knows the checksum.
        transport: ``"auto"`` (node-local shared memory for replicas on this node, Ray for the others), ``"ray"``
            (Ray's object store for every replica) or ``"node_shm"`` (shared memory; a replica that cannot map the
            file fails the push instead of falling back).
        staging_hook: Test hook: ``hook(staging, bucket_index, offset, nbytes)`` runs after the trainer wrote a
            bucket into the node staging file, before the replicas read it.
        staged: Two phases instead of streaming. **Stage**, while the replicas keep serving: every bucket goes to
            the replica side (the node staging file; Ray-path replicas copy theirs into their engine's staging
            file, ``stage_weight_bucket``). **Commit**, once every replica holds every bucket: per replica
            ``begin_weight_update`` (the pause: in-flight requests are aborted and continue from their prefix under
            the new weights), one load call for all staged buckets, ``finish_weight_update`` with the usual checks.
            Generation stops only for the commit (``SyncReport.per_replica_commit_seconds``).
        on_commit: Awaited once, between the two phases of a staged push (e.g. to mark the replicas as syncing).

    Returns:
        A :class:`SyncReport` (``per_replica_transport`` says which path each replica took).

    Raises:
        WeightSyncError: At least one replica failed to load or reported a checksum different from the trainer's.
        ValueError: Unknown ``transport``.
    """
    import ray

    if transport not in ("auto", "ray", "node_shm"):
        raise ValueError(f"push_weights: transport must be 'auto', 'ray' or 'node_shm', got {transport!r}")
    t0 = time.perf_counter()
    items = _to_cpu_items(named_tensors)
    # the trainer-side checksum is only needed to judge the replicas' answers: hash while they load
    checksum_job = (
        asyncio.ensure_future(asyncio.to_thread(checksum_state, items)) if expected_checksum is None else None
    )
    plans = plan_buckets(items, bucket_bytes)
    buckets = [make_bucket(b, index=i, metadata={"version": str(version)}) for i, b in enumerate(plans)]
    offsets = [0]
    for b in buckets:
        offsets.append(offsets[-1] + b.nbytes)
    total = offsets[-1]
    # what each replica gets (the test hook may swap in a tampered bucket for one replica)
    per_replica = {
        r.replica_id: [bucket_hook(r.replica_id, b) if bucket_hook else b for b in buckets] for r in replicas
    }
    failures: dict[str, str] = {}
    staging: NodeStaging | None = None
    node_local: set[str] = set()
    if transport != "ray" and replicas:
        here = _driver_node_id()
        candidates = [
            r
            for r in replicas
            if all(x is y for x, y in zip(per_replica[r.replica_id], buckets))
            and (transport == "node_shm" or (here and r.info.get("node_id") == here))
        ]
        if candidates:
            staging = _acquire_node_staging()
            staging.ensure(total)
            attached = await asyncio.gather(
                *(r.call("attach_node_staging", staging.path, staging.size, staging.inode) for r in candidates),
                return_exceptions=True,
            )
            for r, ok in zip(candidates, attached):
                if ok is True:
                    node_local.add(r.replica_id)
                elif transport == "node_shm":
                    failures[r.replica_id] = (
                        f"cannot map the trainer's node staging file {staging.path} ({ok!r}); is the replica on "
                        f"another node? use transport='auto'"
                    )
    via_ray = [r.replica_id for r in replicas if r.replica_id not in node_local and r.replica_id not in failures]
    loop = asyncio.get_running_loop()
    refs = {rid: [loop.create_future() for _ in buckets] for rid in per_replica}
    put_seconds = 0.0

    async def producer() -> None:
        """Write / ``ray.put`` bucket after bucket while the replicas load the previous ones."""
        nonlocal put_seconds
        t = time.perf_counter()
        try:
            for i, b in enumerate(buckets):
                if node_local:
                    assert staging is not None
                    await asyncio.to_thread(staging.write, b, offsets[i])
                    if staging_hook is not None:
                        staging_hook(staging, i, offsets[i], b.nbytes)
                    for rid in node_local:
                        refs[rid][i].set_result((offsets[i], b.nbytes))
                if via_ray:
                    shared = await asyncio.to_thread(ray.put, b)
                    for rid in via_ray:
                        lst = per_replica[rid]
                        own = shared if lst[i] is b else await asyncio.to_thread(ray.put, lst[i])
                        refs[rid][i].set_result(own)
        except BaseException as e:
            for futs in refs.values():
                for f in futs:
                    if not f.done():
                        f.set_exception(RuntimeError(f"trainer-side bucket write / ray.put failed: {e!r}"))
            raise
        finally:
            put_seconds = time.perf_counter() - t

    targets = [r for r in replicas if r.replica_id not in failures]
    staging_left = len(targets)
    all_staged = asyncio.Event()
    commit_seconds: dict[str, float] = {}

    async def stage_done() -> None:
        nonlocal staging_left
        staging_left -= 1
        if staging_left == 0:
            try:
                if on_commit is not None:
                    await on_commit()
            finally:
                all_staged.set()

    async def one_staged(r: ReplicaHandle) -> tuple[str, float]:
        s = time.perf_counter()
        rid = r.replica_id
        local = rid in node_local
        mine = per_replica[rid]
        spans: list[tuple[int, int]] = []
        try:  # stage: the replica keeps serving meanwhile
            if local:
                spans = [await fut for fut in refs[rid]]
            else:
                total_r, off = sum(b.nbytes for b in mine), 0
                for fut, b in zip(refs[rid], mine):
                    await r.call("stage_weight_bucket", await fut, off, total_r)
                    spans.append((off, b.nbytes))
                    off += b.nbytes
        finally:
            await stage_done()
        await all_staged.wait()
        c = time.perf_counter()  # commit: the only pause
        await r.call("begin_weight_update", version, 0)
        try:
            await r.call("load_weight_from_node_staging" if local else "load_weight_from_staging", spans)
        except BaseException:
            with contextlib.suppress(Exception):
                await r.call("abort_weight_update")
            raise
        got = await r.call("finish_weight_update")
        commit_seconds[rid] = time.perf_counter() - c
        return got, time.perf_counter() - s

    async def one(r: ReplicaHandle) -> tuple[str, float]:
        if staged:
            return await one_staged(r)
        s = time.perf_counter()
        local = r.replica_id in node_local
        mine = per_replica[r.replica_id]
        await r.call("begin_weight_update", version, 0 if local else sum(b.nbytes for b in mine))
        try:
            futs = refs[r.replica_id]
            i = 0
            while i < len(futs):
                got = await futs[i]
                i += 1
                if local:  # every bucket already written by now goes in the same call (fewer round trips)
                    spans = [got]
                    while i < len(futs) and futs[i].done() and futs[i].exception() is None:
                        spans.append(futs[i].result())
                        i += 1
                    await r.call("load_weight_from_node_staging", spans)
                else:
                    await r.call("load_weight_bucket", got)  # a top-level ref: Ray hands a zero-copy view
        except BaseException:
            with contextlib.suppress(Exception):
                await r.call("abort_weight_update")
            raise
        got = await r.call("finish_weight_update")
        return got, time.perf_counter() - s

    try:
        producing = asyncio.ensure_future(producer()) if targets else None
        results = await asyncio.gather(*(one(r) for r in targets), return_exceptions=True)
        if producing is not None:
            with contextlib.suppress(Exception):  # a failed write already failed every replica's load (below)
                await producing
    finally:
        if staging is not None:
            _release_node_staging(staging)
    refs.clear()
    prepare = put_seconds
    checksum = expected_checksum if checksum_job is None else await checksum_job
    kinds = {"node_shm" if r.replica_id in node_local else "ray_object_store" for r in targets}
    report = SyncReport(
        version=version,
        bytes=total,
        num_replicas=len(replicas),
        num_buckets=len(buckets),
        seconds=time.perf_counter() - t0,
        prepare_seconds=prepare,
        checksum=checksum,
        transport="+".join(sorted(kinds)) or "none",
    )
    report.per_replica_commit_seconds.update(commit_seconds)
    for r, res in zip(targets, results):
        report.per_replica_transport[r.replica_id] = "node_shm" if r.replica_id in node_local else "ray_object_store"
        if isinstance(res, BaseException):
            failures[r.replica_id] = f"load failed: {type(res).__name__}: {res}"
            continue
        got, secs = res
        report.per_replica_seconds[r.replica_id] = secs
        report.replica_checksums[r.replica_id] = got
        if got != checksum:
            failures[r.replica_id] = f"checksum mismatch: expected {checksum}, got {got}"
    if failures:
        raise WeightSyncError(failures, report)
    logger.info(
        "weight sync v%d: %.1f MB x %d replicas in %.3f s (%.2f GB/s; %s; trainer-side write %.3f s)",
        version,
        total / 1e6,
        len(replicas),
        report.seconds,
        report.gb_per_s,
        report.transport,
        prepare,
    )
    return report


def push_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    replicas: Sequence[ReplicaHandle],
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    loop: asyncio.AbstractEventLoop | None = None,
    **kwargs: Any,
) -> SyncReport:
    """Blocking wrapper of :func:`push_weights_async` (for Lightning hooks and scripts).

    Args:
        named_tensors: See :func:`push_weights_async`.
        replicas: See :func:`push_weights_async`.
        version: See :func:`push_weights_async`.
        bucket_bytes: See :func:`push_weights_async`.
        loop: An event loop running in another thread (e.g. the rollouter's) to run the push on; without it the push
            runs in a fresh loop, which is only possible from a thread with no running loop.
        **kwargs: Passed to :func:`push_weights_async`.
    """
    coro = push_weights_async(named_tensors, replicas, version, bucket_bytes=bucket_bytes, **kwargs)
    if loop is not None:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError(
        "push_weights() was called from inside a running event loop; await push_weights_async() instead, or pass "
        "loop= to run it on a loop in another thread"
    )


class WeightSync:
    """Stateful front of :func:`push_weights_async`: remembers the replicas, bucket size and last report.

    Args:
        replicas: Default target replicas.
        bucket_bytes: Target bucket size.
    """

    def __init__(self, replicas: Sequence[ReplicaHandle] = (), bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.replicas = list(replicas)
        self.bucket_bytes = bucket_bytes
        self.last_report: SyncReport | None = None

    async def push_async(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
        version: int,
        replicas: Sequence[ReplicaHandle] | None = None,
        **kwargs: Any,
    ) -> SyncReport:
        """Push to ``replicas`` (default: the configured ones); see :func:`push_weights_async`."""
        targets = self.replicas if replicas is None else list(replicas)
        report = await push_weights_async(named_tensors, targets, version, bucket_bytes=self.bucket_bytes, **kwargs)
        self.last_report = report
        return report

    def push(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
        version: int,
        replicas: Sequence[ReplicaHandle] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        **kwargs: Any,
    ) -> SyncReport:
        """Blocking :meth:`push_async`; see :func:`push_weights` for ``loop``."""
        targets = self.replicas if replicas is None else list(replicas)
        report = push_weights(named_tensors, targets, version, bucket_bytes=self.bucket_bytes, loop=loop, **kwargs)
        self.last_report = report
        return report


# ---------------------------------------------------------------------------------------------------------------
# GPU transports (untested on CPU machines; see tests marked gpu)
# ---------------------------------------------------------------------------------------------------------------
def cuda_ipc_bucket(items: Sequence[tuple[str, torch.Tensor]]) -> bytes:
    """Serialize CUDA IPC handles of named CUDA tensors for a colocated (same-GPU) engine.

    The receiving vLLM worker rebuilds the tensors with ``torch.multiprocessing.reductions`` (zero copy, same
    device memory) and loads them; the trainer must keep the tensors alive until the replica acknowledged.
    Returns pickled ``[(name, rebuild_fn, args)]`` (bytes travel through Ray and vLLM's RPC unchanged).
    """
    import pickle

    from torch.multiprocessing.reductions import reduce_tensor

    if not torch.cuda.is_available():
        raise RuntimeError("cuda_ipc_bucket needs CUDA tensors on a CUDA machine")
    out = []
    for name, t in items:
        if not t.is_cuda:
            raise ValueError(f"cuda_ipc_bucket: tensor {name!r} is on {t.device}, expected a CUDA device")
        fn, args = reduce_tensor(t.detach().contiguous())
        out.append((name, fn, args))
    return pickle.dumps(out)


class NcclWeightBroadcaster:
    """Trainer side of an NCCL broadcast group with the standalone engines' workers (rank 0 = trainer).

    Uses vLLM's ``StatelessProcessGroup`` + ``PyNcclCommunicator`` (the pattern of vLLM's RLHF examples). Create it
    while the engines join with ``ReplicaHandle.call("init_nccl_group", host, port, rank, world_size)`` (ranks 1..N):
    the rendezvous blocks until all members arrived. Untested here (no GPU); the CPU path is
    :func:`push_weights_async`.

    Args:
        host: Address of the rendezvous store (the trainer's node).
        port: A free port on it.
        world_size: 1 + number of engine workers joining.
        device: The trainer's CUDA device.
    """

    def __init__(self, host: str, port: int, world_size: int, device: int | torch.device = 0) -> None:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        self.device = torch.device("cuda", device) if isinstance(device, int) else device
        self.pg = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world_size)
        self.comm = PyNcclCommunicator(self.pg, device=self.device)

    @staticmethod
    def describe(items: Sequence[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Layout of one bucket as a flat byte buffer (what the engines need to slice what they receive)."""
        meta = []
        pos = 0
        for name, t in items:
            if t.dtype not in SAFETENSORS_DTYPES:
                raise TypeError(f"weight {name!r}: dtype {t.dtype} cannot be broadcast")
            meta.append({"name": name, "dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape), "offset": pos})
            pos += t.numel() * t.element_size()
        return {"nbytes": pos, "tensors": meta}

    def broadcast(self, items: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Broadcast one bucket (blocks until every engine received it)."""
        flat = [t.detach().to(self.device).contiguous().reshape(-1).view(torch.uint8) for _, t in items]
        buf = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=self.device)
        stream = torch.cuda.current_stream(self.device)
        self.comm.broadcast(buf, src=0, stream=stream)
        stream.synchronize()


async def _verified_gpu_push(
    named: list[tuple[str, torch.Tensor]],
    replicas: Sequence[ReplicaHandle],
    version: int,
    load: Callable[[ReplicaHandle], Any],
    transport: str,
    nbytes: int,
    num_buckets: int,
) -> SyncReport:
    t0 = time.perf_counter()
    checksum_job = asyncio.ensure_future(asyncio.to_thread(checksum_state, named))

    async def one(r: ReplicaHandle) -> tuple[str, float]:
        s = time.perf_counter()
        await r.call("begin_weight_update", version, 0)
        await load(r)
        return await r.call("finish_weight_update"), time.perf_counter() - s

    results = await asyncio.gather(*(one(r) for r in replicas), return_exceptions=True)
    checksum = await checksum_job
    report = SyncReport(version, nbytes, len(replicas), num_buckets, time.perf_counter() - t0, 0.0, checksum=checksum)
    report.transport = transport
    failures: dict[str, str] = {}
    for r, res in zip(replicas, results):
        if isinstance(res, BaseException):
            failures[r.replica_id] = f"load failed: {type(res).__name__}: {res}"
            continue
        got, secs = res
        report.per_replica_seconds[r.replica_id] = secs
        report.replica_checksums[r.replica_id] = got
        if got != checksum:
            failures[r.replica_id] = f"checksum mismatch: expected {checksum}, got {got}"
    if failures:
        raise WeightSyncError(failures, report)
    return report


async def push_weights_cuda_ipc_async(
    named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    replicas: Sequence[ReplicaHandle],
    version: int,
) -> SyncReport:
    """GPU, hybrid replicas on the trainer's own GPU: hand them CUDA IPC handles of the trainer's tensors.

    The tensors must be full (gathered) CUDA tensors that stay alive until this returns. Verified like
    :func:`push_weights_async` (the engines hash what they rebuilt). Untested on CPU machines.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    named = [(n, t.detach().contiguous()) for n, t in items]
    blob = cuda_ipc_bucket(named)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)

    async def load(r: ReplicaHandle) -> Any:
        return await r.call("load_weight_ipc", blob)

    return await _verified_gpu_push(named, replicas, version, load, "cuda_ipc", nbytes, 1)


async def push_weights_nccl_async(
    broadcaster: NcclWeightBroadcaster,
    named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    replicas: Sequence[ReplicaHandle],
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    staged: bool = False,
    on_commit: Callable[[], Awaitable[Any]] | None = None,
) -> SyncReport:
    """GPU, standalone replicas (any node): NCCL-broadcast layer-aligned buckets to every engine at once.

    ``replicas`` must be exactly the group's members, in rank order. With ``staged`` the engines receive every
    bucket into GPU buffers they keep (``stage_weight_nccl``, between decode steps: they keep serving), then, after
    ``on_commit``, each pauses once to load them (``load_weight_from_gpu_stage``); this costs one model's size of
    GPU memory per engine during the sync. Untested on CPU machines.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    named = [(n, t.detach()) for n, t in items]
    buckets = plan_buckets(named, bucket_bytes)
    metas = [NcclWeightBroadcaster.describe(b) for b in buckets]
    nbytes = sum(m["nbytes"] for m in metas)
    ready: list[asyncio.Event] = [asyncio.Event() for _ in buckets]
    receive = "stage_weight_nccl" if staged else "load_weight_nccl"

    async def recv_all(r: ReplicaHandle) -> Any:
        for meta, ev in zip(metas, ready):
            recv = asyncio.ensure_future(r.call(receive, meta))
            ev.set()
            await recv

    async def send() -> None:
        for bucket, ev in zip(buckets, ready):
            await ev.wait()
            await asyncio.to_thread(broadcaster.broadcast, bucket)

    sender = asyncio.ensure_future(send())
    host_copy = [(n, t.cpu()) for n, t in named]
    try:
        if not staged:
            return await _verified_gpu_push(host_copy, replicas, version, recv_all, "nccl", nbytes, len(buckets))
        await asyncio.gather(*(recv_all(r) for r in replicas))
    finally:
        await sender
    if on_commit is not None:
        await on_commit()

    async def commit(r: ReplicaHandle) -> Any:
        return await r.call("load_weight_from_gpu_stage")

    return await _verified_gpu_push(host_copy, replicas, version, commit, "nccl_staged", nbytes, len(buckets))
