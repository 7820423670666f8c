"""Exact delta weight sync (``rollout.weight_encoding: delta``): each version's changed elements, as the engine holds
them, pushed through the usual transports and applied to a dense copy of the weights on the engine side.

Trainer side, :class:`DeltaEncoder` keeps the previous version's weights cast to the engine's dtype and, once per
version, finds the elements whose bits changed; :class:`DeltaSync` (the router's) gives each replica a delta from the
version it holds (the recent versions' deltas squashed into one: the union of their changed indices, with the current
values) or a full sync, whichever is smaller, pushes each payload through the run's transport, and repairs a replica
whose delta failed (a checksum mismatch, a base it does not hold) with a full sync in the same push. Engine side,
:class:`DeltaShadow` (in vLLM's worker) keeps the last verified weights dense under the trainer's names, applies a
delta to them and hands the whole result to the loader, so the engine's checksum is exactly a full sync's. On the wire
a delta is ordinary tensors in ordinary buckets: a header (:data:`DELTA_HEADER`), then per changed tensor either
``name@idx`` (int32 flat indices) + ``name@val`` (the new values), or ``name`` itself where most elements changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_hybrid_rollout.errors import WeightLoadError, WeightSyncError
from lightning_hybrid_rollout.rollout.weights.base import Items
from lightning_hybrid_rollout.rollout.weights.format import checksum_state
from lightning_hybrid_rollout.rollout.weights.receiver import WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import SyncReport

logger = logging.getLogger(__name__)

WEIGHT_ENCODINGS: tuple[str, ...] = ("auto", "full", "delta")
"""The values of ``rollout.weight_encoding``."""

DELTA_HEADER = "__lhr_delta__"
"""Name of the header tensor (JSON in uint8) that opens every payload of a delta-encoded run, full ones included: it
tells the engine to keep its dense copy (a full payload) or to apply the tensors to it (a delta)."""

IDX, VAL = "@idx", "@val"
"""Suffixes of a sparsely changed tensor's flat indices and new values (``plan_buckets`` keeps a pair together)."""

_PAD = 8
"""A sparse entry's element count is padded to a multiple of this (the last index repeated): every wire tensor then
stays 8-byte aligned in a bucket, which the collective transport's zero-copy views need."""

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Integer dtypes of each element size: elements are compared as bits (-0.0 vs 0.0 and NaN payloads are changes)."""

Send = Callable[..., Awaitable[SyncReport]]
"""``send(items, replicas, version, expected_checksum=...)``: one verified push through the run's transport."""


