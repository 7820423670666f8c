"""Trainer → rollout-engine weight push on the CPU paths: cut the weights into layer-aligned buckets, write them once
into node-local shared memory or ``ray.put`` them for other nodes, stream them (or stage them and commit), and
compare every replica's checksum with the trainer's (docs/rollout.md, "Weight transports").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.weights.format import (
    DEFAULT_BUCKET_BYTES,
    WeightBucket,
    checksum_state,
    combine_digests,
    make_bucket,
    plan_buckets,
)
from lightning_hybrid_rollout.rollout.weights.receiver import Span, WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import Reply, SyncReport, check_replies
from lightning_hybrid_rollout.rollout.weights.staging import SharedStaging, attached_stagings, node_stagings

logger = logging.getLogger(__name__)

NamedTensors = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
"""The trainer's full (unsharded) weights with HF checkpoint names: ``(name, tensor)`` pairs or a mapping."""


# ---------------------------------------------------------------------------------------------------------------
# the test seam
# ---------------------------------------------------------------------------------------------------------------
def _same_bucket(replica_id: str, bucket: WeightBucket) -> WeightBucket:
    return bucket


def _nothing(staging: SharedStaging, index: int, offset: int, nbytes: int) -> None:
    return None


@dataclass
class PushHooks:
    """Where tests reach inside :func:`push_weights_async` (the module's :data:`seam`; the defaults do nothing).

    Attributes:
        bucket_hook: ``bucket_hook(replica_id, bucket) -> bucket``: what one replica receives. A bucket it changes
            is ``ray.put`` separately for that replica, which then always takes the Ray path (how tests inject
            corruption).
        staging_hook: ``staging_hook(staging, bucket_index, offset, nbytes)``: runs after the trainer wrote a bucket
            into the node staging file, before any replica reads it (how tests tamper with the shared file, or
            watch the order of the writes).

    Example::

        with seam.installed(bucket_hook=lambda rid, b: b):
            ...  # pushes in this block call the hook
    """

    bucket_hook: Callable[[str, WeightBucket], WeightBucket] = _same_bucket
    staging_hook: Callable[[SharedStaging, int, int, int], None] = _nothing

    @contextlib.contextmanager
    def installed(self, **hooks: Callable[..., Any]) -> Iterator[PushHooks]:
        """Set some hooks for the duration of a ``with`` block, then restore the previous ones."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(hooks) - names)
        if unknown:
            raise TypeError(f"PushHooks has no hook(s) {unknown}; known: {sorted(names)}")
        before = {name: getattr(self, name) for name in hooks}
        for name, hook in hooks.items():
            setattr(self, name, hook)
        try:
            yield self
        finally:
            for name, hook in before.items():
                setattr(self, name, hook)


seam = PushHooks()
"""The process's push hooks: tests set them (``seam.installed(...)`` or ``monkeypatch.setattr(seam, ...)``)."""


# ---------------------------------------------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------------------------------------------
def _to_cpu_items(named_tensors: NamedTensors) -> list[tuple[str, torch.Tensor]]:
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


@dataclass
class BucketPlan:
    """A push's buckets and where each sits in a staging file (one after the other, from offset 0).

    Args:
        buckets: The buckets, in order (``bucket.index`` is the position).
        offsets: ``offsets[i]`` is where bucket ``i`` starts; the last entry is the total size.
    """

    buckets: list[WeightBucket]
    offsets: list[int]

    @classmethod
    def build(cls, items: Sequence[tuple[str, torch.Tensor]], bucket_bytes: int, version: int) -> BucketPlan:
        """Cut ``items`` into layer-aligned buckets (:func:`~.format.plan_buckets`) tagged with ``version``."""
        groups = plan_buckets(items, bucket_bytes)
        buckets = [make_bucket(b, index=i, metadata={"version": str(version)}) for i, b in enumerate(groups)]
        offsets = [0]
        for b in buckets:
            offsets.append(offsets[-1] + b.nbytes)
        return cls(buckets, offsets)

    @property
    def total(self) -> int:
        """Serialized bytes of every bucket."""
        return self.offsets[-1]


