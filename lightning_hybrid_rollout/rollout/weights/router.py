"""``rollout.weight_transport`` and ``rollout.weight_encoding`` applied: which transport each replica takes, what it
receives (full weights or a delta, :mod:`.delta`), and one push across them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import torch

from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.weights.base import NamedTensors, WeightTransport
from lightning_hybrid_rollout.rollout.weights.factory import TRANSPORT_CHOICES, create_transport
from lightning_hybrid_rollout.rollout.weights.format import DEFAULT_BUCKET_BYTES
from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import SyncReport

AUTO_CPU = "auto"
"""The CPU machine's ``auto``: node-local shared memory for replicas on the trainer's node, Ray for the others
(decided per replica inside :func:`~.push.push_weights_async`)."""


def merge_reports(reports: Sequence[SyncReport]) -> SyncReport:
    """One report of a push whose replicas took different transports (same version, same trainer checksum)."""
    first = reports[0]
    out = SyncReport(
        version=first.version,
        bytes=max(r.bytes for r in reports),
        num_replicas=sum(r.num_replicas for r in reports),
        num_buckets=max(r.num_buckets for r in reports),
        seconds=max(r.seconds for r in reports),
        prepare_seconds=sum(r.prepare_seconds for r in reports),
        checksum=first.checksum,
        transport="+".join(sorted({t for r in reports for t in r.transport.split("+")})),
        full_bytes=max(r.full_bytes for r in reports),
        changed_fraction=next((r.changed_fraction for r in reports if r.changed_fraction is not None), None),
        encode_seconds=max(r.encode_seconds for r in reports),
    )
    for r in reports:
        out.take_replicas_of(r)
    out.encoding = "+".join(sorted({e for r in reports for e in r.encoding.split("+")}))
    return out


class WeightRouter:
    """The run's weight push: one transport per replica, chosen by ``rollout.weight_transport``.

    ``auto`` on a machine without CUDA: node-local shared memory for replicas on the trainer's node, Ray's object
    store for the others. ``auto`` with CUDA: ``cuda_ipc`` for a hybrid replica on the trainer's own GPU,
    ``collective`` (NCCL) for every other one. Any other value: that transport for every replica, no fallback.

    ``encoding="auto"`` (the default): ``delta`` for the replicas whose engine holds 16-bit weights (bfloat16,
    float16: a small RL step leaves most of them bit-identical), ``full`` for the others (a float32 engine's weights
    change almost everywhere under Adam: 99.9% of SmolLM2's elements per step, so a delta would cost its encoding
    and a kept copy for no bytes saved). ``encoding="delta"``: the replicas on ``node_shm``, ``ray`` and
    ``collective`` receive each version as a delta
    from the version they hold, or in full where that is smaller or they hold nothing known (:class:`~.delta.
    DeltaSync`); ``cuda_ipc`` (no copy to save) and ``encoding="full"`` push the trainer's tensors as they are.

    Args:
        choice: The ``rollout.weight_transport`` value.
        encoding: The ``rollout.weight_encoding`` value (``"full"`` for a LoRA adapter-only sync).
    """

    def __init__(self, choice: str = "auto", encoding: str = "full") -> None:
        from lightning_hybrid_rollout.rollout.weights.delta import WEIGHT_ENCODINGS, DeltaSync

        if choice not in TRANSPORT_CHOICES:
            raise ValueError(f"weight transport must be one of {list(TRANSPORT_CHOICES)}, got {choice!r}")
        if encoding not in WEIGHT_ENCODINGS:
            raise ValueError(f"weight encoding must be one of {list(WEIGHT_ENCODINGS)}, got {encoding!r}")
        self.encoding = encoding
        #: The delta state (the previous version, which version each replica holds); None with ``full``.
        self.delta: DeltaSync | None = DeltaSync() if encoding in ("auto", "delta") else None
        self.cuda = torch.cuda.is_available()
        if choice == "cuda_ipc" and not self.cuda:
            from lightning_hybrid_rollout.rollout.weights.cuda_ipc import NO_CUDA

            raise RuntimeError(NO_CUDA)
        self.choice = choice
        self._transports: dict[str, WeightTransport] = {}

    def transport(self, name: str) -> WeightTransport:
        """The run's transport ``name`` (created on first use, kept: a collective group lives across pushes)."""
        if name not in self._transports:
            self._transports[name] = create_transport(name)
        return self._transports[name]

    def plan(self, replicas: Sequence[WeightReceiver]) -> dict[str, list[WeightReceiver]]:
        """``transport name -> replicas`` for one push (:data:`AUTO_CPU` for the CPU machine's ``auto``)."""
        if self.choice != "auto":
            return {self.choice: list(replicas)} if replicas else {}
        if not self.cuda:
            return {AUTO_CPU: list(replicas)} if replicas else {}
        from lightning_hybrid_rollout.rollout.weights.cuda_ipc import device_uuid

        here = device_uuid()
        out: dict[str, list[WeightReceiver]] = {}
        for r in replicas:
            same_gpu = getattr(r, "role", None) == "hybrid" and here is not None and r.info.get("cuda_device") == here
            out.setdefault("cuda_ipc" if same_gpu else "collective", []).append(r)
        return out

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
    ) -> SyncReport:
        """Push to every replica through its transport (concurrently) and verify every checksum.

        Raises:
            WeightSyncError: Any replica failed or loaded something else than the trainer holds (its transport's
                verdict; with several transports, every failure in one error). A replica whose delta failed is
                repaired by a full sync first; only if that fails too does it count.
        """
        named = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        commit = _Once(on_commit) if on_commit is not None else None
        options: dict[str, Any] = {"bucket_bytes": bucket_bytes, "staged": staged, "on_commit": commit, "keep": keep}
        if self.delta is None or not replicas:
            return await self._push_plain(named, replicas, version, **options)
        groups = self.plan(replicas)
        plain = groups.pop("cuda_ipc", [])
        rest = [r for group in groups.values() for r in group]
        if self.encoding == "auto":  # deltas only where the engine's weights are 16-bit (see the class docstring)
            plain += [r for r in rest if not _sixteen_bit(r)]
            rest = [r for r in rest if _sixteen_bit(r)]
        delta = self.delta

        async def send(items: list[tuple[str, Any]], group: Sequence[WeightReceiver], v: int, **kw: Any) -> Any:
            return await self._push_plain(items, group, v, **options, **kw)

        jobs = [delta.push(named, rest, version, send)] if rest else []
        if plain:
            jobs.append(self._push_plain(named, plain, version, **options))
        return await _gathered(jobs)

    async def _push_plain(
        self,
        named: list[tuple[str, torch.Tensor]],
        replicas: Sequence[WeightReceiver],
        version: int,
        *,
        bucket_bytes: int,
        staged: bool,
        on_commit: Callable[[], Awaitable[Any]] | None,
        keep: bool,
        expected_checksum: str | None = None,
    ) -> SyncReport:
        """``named`` as it is to every replica through its transport (``expected_checksum``: see
        :meth:`~.base.WeightTransport.push`)."""
        groups = self.plan(replicas) or {AUTO_CPU if not self.cuda else "collective": []}
        jobs = [
            self._push_one(name, named, group, version, bucket_bytes, staged, on_commit, keep, expected_checksum)
            for name, group in groups.items()
        ]
        return await _gathered(jobs)

    async def _push_one(
        self,
        name: str,
        named: list[tuple[str, torch.Tensor]],
        replicas: list[WeightReceiver],
        version: int,
        bucket_bytes: int,
        staged: bool,
        on_commit: Callable[[], Awaitable[Any]] | None,
        keep: bool,
        expected_checksum: str | None = None,
    ) -> SyncReport:
        options: dict[str, Any] = {"bucket_bytes": bucket_bytes, "staged": staged, "on_commit": on_commit, "keep": keep}
        options["expected_checksum"] = expected_checksum
        if name == AUTO_CPU:
            from lightning_hybrid_rollout.rollout.weights import push

            return await push.push_weights_async(named, replicas, version, transport="auto", **options)
        return await self.transport(name).push(named, replicas, version, **options)

    def close(self) -> None:
        """Release every transport's resources (the collective groups)."""
        for t in self._transports.values():
            t.close()
        self._transports.clear()


