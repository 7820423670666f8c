"""What a weight push calls on a replica: the :class:`WeightReceiver` protocol.

:class:`~lightning_hybrid_rollout.rollout.replica.ReplicaHandle` implements it (each method calls the replica
actor's method of the same name, which forwards to the engine driver,
:class:`~lightning_hybrid_rollout.rollout.vllm.driver.VLLMEngine`); so do the tests' fakes.
``tests/rollout/weights/test_receiver.py`` checks that the handle, the actor and the engine have every method with
these signatures.

One update is a session: ``begin_weight_update`` (in-flight requests are aborted, new ones wait) → one or more loads
→ ``finish_weight_update`` (returns the checksum of what the engine loaded) or ``abort_weight_update``. The
staging-file transports (``node_shm``, ``ray``) have their own methods; every other transport goes through
``receive_weights(transport, request)``, which the engine hands to that transport's receiver (:mod:`.factory`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    from ray import ObjectRef

    from lightning_hybrid_rollout.rollout.weights.format import WeightBucket

Span: TypeAlias = tuple[int, int]
"""``(offset, nbytes)`` of one bucket inside a staging file."""

BucketPayload: TypeAlias = "WeightBucket | bytes | memoryview | np.ndarray | ObjectRef"
"""One bucket on the wire: a :class:`~.format.WeightBucket` or a safetensors blob; driver side also a Ray
``ObjectRef`` to one (Ray resolves a top-level ref argument, so the actor gets a zero-copy view)."""


@runtime_checkable
class WeightReceiver(Protocol):
    """A replica as a weight push sees it.

    Attributes:
        replica_id: Name used in reports and errors.
        info: The replica's last health dict; ``info["node_id"]`` tells the push whether it shares the trainer's node.
    """

    replica_id: str
    info: dict[str, Any]

    async def attach_node_staging(self, path: str, size: int, inode: int) -> bool:
        """Map the trainer's node staging file; False if it is not visible here (another node) or not that file."""
        ...

    async def begin_weight_update(self, version: int, total_bytes: int = 0, keep: bool = False) -> None:
        """Open a session for ``version``; ``total_bytes``: what :meth:`load_weight_bucket` calls will bring;
        ``keep``: freeze in-flight requests in place instead of aborting them."""
        ...

    async def load_weight_from_node_staging(self, spans: list[Span]) -> dict[str, Any]:
        """In a session: load the buckets at ``spans`` of the attached node staging file (no copy)."""
        ...

    async def load_weight_bucket(self, bucket: BucketPayload) -> dict[str, Any]:
        """In a session: copy one bucket into the engine's staging file and load it."""
        ...

    async def stage_weight_bucket(self, bucket: BucketPayload, offset: int, total_bytes: int) -> float:
        """Outside a session (still serving): copy a bucket into the engine's staging file; returns seconds."""
        ...

    async def load_weight_from_staging(self, spans: list[Span]) -> dict[str, Any]:
        """In a session: load the buckets :meth:`stage_weight_bucket` put at ``spans``."""
        ...

    async def receive_weights(self, transport: str, request: Any) -> dict[str, Any]:
        """Hand ``request`` (a :data:`~.base.TransferRequest`) to the engine's receiver of ``transport``
        (``collective``, ``cuda_ipc``): a join or a staged bucket outside a session, a load inside one."""
        ...

    async def abort_weight_update(self) -> None:
        """Give the session up (the engine's checksum becomes unknown); a no-op without one."""
        ...

    async def finish_weight_update(self) -> str:
        """Close the session: verify the load and return the engine-side checksum of what it loaded."""
        ...