def driver_node_id() -> str:
    """This process's Ray node id ("" when Ray is not connected)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # pragma: no cover - Ray missing or not connected
        return ""


# ---------------------------------------------------------------------------------------------------------------
# one push in flight: paths, the trainer-side producer, each replica's stream or stage + commit
# ---------------------------------------------------------------------------------------------------------------
class _Push:
    """The state of one push: which path each replica takes, what reached it, the trainer-side producer."""

    def __init__(
        self,
        plan: BucketPlan,
        replicas: Sequence[WeightReceiver],
        version: int,
        transport: str,
        on_commit: Callable[[], Awaitable[Any]] | None,
        put: Callable[[Any], Any],
        keep: bool = False,
    ) -> None:
        self.keep = keep
        self.plan = plan
        self.replicas = replicas
        self.version = version
        self.transport = transport
        self.on_commit = on_commit
        self.put = put  # ray.put
        # what each replica gets (the seam may swap in a tampered bucket for one replica)
        self.per_replica = {r.replica_id: [seam.bucket_hook(r.replica_id, b) for b in plan.buckets] for r in replicas}
        self.failures: dict[str, str] = {}
        self.staging: SharedStaging | None = None
        self.node_local: set[str] = set()
        self.via_ray: list[str] = []
        #: ``replica_id -> one future per bucket``: a span of the node staging file, or a Ray object ref
        self.deliveries: dict[str, list[asyncio.Future[Any]]] = {}
        self.put_seconds = 0.0
        self.commit_seconds: dict[str, float] = {}
        self._staging_left = 0
        self._all_staged = asyncio.Event()
        #: the trainer-side digests, hashed while the buckets are written (``None``: not asked for)
        self.digests: dict[str, str] | None = None

    async def choose_paths(self) -> None:
        """Attach the node staging file on the replicas that share the trainer's node; the others take Ray."""
        replicas, transport, buckets = self.replicas, self.transport, self.plan.buckets
        if transport != "ray" and replicas:
            here = driver_node_id()
            candidates = [
                r
                for r in replicas
                if all(x is y for x, y in zip(self.per_replica[r.replica_id], buckets))
                and (transport == "node_shm" or (here and r.info.get("node_id") == here))
            ]
            if candidates:
                staging = self.staging = node_stagings.acquire()
                staging.ensure(self.plan.total)
                assert staging.path is not None
                which = (staging.path, staging.size, staging.inode)
                ask = []
                for r in candidates:
                    if attached_stagings.get(r) == which:
                        self.node_local.add(r.replica_id)
                    else:
                        ask.append(r)
                attached = await asyncio.gather(
                    *(r.attach_node_staging(staging.path, staging.size, staging.inode) for r in ask),
                    return_exceptions=True,
                )
                for r, ok in zip(ask, attached):
                    if ok is True:
                        self.node_local.add(r.replica_id)
                        attached_stagings.remember(r, which)
                    elif transport == "node_shm":
                        self.failures[r.replica_id] = (
                            f"cannot map the trainer's node staging file {staging.path} ({ok!r}); is the replica on "
                            f"another node? use transport='auto'"
                        )
        self.via_ray = [
            r.replica_id for r in replicas if r.replica_id not in self.node_local and r.replica_id not in self.failures
        ]
        loop = asyncio.get_running_loop()
        self.deliveries = {rid: [loop.create_future() for _ in buckets] for rid in self.per_replica}

    async def produce(self) -> None:
        """Write / ``ray.put`` bucket after bucket while the replicas load the previous ones."""
        plan, staging, t = self.plan, self.staging, time.perf_counter()
        try:
            for i, b in enumerate(plan.buckets):
                if self.node_local:
                    assert staging is not None
                    await asyncio.to_thread(staging.write, b, plan.offsets[i], self.digests)
                    seam.staging_hook(staging, i, plan.offsets[i], b.nbytes)
                    for rid in self.node_local:
                        self.deliveries[rid][i].set_result((plan.offsets[i], b.nbytes))
                if self.via_ray:
                    shared = await asyncio.to_thread(self.put, b)
                    for rid in self.via_ray:
                        mine = self.per_replica[rid][i]
                        own = shared if mine is b else await asyncio.to_thread(self.put, mine)
                        self.deliveries[rid][i].set_result(own)
        except BaseException as e:
            for futs in self.deliveries.values():
                for f in futs:
                    if not f.done():
                        f.set_exception(RuntimeError(f"trainer-side bucket write / ray.put failed: {e!r}"))
            raise
        finally:
            self.put_seconds = time.perf_counter() - t

    async def _begin(self, r: WeightReceiver, total_bytes: int) -> None:
        await r.begin_weight_update(self.version, total_bytes, self.keep)  # keep: frozen in place, not aborted

    async def stream(self, r: WeightReceiver) -> Reply:
        """One replica's streamed update: load each bucket as soon as it is written."""
        s = time.perf_counter()
        local = r.replica_id in self.node_local
        mine = self.per_replica[r.replica_id]
        await self._begin(r, 0 if local else sum(b.nbytes for b in mine))
        try:
            futs = self.deliveries[r.replica_id]
            i = 0
            while i < len(futs):
                got = await futs[i]
                i += 1
                if local:  # every bucket already written by now goes in the same call (fewer round trips)
                    spans = [got]
                    while i < len(futs) and futs[i].done() and futs[i].exception() is None:
                        spans.append(futs[i].result())
                        i += 1
                    await r.load_weight_from_node_staging(spans)
                else:
                    await r.load_weight_bucket(got)  # a top-level ref: Ray hands a zero-copy view
        except BaseException:
            with contextlib.suppress(Exception):
                await r.abort_weight_update()
            raise
        return await r.finish_weight_update(), time.perf_counter() - s

    async def stage_then_commit(self, r: WeightReceiver) -> Reply:
        """One replica's staged update: every bucket reaches it while it serves; then one pause loads them all."""
        s = time.perf_counter()
        rid = r.replica_id
        local = rid in self.node_local
        mine = self.per_replica[rid]
        spans: list[Span] = []
        try:  # stage: the replica keeps serving meanwhile
            if local:
                spans = [await fut for fut in self.deliveries[rid]]
            else:
                total_r, off = sum(b.nbytes for b in mine), 0
                for fut, b in zip(self.deliveries[rid], mine):
                    await r.stage_weight_bucket(await fut, off, total_r)
                    spans.append((off, b.nbytes))
                    off += b.nbytes
        finally:
            await self._staged()
        await self._all_staged.wait()
        c = time.perf_counter()  # commit: the only pause
        await self._begin(r, 0)
        try:
            if local:
                await r.load_weight_from_node_staging(spans)
            else:
                await r.load_weight_from_staging(spans)
        except BaseException:
            with contextlib.suppress(Exception):
                await r.abort_weight_update()
            raise
        got = await r.finish_weight_update()
        self.commit_seconds[rid] = time.perf_counter() - c
        return got, time.perf_counter() - s

    async def _staged(self) -> None:
        """One replica's stage ended (done or failed); the last one runs ``on_commit`` and opens the commit."""
        self._staging_left -= 1
        if self._staging_left == 0:
            try:
                if self.on_commit is not None:
                    await self.on_commit()
            finally:
                self._all_staged.set()

    async def run(self, staged: bool) -> tuple[list[WeightReceiver], list[Reply | BaseException]]:
        """Run every replica's part and the producer; returns the replicas that took part and their replies."""
        targets = [r for r in self.replicas if r.replica_id not in self.failures]
        self._staging_left = len(targets)
        part = self.stage_then_commit if staged else self.stream
        try:
            producing = asyncio.ensure_future(self.produce()) if targets else None
            replies = await asyncio.gather(*(part(r) for r in targets), return_exceptions=True)
            if producing is not None:
                with contextlib.suppress(Exception):  # a failed write already failed every replica's load
                    await producing
        finally:
            if self.staging is not None:
                node_stagings.release(self.staging)
        self.deliveries.clear()
        return targets, list(replies)