async def _gathered(jobs: list[Awaitable[SyncReport]]) -> SyncReport:
    """The pushes of one version to disjoint groups of replicas, run concurrently, as one report or one error."""
    results = await asyncio.gather(*jobs, return_exceptions=True)
    errors = [e for e in results if isinstance(e, BaseException)]
    if len(results) == 1:  # one transport: its own report or error
        if errors:
            raise errors[0]
        return results[0]  # type: ignore[return-value]
    reports = [r for r in results if isinstance(r, SyncReport)]
    reports += [e.report for e in errors if isinstance(e, WeightSyncError) and e.report is not None]
    if errors:
        if not all(isinstance(e, WeightSyncError) for e in errors):
            raise next(e for e in errors if not isinstance(e, WeightSyncError))
        failures = {rid: why for e in errors for rid, why in e.failures.items()}  # type: ignore[union-attr]
        raise WeightSyncError(failures, merge_reports(reports) if reports else None)
    return merge_reports(reports)


class _Once:
    """``on_commit`` of a push split over several transports: the first caller runs it, the others wait for it."""

    def __init__(self, fn: Callable[[], Awaitable[Any]]) -> None:
        self.fn = fn
        self.done: asyncio.Future[Any] | None = None

    async def __call__(self) -> Any:
        if self.done is None:
            self.done = asyncio.ensure_future(self.fn())
        return await asyncio.shield(self.done)


def _sixteen_bit(replica: WeightReceiver) -> bool:
    """The replica's engine holds bfloat16 or float16 weights (its health's ``engine_dtype``)."""
    return (getattr(replica, "info", None) or {}).get("engine_dtype") in SIXTEEN_BIT_DTYPES


#: Engine dtypes ``weight_encoding: auto`` sends deltas to.
SIXTEEN_BIT_DTYPES = ("bfloat16", "float16")
