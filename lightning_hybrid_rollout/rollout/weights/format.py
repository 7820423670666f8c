"""The weight wire format: dtype names, per-tensor checksums, and layer-aligned safetensors buckets.

Shared by the trainer side (:mod:`.push`, :mod:`.transports`) and the engine side
(:mod:`lightning_hybrid_rollout.rollout.vllm.worker_extension`, which parses buckets and hashes what it loads), so
both hash and lay out tensors identically. Depends on torch and numpy only.

The checksum (:func:`checksum_state`): per tensor, xxh3-128 (fallback: blake2b-128) over ``name``, dtype, shape and
the raw bytes; the state checksum hashes the sorted ``name:digest`` lines. It is a strong non-cryptographic hash:
it catches corruption, truncation, stale or missing tensors, reordering and renames, not a deliberate attacker.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

try:  # ~10 GB/s; a dependency of wandb, so present in this project's environment
    import xxhash

    def _new_hasher() -> Any:
        return xxhash.xxh3_128()

    HASH_ALGO = "xxh3_128"
except ImportError:  # pragma: no cover - exercised only where xxhash is missing

    def _new_hasher() -> Any:
        return hashlib.blake2b(digest_size=16)

    HASH_ALGO = "blake2b128"

_HASH_CHUNK = 512 * 2**10
"""Copy-then-hash granule of :meth:`WeightBucket.write_into` (fits a core's L2 twice over: source and destination)."""

DEFAULT_BUCKET_BYTES = 32 * 2**20
"""The one default bucket size (trainer push, strategies' full-weight gather, benchmarks)."""

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
SAFETENSORS_DTYPE_BY_NAME = {v: k for k, v in SAFETENSORS_DTYPES.items()}
if hasattr(torch, "float8_e4m3fn"):
    SAFETENSORS_DTYPES[torch.float8_e4m3fn] = "F8_E4M3"
    SAFETENSORS_DTYPES[torch.float8_e5m2] = "F8_E5M2"
    SAFETENSORS_DTYPE_BY_NAME["F8_E4M3"] = torch.float8_e4m3fn
    SAFETENSORS_DTYPE_BY_NAME["F8_E5M2"] = torch.float8_e5m2


# ---------------------------------------------------------------------------------------------------------------
# checksums
# ---------------------------------------------------------------------------------------------------------------
def _raw_bytes(t: torch.Tensor) -> np.ndarray:
    """Zero-copy uint8 view of a CPU tensor's bytes (copies only if non-contiguous or on another device)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return t.view(torch.uint8).numpy()


def _digest_start(name: str, dtype: str, shape: Sequence[int]) -> Any:
    """A hasher fed with one tensor's name, dtype and shape: its raw bytes follow (:func:`tensor_digest`)."""
    h = _new_hasher()
    h.update(f"{name}\x00{dtype}\x00{list(shape)}\x00".encode())
    return h


def tensor_digest(name: str, tensor: torch.Tensor) -> str:
    """Hex digest of one named tensor (name, dtype, shape and raw bytes)."""
    h = _digest_start(name, SAFETENSORS_DTYPES.get(tensor.dtype, str(tensor.dtype)), tensor.shape)
    h.update(_raw_bytes(tensor))
    return h.hexdigest()


def combine_digests(digests: Mapping[str, str]) -> str:
    """State checksum from per-tensor digests (order-independent: the names are sorted)."""
    h = _new_hasher()
    for name in sorted(digests):
        h.update(f"{name}:{digests[name]}\n".encode())
    return f"{HASH_ALGO}:{len(digests)}:{h.hexdigest()}"


def checksum_state(named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> str:
    """Checksum of a set of named tensors, identical on the trainer and inside the engine.

    Args:
        named_tensors: ``(name, tensor)`` pairs or a mapping (e.g. a HF ``state_dict``); names must be unique.

    Returns:
        ``"<algo>:<n_tensors>:<hex>"``.
    """
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    digests: dict[str, str] = {}
    for name, t in items:
        if name in digests:
            raise ValueError(f"checksum_state: duplicate tensor name {name!r}")
        digests[name] = tensor_digest(name, t)
    return combine_digests(digests)


# ---------------------------------------------------------------------------------------------------------------
# buckets (safetensors layout)
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class WeightBucket:
    """One bucket of weights in safetensors layout: ``header`` followed by ``payload`` is a safetensors file.

    The payload arrays are zero-copy uint8 views of the trainer's tensors until the bucket is ``ray.put`` (Ray then
    stores them out-of-band in shared memory; replicas get zero-copy views back).

    Args:
        header: 8-byte little-endian header length + JSON header (padded with spaces to 8 bytes).
        payload: Raw bytes of each tensor, in header order.
        names: Tensor names, in order.
        index: Position of this bucket in the push.
    """

    header: bytes
    payload: list[np.ndarray]
    names: list[str]
    index: int = 0

    @property
    def nbytes(self) -> int:
        """Total size of the serialized bucket (header + data)."""
        return len(self.header) + sum(int(a.nbytes) for a in self.payload)

    @property
    def data_bytes(self) -> int:
        """Size of the tensor data alone."""
        return sum(int(a.nbytes) for a in self.payload)

    def write_into(self, buf: memoryview | np.ndarray, offset: int = 0, digests: dict[str, str] | None = None) -> int:
        """Copy the serialized bucket into ``buf`` at ``offset``; returns the number of bytes written.

        Args:
            buf: The destination.
            offset: Where the bucket starts in ``buf``.
            digests: When given, each tensor's :func:`tensor_digest` is added to it (name -> digest), hashed from
                the *source* bytes chunk by chunk right after each chunk is copied, while they are still in the
                cache: the trainer-side checksum for about the cost of the copy alone, and still of the trainer's
                own tensors (a write that corrupted the destination is caught by the readers' digests).
        """
        dst = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
        pos = offset
        h = len(self.header)
        dst[pos : pos + h] = np.frombuffer(self.header, dtype=np.uint8)
        pos += h
        meta = json.loads(self.header[8:]) if digests is not None else None
        for name, a in zip(self.names, self.payload):
            n = int(a.nbytes)
            src = a.reshape(-1).view(np.uint8)
            if meta is None:
                np.copyto(dst[pos : pos + n], src, casting="no")
            else:
                hasher = _digest_start(name, meta[name]["dtype"], meta[name]["shape"])
                for c in range(0, n, _HASH_CHUNK):
                    piece = src[c : c + _HASH_CHUNK]
                    np.copyto(dst[pos + c : pos + c + len(piece)], piece, casting="no")
                    hasher.update(piece)
                digests[name] = hasher.hexdigest()  # type: ignore[index]
            pos += n
        return pos - offset

    def to_bytes(self) -> bytes:
        """The bucket as one contiguous safetensors blob (a copy)."""
        out = np.empty(self.nbytes, dtype=np.uint8)
        self.write_into(out)
        return out.tobytes()


def _layer_key(name: str) -> str:
    """Group key keeping everything of one decoder layer together (outermost integer path segment); a delta's
    ``name@idx`` / ``name@val`` pair (:mod:`.delta`) goes with ``name``."""
    base = name.partition("@")[0]
    parts = base.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return base


def plan_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[list[tuple[str, torch.Tensor]]]:
    """Cut named tensors into buckets of about ``bucket_bytes``, never splitting a decoder layer.

    A layer larger than ``bucket_bytes`` gets a bucket of its own. Order is preserved.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, t in named_tensors:
        groups.setdefault(_layer_key(name), []).append((name, t))
    buckets: list[list[tuple[str, torch.Tensor]]] = []
    cur: list[tuple[str, torch.Tensor]] = []
    cur_bytes = 0
    for items in groups.values():
        g_bytes = sum(t.numel() * t.element_size() for _, t in items)
        if cur and cur_bytes + g_bytes > bucket_bytes:
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.extend(items)
        cur_bytes += g_bytes
    if cur:
        buckets.append(cur)
    return buckets


def make_bucket(
    items: Sequence[tuple[str, torch.Tensor]], index: int = 0, metadata: Mapping[str, str] | None = None
) -> WeightBucket:
    """Build a :class:`WeightBucket` from named CPU tensors (zero-copy for contiguous CPU tensors)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    payload: list[np.ndarray] = []
    names: list[str] = []
    pos = 0
    for name, t in items:
        if t.dtype not in SAFETENSORS_DTYPES:
            raise TypeError(f"weight {name!r}: dtype {t.dtype} is not supported by the safetensors bucket format")
        raw = _raw_bytes(t)
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [pos, pos + raw.nbytes],
        }
        pos += raw.nbytes
        payload.append(raw)
        names.append(name)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    return WeightBucket(header=len(hjson).to_bytes(8, "little") + hjson, payload=payload, names=names, index=index)


def parse_safetensors(buf: Any, offset: int = 0) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """Zero-copy tensor views over a safetensors blob inside ``buf`` (any writable or read-only buffer).

    Args:
        buf: The buffer (bytes, mmap, numpy array, memoryview).
        offset: Where the blob starts.

    Returns:
        ``(named_tensors, blob_size)``.
    """
    mv = memoryview(buf).cast("B")
    if len(mv) - offset < 8:
        raise ValueError(f"safetensors blob at offset {offset} is truncated (buffer holds {len(mv)} bytes)")
    hlen = int.from_bytes(mv[offset : offset + 8], "little")
    if hlen <= 0 or offset + 8 + hlen > len(mv):
        raise ValueError(f"safetensors header length {hlen} at offset {offset} is invalid (corrupt bucket?)")
    try:
        header = json.loads(bytes(mv[offset + 8 : offset + 8 + hlen]))
    except ValueError as e:
        raise ValueError(f"safetensors header at offset {offset} is not valid JSON (corrupt bucket?): {e}") from e
    base = offset + 8 + hlen
    out: list[tuple[str, torch.Tensor]] = []
    end = base
    arr = np.frombuffer(mv, dtype=np.uint8)
    with warnings.catch_warnings():  # read-only buffers (bytes, Ray objects) give read-only views: we never write
        warnings.simplefilter("ignore", UserWarning)
        for name, info in header.items():
            _add_view(out, name, info, arr, base, len(mv))
    for _, info in (kv for kv in header.items() if kv[0] != "__metadata__"):
        end = max(end, base + info["data_offsets"][1])
    return out, end - offset


def _add_view(
    out: list[tuple[str, torch.Tensor]], name: str, info: dict[str, Any], arr: np.ndarray, base: int, size: int
) -> None:
    if name == "__metadata__":
        return
    b, e = info["data_offsets"]
    dtype = SAFETENSORS_DTYPE_BY_NAME.get(info["dtype"])
    if dtype is None:
        raise ValueError(f"tensor {name!r}: unsupported dtype {info['dtype']!r}")
    if base + e > size or b > e:
        raise ValueError(f"tensor {name!r} runs past the end of the buffer (truncated bucket)")
    if e == b:
        out.append((name, torch.empty(info["shape"], dtype=dtype)))
        return
    out.append((name, torch.from_numpy(arr[base + b : base + e]).view(dtype).reshape(info["shape"])))