# ---------------------------------------------------------------------------------------------------------------
# the push
# ---------------------------------------------------------------------------------------------------------------
async def push_weights_async(
    named_tensors: NamedTensors,
    replicas: Sequence[WeightReceiver],
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    expected_checksum: str | None = None,
    transport: str = "auto",
    staged: bool = False,
    on_commit: Callable[[], Awaitable[Any]] | None = None,
    keep: bool = False,
) -> SyncReport:
    """Push full weights to replicas and verify every replica's checksum.

    Replicas on the trainer's node load from one node-local shared-memory file the trainer writes each bucket into
    once (:class:`~.staging.SharedStaging`); replicas on other nodes get the buckets through Ray's object store
    (``ray.put`` once per bucket, a zero-copy view per replica on the same node as the object). Either way buckets
    stream: the replicas load bucket k while the trainer writes bucket k+1.

    Args:
        named_tensors: The trainer's full (unsharded) weights with HF checkpoint names.
        replicas: The replicas to update (an empty list only computes the checksum).
        version: The weight version the replicas will report after loading.
        bucket_bytes: Target bucket size.
        expected_checksum: Skip hashing on the trainer when the caller already knows the checksum.
        transport: ``"auto"`` (node-local shared memory for replicas on this node, Ray for the others), ``"ray"``
            (Ray's object store for every replica) or ``"node_shm"`` (shared memory; a replica that cannot map the
            file fails the push instead of falling back).
        staged: Two phases instead of streaming. **Stage**, while the replicas keep serving: every bucket goes to
            the replica side (the node staging file; Ray-path replicas copy theirs into their engine's staging
            file, ``stage_weight_bucket``). **Commit**, once every replica holds every bucket: per replica
            ``begin_weight_update`` (the pause: in-flight requests are aborted and continue from their prefix under
            the new weights), one load call for all staged buckets, ``finish_weight_update`` with the usual checks.
            Generation stops only for the commit (``SyncReport.per_replica_commit_seconds``).
        on_commit: Awaited once, between the two phases of a staged push (e.g. to mark the replicas as syncing).
        keep: Freeze the replicas' in-flight requests during the load instead of aborting them (vLLM's
            ``pause_generation(mode="keep")``): they continue without a re-prefill, and each result says from which
            token on it is of ``version``.

    Returns:
        A :class:`~.report.SyncReport` (``per_replica_transport`` says which path each replica took).

    Raises:
        WeightSyncError: At least one replica failed to load or reported a checksum different from the trainer's.
        ValueError: Unknown ``transport``.
    """
    import ray

    if transport not in ("auto", "ray", "node_shm"):
        raise ValueError(f"push_weights: transport must be 'auto', 'ray' or 'node_shm', got {transport!r}")
    t0 = time.perf_counter()
    items = _to_cpu_items(named_tensors)
    plan = BucketPlan.build(items, bucket_bytes, version)
    push = _Push(plan, replicas, version, transport, on_commit, put=ray.put, keep=keep)
    await push.choose_paths()
    # the trainer-side checksum is only needed to judge the replicas' answers. Written into the node staging file,
    # each tensor is hashed as it is copied (cache-hot, no second pass over memory); else hash while they load
    checksum_job = None
    if expected_checksum is None:
        if push.node_local:
            push.digests = {}
        else:
            checksum_job = asyncio.ensure_future(asyncio.to_thread(checksum_state, items))
    targets, replies = await push.run(staged)
    if checksum_job is not None:
        checksum = await checksum_job
    elif push.digests is not None:  # a write that stopped part-way hashed only some: hash them all
        checksum = combine_digests(push.digests) if len(push.digests) == len(items) else checksum_state(items)
    else:
        checksum = expected_checksum
    kinds = {"node_shm" if r.replica_id in push.node_local else "ray_object_store" for r in targets}
    report = SyncReport(
        version=version,
        bytes=plan.total,
        num_replicas=len(replicas),
        num_buckets=len(plan.buckets),
        seconds=time.perf_counter() - t0,
        prepare_seconds=push.put_seconds,
        checksum=checksum,
        transport="+".join(sorted(kinds)) or "none",
    )
    report.per_replica_commit_seconds.update(push.commit_seconds)
    for r in targets:
        report.per_replica_transport[r.replica_id] = (
            "node_shm" if r.replica_id in push.node_local else "ray_object_store"
        )
    try:
        check_replies(report, targets, replies, push.failures)
    except WeightSyncError:
        for r in replicas:  # a replica that failed re-attaches next time (its engine may have lost the mapping)
            if r.replica_id in push.failures:
                attached_stagings.forget(r)
        raise
    logger.debug(
        "weight sync v%d: %.1f MB x %d replicas in %.3f s (%.2f GB/s; %s; trainer-side write %.3f s)",
        version,
        plan.total / 1e6,
        len(replicas),
        report.seconds,
        report.gb_per_s,
        report.transport,
        push.put_seconds,
    )
    return report


