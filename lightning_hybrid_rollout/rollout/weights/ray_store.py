"""The ``ray`` transport: each bucket is ``ray.put`` once; each replica copies it into its engine's staging file.

The bucket streaming and the staged commit are :func:`~.push.push_weights_async`'s (shared with ``node_shm``, which
``auto`` mixes in per replica). Works across nodes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from lightning_hybrid_rollout.rollout.weights.base import NamedTensors, WeightTransport
from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import SyncReport


class RayStoreTransport(WeightTransport):
    """Every replica gets the buckets through Ray's object store (a zero-copy view on the object's node)."""

    name: ClassVar[str] = "ray"

    async def push(
        self,
        named_tensors: NamedTensors,
        replicas: Sequence[WeightReceiver],
        version: int,
        *,
        bucket_bytes: int,
        staged: bool = False,
        on_commit: Callable[[], Awaitable[Any]] | None = None,
        keep: bool = False,
        expected_checksum: str | None = None,
    ) -> SyncReport:
        from lightning_hybrid_rollout.rollout.weights import push

        return await push.push_weights_async(
            named_tensors,
            replicas,
            version,
            bucket_bytes=bucket_bytes,
            transport=self.name,
            staged=staged,
            on_commit=on_commit,
            keep=keep,
            expected_checksum=expected_checksum,
        )
