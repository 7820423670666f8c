"""The second process of ``test_cuda_ipc.py``: a stand-in for the engine's worker, holding a ``CudaIpcReceiver``.

``serve(conn)`` answers requests on a ``multiprocessing`` pipe until ``("stop",)``; each answer is ``("ok", value)``
or ``("error", traceback text)``. Only plain Python values cross the pipe (bytes, tuples, strings), never tensors, so
what the parent compares is exactly what this process read from the mapped device memory.
"""

from __future__ import annotations

import traceback
from typing import Any


def _describe(items: list[tuple[str, Any]]) -> list[tuple[str, str, tuple[int, ...], tuple[int, ...], bool, bytes]]:
    """``(name, dtype, shape, stride, is_cuda, raw bytes)`` of each rebuilt tensor (bytes in logical order)."""
    import torch

    out = []
    for name, t in items:
        raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        out.append((name, str(t.dtype), tuple(t.shape), tuple(t.stride()), bool(t.is_cuda), raw))
    return out


def serve(conn: Any) -> None:
    """Handle ``("receive", handles)``, ``("push_load", handles)``, ``("finish",)``, ``("fill", name, value)``."""
    import torch

    from lightning_hybrid_rollout.rollout.weights.base import IpcBucket
    from lightning_hybrid_rollout.rollout.weights.cuda_ipc import CudaIpcReceiver
    from lightning_hybrid_rollout.rollout.weights.format import combine_digests, tensor_digest

    receiver = CudaIpcReceiver()
    held: list[tuple[str, torch.Tensor]] = []  # kept alive until the update finished, as the engine's worker does
    digests: dict[str, str] = {}
    while True:
        request = conn.recv()
        try:
            op = request[0]
            if op == "stop":
                conn.send(("ok", None))
                return
            if op == "receive":  # rebuild, describe, keep (a later "fill" writes through the mapping)
                held = receiver.receive(IpcBucket(request[1]))
                value: Any = {
                    "tensors": _describe(held),
                    "alloc_bytes": torch.cuda.memory_allocated(),
                    "device": torch.cuda.current_device(),
                }
            elif op == "push_load":  # what the engine does with a CudaIpcTransport push: load and hash
                held = receiver.receive(IpcBucket(request[1]))
                digests.update({n: tensor_digest(n, t) for n, t in held})
                value = {"tensors": len(held), "described": _describe(held)}
            elif op == "finish":
                value, digests, held = combine_digests(digests), {}, []
            elif op == "fill":
                _, name, fill = request
                dict(held)[name].fill_(fill)
                torch.cuda.synchronize()
                value = None
            else:
                raise ValueError(f"unknown request {op!r}")
            conn.send(("ok", value))
        except Exception:
            conn.send(("error", traceback.format_exc()))