def push_weights(
    named_tensors: NamedTensors,
    replicas: Sequence[WeightReceiver],
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

    def __init__(self, replicas: Sequence[WeightReceiver] = (), bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.replicas = list(replicas)
        self.bucket_bytes = bucket_bytes
        self.last_report: SyncReport | None = None

    async def push_async(
        self,
        named_tensors: NamedTensors,
        version: int,
        replicas: Sequence[WeightReceiver] | None = None,
        **kwargs: Any,
    ) -> SyncReport:
        """Push to ``replicas`` (default: the configured ones); see :func:`push_weights_async`."""
        targets = self.replicas if replicas is None else list(replicas)
        report = await push_weights_async(named_tensors, targets, version, bucket_bytes=self.bucket_bytes, **kwargs)
        self.last_report = report
        return report

    def push(
        self,
        named_tensors: NamedTensors,
        version: int,
        replicas: Sequence[WeightReceiver] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        **kwargs: Any,
    ) -> SyncReport:
        """Blocking :meth:`push_async`; see :func:`push_weights` for ``loop``."""
        targets = self.replicas if replicas is None else list(replicas)
        report = push_weights(named_tensors, targets, version, bucket_bytes=self.bucket_bytes, loop=loop, **kwargs)
        self.last_report = report
        return report
