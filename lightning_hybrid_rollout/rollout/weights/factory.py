"""The transport registry: a name maps to the module and classes of its trainer and engine sides, imported lazily."""

from __future__ import annotations

import importlib
from typing import Any

from lightning_hybrid_rollout.rollout.weights.base import EngineReceiver, WeightTransport

_PKG = "lightning_hybrid_rollout.rollout.weights"

TRANSPORTS: dict[str, tuple[str, str, str | None]] = {
    "node_shm": (f"{_PKG}.node_shm", "NodeShmTransport", None),
    "ray": (f"{_PKG}.ray_store", "RayStoreTransport", None),
    "collective": (f"{_PKG}.collective", "CollectiveTransport", "CollectiveReceiver"),
    "cuda_ipc": (f"{_PKG}.cuda_ipc", "CudaIpcTransport", "CudaIpcReceiver"),
}
"""``name -> (module, trainer-side class, engine-side class)``; ``None``: the engine side is the staging-file
methods of the replica (``node_shm`` and ``ray`` load from shared-memory files)."""

TRANSPORT_CHOICES: tuple[str, ...] = ("auto", *TRANSPORTS)
"""The values of ``rollout.weight_transport``."""


def _load(name: str, index: int) -> Any:
    if name not in TRANSPORTS:
        raise ValueError(f"unknown weight transport {name!r}; use one of {sorted(TRANSPORTS)}")
    module, *classes = TRANSPORTS[name]
    cls = classes[index - 1]
    if cls is None:
        raise ValueError(f"weight transport {name!r} has no engine-side receiver (it loads from staging files)")
    return getattr(importlib.import_module(module), cls)


def create_transport(name: str, **kwargs: Any) -> WeightTransport:
    """A new trainer-side transport ``name`` (``kwargs`` go to its constructor)."""
    return _load(name, 1)(**kwargs)


def create_receiver(name: str) -> EngineReceiver:
    """A new engine-side receiver for transport ``name``."""
    return _load(name, 2)()
