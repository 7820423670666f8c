"""The ``node_shm`` transport: replicas on the trainer's node load from one node-local shared-memory file.

The bucket streaming and the staged commit are :func:`~.push.push_weights_async`'s (shared with ``ray``, which
``auto`` mixes in per replica); a replica that cannot map the file fails the push instead of falling back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from lightning_hybrid_rollout.rollout.weights.base import NamedTensors, WeightTransport
from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import SyncReport


class NodeShmTransport(WeightTransport):
    """Every replica maps the trainer's node staging file (:class:`~.staging.SharedStaging`)."""

    name: ClassVar[str] = "node_shm"

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
