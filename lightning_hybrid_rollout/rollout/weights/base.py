"""The weight-transport interface: a trainer-side :class:`WeightTransport`, an engine-side :class:`EngineReceiver`,
and the typed messages that cross from one to the other (:data:`TransferRequest`)."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import torch

if TYPE_CHECKING:
    from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
    from lightning_hybrid_rollout.rollout.weights.report import SyncReport

NamedTensors: TypeAlias = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
"""The trainer's full (unsharded) weights with HF checkpoint names: ``(name, tensor)`` pairs or a mapping."""

Items: TypeAlias = list[tuple[str, torch.Tensor]]
"""``(name, tensor)`` pairs, in order."""


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor sits in a flat byte buffer.

    Args:
        name: HF checkpoint name.
        dtype: Safetensors dtype name (``"F32"``, ``"BF16"``, ...).
        shape: Tensor shape.
        offset: Byte offset in the buffer.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class BucketLayout:
    """One bucket as a flat byte buffer: its size and its tensors (what a receiver needs to slice it).

    Args:
        nbytes: Buffer size in bytes.
        tensors: The tensors, in buffer order.
    """

    nbytes: int
    tensors: tuple[TensorMeta, ...]

    @classmethod
    def of(cls, items: Sequence[tuple[str, torch.Tensor]]) -> BucketLayout:
        """The layout of ``items`` packed one after the other."""
        from lightning_hybrid_rollout.rollout.weights.format import SAFETENSORS_DTYPES

        metas, pos = [], 0
        for name, t in items:
            if t.dtype not in SAFETENSORS_DTYPES:
                raise TypeError(f"weight {name!r}: dtype {t.dtype} cannot be sent")
            metas.append(TensorMeta(name, SAFETENSORS_DTYPES[t.dtype], tuple(t.shape), pos))
            pos += t.numel() * t.element_size()
        return cls(pos, tuple(metas))

    @staticmethod
    def pack(items: Sequence[tuple[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
        """``items``' bytes concatenated into one uint8 tensor on ``device`` (the sender's buffer)."""
        flat = [t.detach().to(device).contiguous().reshape(-1).view(torch.uint8) for _, t in items]
        return torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=device)

    def views(self, buf: torch.Tensor) -> Items:
        """Zero-copy views of the tensors in ``buf`` (a received uint8 buffer of :attr:`nbytes`)."""
        from lightning_hybrid_rollout.rollout.weights.format import SAFETENSORS_DTYPE_BY_NAME

        out = []
        for m in self.tensors:
            dtype = SAFETENSORS_DTYPE_BY_NAME[m.dtype]
            n = int(torch.Size(m.shape).numel()) * torch.empty((), dtype=dtype).element_size()
            out.append((m.name, buf[m.offset : m.offset + n].view(dtype).reshape(m.shape)))
        return out


@dataclass(frozen=True)
class CollectiveJoin:
    """Join the trainer's broadcast group (outside an update session; blocks until every member joined).

    Args:
        host: Address of the group's rendezvous store (the trainer's node).
        port: Its port (bound by the trainer).
        rank: This engine's rank (the trainer is 0).
        world_size: 1 + number of engines in the group.
        backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors).
        group: The group's name (unique per group; a new join replaces the engine's previous group).
        timeout_s: Collective timeout in seconds (a member that died fails the others after this long).
    """

    host: str
    port: int
    rank: int
    world_size: int
    backend: str
    group: str
    timeout_s: float
    in_session: ClassVar[bool] = False


@dataclass(frozen=True)
class CollectiveBucket:
    """Receive one broadcast bucket: load it now (in a session) or, with ``stage``, keep it for a
    :class:`CollectiveCommit` (outside a session, while the engine serves).

    Args:
        group: The group it is broadcast in.
        layout: Its layout.
        stage: Keep it instead of loading it.
    """

    group: str
    layout: BucketLayout
    stage: bool = False

    @property
    def in_session(self) -> bool:
        """Loading happens inside an update session; staging outside one."""
        return not self.stage


@dataclass(frozen=True)
class CollectiveCommit:
    """Load every bucket staged with :class:`CollectiveBucket` ``stage=True`` (in a session)."""

    group: str
    in_session: ClassVar[bool] = True


@dataclass(frozen=True)
class IpcBucket:
    """Load the trainer's CUDA tensors from their IPC handles (in a session; zero copy, same device memory).

    Args:
        handles: Pickled ``[(name, rebuild_fn, args)]`` from ``torch.multiprocessing.reductions.reduce_tensor``.
    """

    handles: bytes
    in_session: ClassVar[bool] = True


TransferRequest: TypeAlias = CollectiveJoin | CollectiveBucket | CollectiveCommit | IpcBucket
"""What a trainer-side transport asks of an engine through ``receive_weights(transport, request)``."""


class WeightTransport(abc.ABC):
    """Trainer side of one transport: pushes full weights to replicas and verifies every replica's checksum.

    Every implementation returns a :class:`~.report.SyncReport` whose ``transport`` and ``per_replica_transport``
    name itself, and raises :class:`~lightning_hybrid_rollout.errors.WeightSyncError` when a replica failed or its
    engine-side checksum differs from the trainer's (:func:`~.report.check_replies`); none falls back to another.
    """

    name: ClassVar[str]

    @abc.abstractmethod
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
        """Push to ``replicas``; ``staged``, ``on_commit``, ``keep`` and ``expected_checksum`` (the checksum the
        replicas must report, when it is not the one of ``named_tensors``: a delta) as in
        :func:`~.push.push_weights_async`."""

    def close(self) -> None:  # noqa: B027 - most transports hold nothing
        """Release what the transport holds (process groups, stores); it may be used again afterwards."""


class EngineReceiver(abc.ABC):
    """Engine side of one transport, in the vLLM worker (:mod:`~lightning_hybrid_rollout.rollout.vllm.
    worker_extension`): turns a :data:`TransferRequest` into tensors to load."""

    @abc.abstractmethod
    def receive(self, request: Any) -> Items:
        """Handle ``request``; return the tensors to load now (empty for a join or a staged bucket). The worker
        keeps them alive until the update finished."""

    def close(self) -> None:  # noqa: B027 - most receivers hold nothing
        """Release what the receiver holds."""