# ---------------------------------------------------------------------------------------------------------------
# the pieces both sides share
# ---------------------------------------------------------------------------------------------------------------
def changed_indices(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Flat indices of the elements of ``new`` whose bits differ from ``old`` (same shape and dtype), int32 where
    they fit (int64 past 2**31 elements)."""
    iv = _INT_VIEW[new.element_size()]
    idx = (new.reshape(-1).view(iv) != old.reshape(-1).view(iv)).nonzero().squeeze(1)
    return idx.to(_index_dtype(new))


def _index_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.int32 if t.numel() < 2**31 else torch.int64


def header_item(meta: Mapping[str, Any]) -> tuple[str, torch.Tensor]:
    """The header tensor carrying ``meta`` (padded with spaces to 8 bytes, so the tensors after it stay aligned)."""
    raw = json.dumps(dict(meta), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)
    return DELTA_HEADER, torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def read_header(tensor: torch.Tensor) -> dict[str, Any]:
    """The ``meta`` of :func:`header_item`."""
    return dict(json.loads(bytes(tensor.detach().cpu().numpy()).decode()))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _sparse_bytes(n: int, numel: int, element_size: int) -> int:
    n += -n % _PAD
    return n * ((4 if numel < 2**31 else 8) + element_size)


def _entry_bytes(n: int, t: torch.Tensor) -> int:
    """Wire bytes of a tensor with ``n`` changed elements: sparse or dense, whichever is smaller (dense only where
    its size keeps the alignment of :data:`_PAD`)."""
    if n == 0:
        return 0
    sparse = _sparse_bytes(n, t.numel(), t.element_size())
    dense = _nbytes(t)
    return dense if dense <= sparse and dense % _PAD == 0 else sparse


# ---------------------------------------------------------------------------------------------------------------
# trainer side
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class _Link:
    """One version's delta against the version before it: ``changed`` maps a tensor name to its changed flat
    indices (None: sent whole; absent: unchanged); ``nbytes``: that delta's wire bytes."""

    seq: int
    changed: dict[str, torch.Tensor | None]
    nbytes: int


@dataclass(frozen=True)
class Payload:
    """What one group of replicas receives for a version: ``encoding`` (``"full"`` or ``"delta"``), the wire
    ``items``, and the version's ``checksum`` and ``seq`` (taken together, so a later version cannot slip in)."""

    encoding: str
    items: Items
    checksum: str
    seq: int


class DeltaEncoder:
    """The trainer's previous weights in one engine dtype and the deltas of the latest versions.

    Memory: one copy of the weights in the engine's dtype between syncs (two while a new version is diffed), plus the
    changed indices of the kept versions, whose deltas together stay smaller than one full sync (a replica further
    behind gets a full sync).

    Args:
        dtype: The engine's dtype; floating-point tensors are cast to it (``None``: sent as the trainer holds them).

    Example::

        enc = DeltaEncoder(torch.bfloat16)
        enc.advance({"w": torch.ones(8)}, version=1)
        enc.advance({"w": torch.ones(8) * 2}, version=2)
        enc.payload(base_seq=1).encoding  # "delta": [header, w@idx, w@val] (or "full" when that is smaller)
    """

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.version: int | None = None
        #: Increments with each version built (a replica's held weights are named by it).
        self.seq = 0
        self.current: dict[str, torch.Tensor] = {}
        #: ``seq -> checksum`` of each version a delta can still start from.
        self.checksums: dict[int, str] = {}
        self.links: list[_Link] = []
        #: Elements of the latest version that differ from the previous one, over all elements (None: first).
        self.changed_fraction: float | None = None
        self.encode_seconds = 0.0
        self._payloads: dict[int | None, Payload] = {}
        self._lock = threading.Lock()

    @property
    def checksum(self) -> str:
        """The current version's checksum (of its tensors in the engine's dtype: what a verified engine reports)."""
        return self.checksums[self.seq]

    @property
    def full_bytes(self) -> int:
        """Tensor bytes of a full sync in the engine's dtype."""
        return sum(_nbytes(t) for t in self.current.values())

    def advance(self, named: Sequence[tuple[str, torch.Tensor]], version: int) -> bool:
        """Make ``named`` the current version (cast to the engine's dtype, diffed against the previous one).

        Built once per version: returns False, changing nothing, when ``version`` is already the current one (the
        hybrid push of a version the standalone push already built). Thread-safe.
        """
        with self._lock:
            if self.version == version and self.current:
                return False
            t0 = time.perf_counter()
            new: dict[str, torch.Tensor] = {}
            for name, t in named:
                t = t.detach()
                if self.dtype is not None and t.is_floating_point() and t.dtype != self.dtype:
                    new[name] = t.to("cpu", self.dtype).contiguous()
                else:  # a copy: the trainer's own tensor changes in place at the next optimizer step
                    new[name] = t.to("cpu", copy=True).contiguous()
            same_layout = list(new) == list(self.current) and all(
                t.shape == self.current[n].shape and t.dtype == self.current[n].dtype for n, t in new.items()
            )
            if same_layout and self.current:
                changed: dict[str, torch.Tensor | None] = {}
                total = moved = nbytes = 0
                for name, t in new.items():
                    iv = _INT_VIEW[t.element_size()]
                    ne = t.reshape(-1).view(iv) != self.current[name].reshape(-1).view(iv)
                    n = int(ne.sum())
                    total += t.numel()
                    if n == 0:
                        continue
                    moved += n
                    nbytes += _entry_bytes(n, t)
                    # indices only where they are what is sent (float32 under Adam: nearly every element moves)
                    dense = _entry_bytes(n, t) == _nbytes(t)
                    changed[name] = None if dense else ne.nonzero().squeeze(1).to(_index_dtype(t))
                self.links.append(_Link(self.seq + 1, changed, nbytes))
                self.changed_fraction = moved / max(total, 1)
            else:  # the first version, or other tensors: no delta reaches it
                self.links.clear()
                self.checksums.clear()
                self.changed_fraction = None
            self.seq += 1
            self.current, self.version = new, version
            self.checksums[self.seq] = checksum_state(new.items())
            self._trim()
            self._payloads = {}
            self.encode_seconds = time.perf_counter() - t0
            return True

    def _trim(self) -> None:
        """Keep the newest links whose deltas together stay below one full sync (older bases get a full sync)."""
        full, kept, total = self.full_bytes, [], 0
        for link in reversed(self.links):
            total += link.nbytes
            if total >= full:
                break
            kept.append(link)
        self.links = kept[::-1]
        oldest = self.links[0].seq - 1 if self.links else self.seq
        self.checksums = {s: c for s, c in self.checksums.items() if s >= oldest}

    def reachable(self, base_seq: int) -> bool:
        """Whether a delta from version ``base_seq`` to the current one can be built."""
        return base_seq in self.checksums

    def payload(self, base_seq: int | None) -> Payload:
        """What a replica holding ``base_seq`` gets: a delta (the chain from ``base_seq`` squashed into one) when that
        is smaller than a full sync, else the full weights in the engine's dtype. Cached per version."""
        with self._lock:
            key = base_seq if base_seq is not None and self.reachable(base_seq) else None
            if key not in self._payloads:
                encoding, items = self._build(key)
                self._payloads[key] = Payload(encoding, items, self.checksum, self.seq)
            return self._payloads[key]

    def _full(self) -> tuple[str, Items]:
        meta = {"encoding": "full", "checksum": self.checksum, "version": self.version}
        return "full", [header_item(meta), *self.current.items()]

    def _build(self, base_seq: int | None) -> tuple[str, Items]:
        if base_seq is None:
            return self._full()
        chain = [link for link in self.links if link.seq > base_seq]
        if sum(link.nbytes for link in chain) >= self.full_bytes and chain:
            return self._full()
        items: Items = []
        for name, t in self.current.items():
            parts = [link.changed[name] for link in chain if name in link.changed]
            if not parts:
                continue
            if any(p is None for p in parts):  # one version moved most of it: sent whole
                items.append((name, t))
                continue
            if len(parts) == 1:
                idx = parts[0]
            else:  # the union of the versions' changed elements, each with its current value
                mask = torch.zeros(t.numel(), dtype=torch.bool)
                for p in parts:
                    mask[p] = True
                idx = mask.nonzero().squeeze(1).to(_index_dtype(t))
            assert idx is not None
            n = idx.numel()
            if _entry_bytes(n, t) == _nbytes(t):
                items.append((name, t))
                continue
            if n % _PAD:  # repeat the last index: the same value written twice
                idx = torch.cat([idx, idx[-1:].expand(_PAD - n % _PAD)])
            items += [(name + IDX, idx), (name + VAL, t.reshape(-1)[idx])]
        if sum(_nbytes(x) for _, x in items) >= self.full_bytes:
            return self._full()
        meta = {
            "encoding": "delta",
            "base": self.checksums[base_seq],
            "checksum": self.checksum,
            "version": self.version,
        }
        return "delta", [header_item(meta), *items]


def _dtype(name: str | None) -> torch.dtype | None:
    dtype = getattr(torch, name, None) if name else None
    return dtype if isinstance(dtype, torch.dtype) else None


class DeltaSync:
    """The router's delta push: one :class:`DeltaEncoder` per engine dtype, and which version each replica holds.

    A replica holds a version once its checksum was verified for it; the same handle must come back (a restarted
    replica is a new handle, so it gets a full sync). Every replica reports its engine's dtype in its health
    (``info["engine_dtype"]``; unknown: the trainer's tensors as they are).
    """

    def __init__(self) -> None:
        self.encoders: dict[str | None, DeltaEncoder] = {}
        self._held: dict[str, tuple[Any, str | None, int]] = {}

    def _ref(self, replica: WeightReceiver) -> Any:
        try:
            return weakref.ref(replica)
        except TypeError:  # not weakly referable (a test double): compared by id
            return id(replica)

    def held_seq(self, replica: WeightReceiver, key: str | None) -> int | None:
        """The version (an encoder ``seq``) ``replica`` holds, if this run verified it and it is the same handle."""
        got = self._held.get(replica.replica_id)
        if got is None or got[1] != key:
            return None
        ref, _, seq = got
        same = ref() is replica if isinstance(ref, weakref.ref) else ref == id(replica)
        return seq if same else None

    def forget(self, replica: WeightReceiver) -> None:
        """Give ``replica`` a full sync next time."""
        self._held.pop(replica.replica_id, None)

    async def push(self, named: Items, replicas: Sequence[WeightReceiver], version: int, send: Send) -> SyncReport:
        """Push ``version`` to ``replicas``: a delta to each replica holding a version a delta reaches from (and that
        is smaller), a full sync to the others; a replica whose delta failed gets a full sync at once.

        Raises:
            WeightSyncError: A replica failed its full sync (the first one or the repair).
        """
        t0 = time.perf_counter()
        by_dtype: dict[str | None, list[WeightReceiver]] = {}
        for r in replicas:
            by_dtype.setdefault((getattr(r, "info", None) or {}).get("engine_dtype"), []).append(r)
        jobs = [self._push_dtype(key, group, named, version, send) for key, group in by_dtype.items()]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        reports = [x for x in results if isinstance(x, SyncReport)]
        errors = [x for x in results if isinstance(x, BaseException)]
        reports += [e.report for e in errors if isinstance(e, WeightSyncError) and e.report is not None]
        if errors and not all(isinstance(e, WeightSyncError) for e in errors):
            raise next(e for e in errors if not isinstance(e, WeightSyncError))
        report = combine_reports(reports, len(replicas)) if reports else None
        if report is not None:
            report.seconds = time.perf_counter() - t0
        if errors:
            failures = {rid: why for e in errors for rid, why in e.failures.items()}  # type: ignore[union-attr]
            raise WeightSyncError(failures, report)
        assert report is not None
        return report

    async def _push_dtype(
        self, key: str | None, replicas: list[WeightReceiver], named: Items, version: int, send: Send
    ) -> SyncReport:
        enc = self.encoders.get(key)
        if enc is None:
            enc = self.encoders[key] = DeltaEncoder(_dtype(key))
        built = await asyncio.to_thread(enc.advance, named, version)
        groups: dict[int | None, list[WeightReceiver]] = {}
        for r in replicas:
            seq = self.held_seq(r, key)
            groups.setdefault(seq if seq is not None and enc.reachable(seq) else None, []).append(r)
        results = await asyncio.gather(
            *(self._send(enc, key, base, group, version, send) for base, group in groups.items()),
            return_exceptions=True,
        )
        reports = [x for x in results if isinstance(x, SyncReport)]
        errors = [x for x in results if isinstance(x, BaseException)]
        reports += [e.report for e in errors if isinstance(e, WeightSyncError) and e.report is not None]
        report = combine_reports(reports, len(replicas)) if reports else None
        if report is not None:
            report.changed_fraction = enc.changed_fraction
            report.full_bytes = enc.full_bytes
            report.encode_seconds = enc.encode_seconds if built else 0.0
        if errors:
            if not all(isinstance(e, WeightSyncError) for e in errors):
                raise next(e for e in errors if not isinstance(e, WeightSyncError))
            failures = {rid: why for e in errors for rid, why in e.failures.items()}  # type: ignore[union-attr]
            raise WeightSyncError(failures, report)
        assert report is not None
        return report

    async def _send(
        self,
        enc: DeltaEncoder,
        key: str | None,
        base: int | None,
        replicas: list[WeightReceiver],
        version: int,
        send: Send,
    ) -> SyncReport:
        pay = await asyncio.to_thread(enc.payload, base)
        try:
            report = await send(pay.items, replicas, version, expected_checksum=pay.checksum)
        except WeightSyncError as err:
            self._record(pay, key, replicas, err.report)
            if pay.encoding != "delta":
                raise
            failed = [r for r in replicas if r.replica_id in err.failures]
            logger.warning(
                "weight sync v%d: the delta failed on %s (%s); repairing with a full sync",
                version,
                [r.replica_id for r in failed],
                "; ".join(f"{rid}: {why}" for rid, why in err.failures.items()),
            )
            done = _tag(err.report, "delta", [r for r in replicas if r not in failed])
            full = await asyncio.to_thread(enc.payload, None)
            try:
                repair = await send(full.items, failed, version, expected_checksum=full.checksum)
            except WeightSyncError as err2:
                self._record(full, key, failed, err2.report)
                parts = [x for x in (done, _tag(err2.report, "full", failed)) if x is not None]
                raise WeightSyncError(err2.failures, combine_reports(parts, len(replicas)) if parts else None) from err
            self._record(full, key, failed, repair)
            parts = [x for x in (done, _tag(repair, "full", failed)) if x is not None]
            out = combine_reports(parts, len(replicas))
            out.repaired = sorted(r.replica_id for r in failed)
            return out
        self._record(pay, key, replicas, report)
        tagged = _tag(report, pay.encoding, replicas)
        assert tagged is not None
        return tagged

    def _record(
        self, pay: Payload, key: str | None, replicas: Sequence[WeightReceiver], report: SyncReport | None
    ) -> None:
        """Each replica whose checksum is the payload's version's holds it now; the others hold nothing known."""
        for r in replicas:
            got = getattr(report, "replica_checksums", {}).get(r.replica_id)
            if got == pay.checksum:
                self._held[r.replica_id] = (self._ref(r), key, pay.seq)
            else:
                self.forget(r)


def _tag(report: SyncReport | None, encoding: str, replicas: Sequence[WeightReceiver]) -> SyncReport | None:
    """``report`` with each of ``replicas`` marked as having received ``encoding``."""
    if report is None:
        return None
    ids = {r.replica_id for r in replicas}
    per_replica = vars(report).setdefault("per_replica_encoding", {})  # (a test's stand-in report has none)
    per_replica.update({rid: encoding for rid in ids})
    for rid in set(getattr(report, "per_replica_transport", ())) - ids:  # a failed delta's are repaired elsewhere
        per_replica.pop(rid, None)
    report.encoding = encoding
    return report


def combine_reports(reports: Sequence[SyncReport], num_replicas: int) -> SyncReport:
    """One report of several payloads pushed for one version (different encodings, engine dtypes or a repair): the
    bytes add up (each payload was made once), a later report's per-replica entries replace an earlier one's."""
    if len(reports) == 1:
        return reports[0]
    first = reports[0]
    out = SyncReport(
        version=first.version,
        bytes=sum(r.bytes for r in reports),
        num_replicas=num_replicas,
        num_buckets=sum(r.num_buckets for r in reports),
        seconds=max(r.seconds for r in reports),
        prepare_seconds=sum(r.prepare_seconds for r in reports),
        checksum=first.checksum,
        transport="+".join(sorted({t for r in reports for t in r.transport.split("+") if t != "none"})) or "none",
        full_bytes=sum(r.full_bytes for r in reports) if len(reports) > 1 else first.full_bytes,
        changed_fraction=first.changed_fraction,
        encode_seconds=max(r.encode_seconds for r in reports),
    )
    for r in reports:
        out.take_replicas_of(r)
    out.encoding = "+".join(sorted(set(out.per_replica_encoding.values()))) or first.encoding
    return out


# ---------------------------------------------------------------------------------------------------------------
# engine side
# ---------------------------------------------------------------------------------------------------------------
class DeltaShadow:
    """The engine's last verified weights, dense, under the trainer's names (vLLM's CPU linear layers keep only
    packed oneDNN handles, so a delta cannot be applied to them in place).

    Per update: :meth:`begin`; :meth:`take` on each load's tensors returns what to load now (a full payload: all of
    them, kept as the new shadow; a delta: nothing, it is applied to the shadow); :meth:`pending` at the finish
    returns the updated shadow to load; then :meth:`commit` with the verified checksum, or :meth:`abandon`. An
    update without the header (``weight_encoding: full``) drops the shadow.

    Memory: one copy of the weights in the engine's dtype, in the engine's process, from the first delta-encoded
    sync on.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        #: The checksum of :attr:`tensors` as last verified (None: nothing a delta may start from).
        self.checksum: str | None = None
        #: This update's encoding: ``"full"``, ``"delta"``, or None (no header: the shadow is not kept).
        self.mode: str | None = None
        #: Elements this update's delta wrote.
        self.changed = 0
        self._started = False
        self._old: dict[str, torch.Tensor] = {}
        self._idx: dict[str, torch.Tensor] = {}

    def begin(self) -> None:
        """A new update starts."""
        self.mode, self.changed, self._started, self._idx = None, 0, False, {}

    def drop(self) -> None:
        """Forget the shadow (the next delta is refused: a full sync follows)."""
        self.tensors, self.checksum, self._old = {}, None, {}

    def take(self, items: Items) -> Items:
        """One load's tensors in, the tensors to load now out (see the class docstring).

        Raises:
            WeightLoadError: The update is a delta from weights other than the shadow's (the engine restarted, or
                its last update failed): the trainer then repairs it with a full sync.
        """
        if not self._started:
            self._started = True
            if items and items[0][0] == DELTA_HEADER:
                meta = read_header(items[0][1])
                items = items[1:]
                self.mode = str(meta["encoding"])
                if self.mode == "delta" and (self.checksum is None or meta.get("base") != self.checksum):
                    held = self.checksum
                    self.drop()
                    raise WeightLoadError(
                        f"a delta from weights {meta.get('base')} arrived, but this engine holds {held}: a full "
                        f"sync is needed"
                    )
                if self.mode == "full":  # rebuilt from this payload (the old tensors' memory reused)
                    self._old, self.tensors = self.tensors, {}
            else:
                self.drop()
        elif items and items[0][0] == DELTA_HEADER:
            raise RuntimeError("a second delta header in one weight update")
        if self.mode is None:
            return items
        self.checksum = None  # in flux until the update is verified
        if self.mode == "full":
            for name, t in items:
                old = self._old.pop(name, None)
                if old is not None and old.shape == t.shape and old.dtype == t.dtype:
                    self.tensors[name] = old.copy_(t)
                else:
                    self.tensors[name] = t.detach().to("cpu", copy=True)
            return items
        for name, t in items:
            self._apply(name, t)
        return []

    def _target(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        dst = self.tensors.get(name)
        if dst is None:
            raise RuntimeError(f"delta for {name!r}, which the engine's last full sync did not bring")
        if dst.dtype != dtype:
            raise RuntimeError(f"delta for {name!r} is {dtype}, the engine holds {dst.dtype}")
        return dst

    def _apply(self, name: str, t: torch.Tensor) -> None:
        if name.endswith(IDX):
            self._idx[name[: -len(IDX)]] = t
        elif name.endswith(VAL):
            base = name[: -len(VAL)]
            idx = self._idx.pop(base, None)
            if idx is None:
                raise RuntimeError(f"{name!r} arrived without its indices {base + IDX!r}")
            dst = self._target(base, t.dtype).view(-1)
            if idx.numel() != t.numel() or (idx.numel() and int(idx.max()) >= dst.numel()):
                raise RuntimeError(f"delta for {base!r}: {idx.numel()} indices, {t.numel()} values")
            dst[idx] = t
            self.changed += idx.numel()
        else:
            dst = self._target(name, t.dtype)
            if dst.shape != t.shape:
                raise RuntimeError(f"{name!r}: received shape {tuple(t.shape)}, the engine holds {tuple(dst.shape)}")
            dst.copy_(t)
            self.changed += t.numel()

    def pending(self) -> Items:
        """At the finish of a delta update: the whole updated shadow, to load (else nothing)."""
        if self.mode != "delta":
            return []
        if self._idx:
            raise RuntimeError(f"indices without values for {sorted(self._idx)[:5]}")
        return list(self.tensors.items())

    def commit(self, checksum: str) -> None:
        """The update was verified: the shadow holds the weights of ``checksum``."""
        self._old = {}
        if self.mode is not None:
            self.checksum = checksum

    def abandon(self) -> None:
        """The update failed or was aborted: a shadow it touched is dropped."""
        if self.mode is not None:
            self.drop()
