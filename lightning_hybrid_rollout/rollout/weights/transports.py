"""GPU weight transports: CUDA IPC handles for colocated (hybrid) engines, NCCL broadcast for standalone ones.

Written for CUDA machines, not testable on the CPU machines this project is developed on (tests marked ``gpu``);
the CPU path is :func:`~.push.push_weights_async`. Verified like it: each engine hashes what it rebuilt or received
(same :func:`~.format.checksum_state` as the trainer) and :func:`~.report.check_replies` judges the answers. The
replicas are :class:`~.receiver.GpuWeightReceiver`\\ s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from lightning_hybrid_rollout.rollout.weights.format import (
    DEFAULT_BUCKET_BYTES,
    SAFETENSORS_DTYPES,
    checksum_state,
    plan_buckets,
)
from lightning_hybrid_rollout.rollout.weights.receiver import GpuWeightReceiver, NcclBucketMeta
from lightning_hybrid_rollout.rollout.weights.report import Reply, SyncReport, check_replies


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
    while the engines join with ``init_nccl_group(host, port, rank, world_size)`` (ranks 1..N): the rendezvous blocks
    until all members arrived.

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
    def describe(items: Sequence[tuple[str, torch.Tensor]]) -> NcclBucketMeta:
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
    replicas: Sequence[GpuWeightReceiver],
    version: int,
    load: Callable[[GpuWeightReceiver], Awaitable[Any]],
    transport: str,
    nbytes: int,
    num_buckets: int,
) -> SyncReport:
    """One session per replica around ``load`` (``begin_weight_update`` → ``load`` → ``finish_weight_update``)."""
    t0 = time.perf_counter()
    checksum_job = asyncio.ensure_future(asyncio.to_thread(checksum_state, named))

    async def one(r: GpuWeightReceiver) -> Reply:
        s = time.perf_counter()
        await r.begin_weight_update(version, 0)
        await load(r)
        return await r.finish_weight_update(), time.perf_counter() - s

    replies = await asyncio.gather(*(one(r) for r in replicas), return_exceptions=True)
    checksum = await checksum_job
    report = SyncReport(version, nbytes, len(replicas), num_buckets, time.perf_counter() - t0, 0.0, checksum=checksum)
    report.transport = transport
    check_replies(report, replicas, replies)
    return report


async def push_weights_cuda_ipc_async(
    named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    replicas: Sequence[GpuWeightReceiver],
    version: int,
) -> SyncReport:
    """GPU, hybrid replicas on the trainer's own GPU: hand them CUDA IPC handles of the trainer's tensors.

    The tensors must be full (gathered) CUDA tensors that stay alive until this returns. Verified like
    :func:`~.push.push_weights_async` (the engines hash what they rebuilt). Untested on CPU machines.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    named = [(n, t.detach().contiguous()) for n, t in items]
    blob = cuda_ipc_bucket(named)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)

    async def load(r: GpuWeightReceiver) -> Any:
        return await r.load_weight_ipc(blob)

    return await _verified_gpu_push(named, replicas, version, load, "cuda_ipc", nbytes, 1)


async def push_weights_nccl_async(
    broadcaster: NcclWeightBroadcaster,
    named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    replicas: Sequence[GpuWeightReceiver],
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

    async def recv_all(r: GpuWeightReceiver) -> Any:
        receive = r.stage_weight_nccl if staged else r.load_weight_nccl
        for meta, ev in zip(metas, ready):
            recv = asyncio.ensure_future(receive(meta))
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

    async def commit(r: GpuWeightReceiver) -> Any:
        return await r.load_weight_from_gpu_stage()

    return await _verified_gpu_push(host_copy, replicas, version, commit, "nccl_staged", nbytes, len(buckets))
