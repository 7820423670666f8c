"""The ``cuda_ipc`` transport: a hybrid replica on the trainer rank's own GPU maps the trainer's CUDA tensors.

Nothing is copied: the trainer sends CUDA IPC handles of its full weights, the engine rebuilds the tensors on the
same device memory and loads them. CUDA only (tests marked ``gpu``).
"""

from __future__ import annotations

import pickle
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from lightning_hybrid_rollout.rollout.weights.base import (
    EngineReceiver,
    IpcBucket,
    Items,
    NamedTensors,
    WeightTransport,
)
from lightning_hybrid_rollout.rollout.weights.format import DEFAULT_BUCKET_BYTES
from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import SyncReport, verified_sessions

NO_CUDA = "rollout.weight_transport 'cuda_ipc' needs CUDA, and this machine has none; use 'auto' or 'collective'."


def device_uuid() -> str | None:
    """The UUID of this process's current CUDA device (``None`` without CUDA): tells a replica on the trainer's GPU."""
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def ipc_handles(items: Sequence[tuple[str, torch.Tensor]]) -> bytes:
    """Pickled ``[(name, rebuild_fn, args)]`` of CUDA tensors (``torch.multiprocessing.reductions``)."""
    from torch.multiprocessing.reductions import reduce_tensor

    out = []
    for name, t in items:
        if not t.is_cuda:
            raise ValueError(f"cuda_ipc: tensor {name!r} is on {t.device}, expected a CUDA device")
        fn, args = reduce_tensor(t)
        out.append((name, fn, args))
    return pickle.dumps(out)


class CudaIpcTransport(WeightTransport):
    """Trainer side: one IPC bucket of every tensor (kept alive until every replica verified its load)."""

    name: ClassVar[str] = "cuda_ipc"

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(NO_CUDA)

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
        """Send the handles; ``staged`` has nothing to stage (``on_commit`` runs first)."""
        device = torch.device("cuda", torch.cuda.current_device())
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        named = [(n, t.detach().to(device).contiguous()) for n, t in items]
        request = IpcBucket(ipc_handles(named))
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        if on_commit is not None:
            await on_commit()

        async def load(r: WeightReceiver) -> Any:
            return await r.receive_weights(self.name, request)

        host = [(n, t.cpu()) for n, t in named]
        return await verified_sessions(self.name, host, replicas, version, load, nbytes, 1, keep, expected_checksum)


class CudaIpcReceiver(EngineReceiver):
    """Engine side: rebuild the trainer's tensors on this process's device."""

    def receive(self, request: Any) -> Items:
        if not isinstance(request, IpcBucket):
            raise TypeError(f"cuda_ipc transport: unexpected request {type(request).__name__}")
        device = torch.cuda.current_device()
        items = []
        for name, fn, args in pickle.loads(request.handles):
            args = list(args)
            args[6] = device  # storage_device of rebuild_cuda_tensor: this process's device index
            items.append((name, fn(*args)))
        return items
