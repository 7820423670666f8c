"""The engine driver's half of a weight update: the session that pauses the engine, the staging file the buckets are
copied into, and the verification (checksum, coverage, read-back; docs/rollout.md, "Weight transports").
:class:`WeightUpdates` is a base class of :class:`~.driver.VLLMEngine` and reaches the vLLM worker
(:mod:`.worker_extension`) through ``collective_rpc("lhr_*")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lightning_hybrid_rollout.errors import WeightLoadError
from lightning_hybrid_rollout.rollout.vllm.config import EngineState, VLLMEngineConfig
from lightning_hybrid_rollout.rollout.weights.receiver import BucketPayload, Span
from lightning_hybrid_rollout.rollout.weights.staging import ENGINE_PREFIX, SharedStaging, payload_nbytes

logger = logging.getLogger(__name__)


@dataclass
class _Session:
    """One weight update in progress (between ``begin_weight_update`` and its finish or abort)."""

    version: int
    resume: EngineState  # the state to return to afterwards
    t0: float
    begin_s: float
    offset: int = 0  # where the next load_weight_bucket goes in the staging file
    stage_s: float = 0.0  # seconds copying buckets into the staging file
    keep: bool = False  # in-flight requests frozen (keep mode), resumed at the end
    transports: set[str] = field(default_factory=set)  # the transports whose loads this update ran


class WeightUpdates:
    """The weight-update methods of :class:`~.driver.VLLMEngine` (see the module docstring).

    The engine provides ``config``, ``replica_id``, ``llm`` (its ``AsyncLLM``), ``state``, ``weight_version``, the
    request gate (``_ready``, ``_update_lock``) and :meth:`_abort_all`, and calls :meth:`_init_weight_updates` in its
    constructor.
    """

    config: VLLMEngineConfig
    replica_id: str
    llm: Any
    state: EngineState
    weight_version: int
    _ready: asyncio.Event
    _update_lock: asyncio.Lock

    def _init_weight_updates(self) -> None:
        self._checksum: str | None = None
        self._update: _Session | None = None
        self._update_watchdog: asyncio.Future[None] | None = None
        #: The ``LoRARequest`` of the engine's adapter once an adapter-only update installed one (one id, replaced in
        #: place at each update: lora_adapter.py), passed with every request admitted since; None: the base alone.
        self._lora_request: Any = None
        self._staging = SharedStaging(self.config.staging_dir, prefix=ENGINE_PREFIX)
        self._node_staging: tuple[str, int] | None = None
        self.last_update_info: dict[str, Any] = {}
        #: Verified updates per transport that delivered them (``health()["weight_syncs_by_transport"]``).
        self.syncs_by_transport: Counter[str] = Counter()
        from lightning_hybrid_rollout.rollout.weights.cuda_ipc import device_uuid

        #: The dtype the engine holds its weights in (``"bfloat16"``; reported at start): a delta is built in it.
        self.engine_dtype: str | None = None
        #: This process's CUDA device UUID (None on CPU): ``auto`` picks ``cuda_ipc`` when it is the trainer's.
        self._cuda_device = device_uuid()
        #: Bumped whenever the weights or the KV memory may have changed (every update session's end, a GPU wake):
        #: part of :meth:`cache_salt`, so even a version pushed twice never shares a prefix-cache entry.
        self._kv_epoch = 0

    def cache_salt(self) -> str:
        """The prefix-cache salt of a request admitted now: vLLM hashes it into the request's first KV block, so a
        request only ever reuses KV computed under the same weights (a prompt group, a continued partial rollout)
        and never KV of older weights, whether or not vLLM managed to reset its cache after the update."""
        return f"lhr.v{self.weight_version}.e{self._kv_epoch}"

    async def _drop_stale_kv(self, keep: bool) -> None:
        """After a load: free the old weights' cached KV (best effort) and, in keep mode, have the frozen requests
        recompute theirs under the new weights when they resume.

        New requests never need the reset (:meth:`cache_salt`); vLLM refuses it while a request holds KV blocks.
        In keep mode vLLM preempts the frozen requests instead (``reset_running_requests``): their prompt and tokens
        so far are prefilled again by the new weights, so every token after the update is the new weights' own. If
        that fails they are aborted and continue from their prefix (partial rollout), as in abort mode.
        """
        try:
            reset = bool(await self.llm.reset_prefix_cache(reset_running_requests=keep))
        except Exception as e:  # vLLM raises when it cannot free a preempted request's blocks
            logger.debug("replica %s: prefix cache reset failed: %s", self.replica_id, e)
            reset = False
        logger.debug("replica %s: prefix cache reset after v%d: %s", self.replica_id, self.weight_version, reset)
        if keep and not reset:
            logger.warning(
                "replica %s: vLLM could not recompute the frozen requests' KV under v%d; aborting them instead",
                self.replica_id,
                self.weight_version,
            )
            await self._abort_all()

    async def _abort_all(self) -> int:
        """Abort every in-flight request and wait (bounded) until their streams ended (the engine's)."""
        raise NotImplementedError

    async def _freeze_all(self) -> None:
        """Keep mode: freeze every in-flight request in place, its KV cache kept (the engine's)."""
        raise NotImplementedError

    def _mark_version(self, version: int) -> None:
        """Keep mode: every frozen request's tokens from here on are of ``version`` (the engine's)."""
        raise NotImplementedError

    async def _rpc(self, method: str, *args: Any) -> Any:
        return (await self.llm.collective_rpc(method, args=args))[0]

    # ---- the session ----------------------------------------------------------------------------------------------
    async def begin_weight_update(self, version: int, total_bytes: int = 0, keep: bool = False) -> None:
        """Start a weight update: abort in-flight requests, hold new ones back, size the staging buffer.

        Args:
            version: Version the engine reports once :meth:`finish_weight_update` verified the load.
            total_bytes: Total serialized size of the buckets :meth:`load_weight_bucket` will bring (0 for the node
                staging file, a staged commit and the other transports).
            keep: Freeze the in-flight requests in place instead (vLLM ``pause_generation(mode="keep",
                clear_cache=False)``): they continue after the update with their KV cache, no re-prefill; each one's
                result says from which token on it was generated by ``version`` (``info["version_splits"]``).
        """
        if self.llm is None:
            raise WeightLoadError(f"replica {self.replica_id}: engine is not running")
        if self.state == "parked" and self.config.sleep_mode():
            raise WeightLoadError(f"replica {self.replica_id}: engine is asleep (GPU); wake_up() before syncing")
        t_begin = time.perf_counter()
        await self._update_lock.acquire()
        resume_state: EngineState = self.state if self.state in ("active", "parked") else "active"
        try:
            self.state = "syncing"
            self._ready.clear()
            if keep:
                await self._freeze_all()
            else:
                await self._abort_all()
            if total_bytes > 0:
                await self._ensure_staging(total_bytes)
            await self._rpc("lhr_begin_update")
            self._update = _Session(
                version=version, resume=resume_state, t0=t_begin, begin_s=time.perf_counter() - t_begin, keep=keep
            )
        except BaseException:
            self._end_update(resume_state)
            raise
        self._update_watchdog = asyncio.ensure_future(self._watch_update(self._update))

    async def _watch_update(self, upd: _Session) -> None:
        """Abort an update nobody finishes (the driver died mid-sync): the engine must not stay blocked."""
        await asyncio.sleep(self.config.update_timeout_s)
        if self._update is upd:
            logger.warning(
                "replica %s: weight update v%s not finished after %.0f s; aborting it (weights now unknown)",
                self.replica_id,
                upd.version,
                self.config.update_timeout_s,
            )
            await self.abort_weight_update()

    def _end_update(self, state: EngineState) -> None:
        watchdog, self._update_watchdog = self._update_watchdog, None
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()
        if self._update is not None and self._update.keep and self.llm is not None:
            self._resume_task = asyncio.ensure_future(self.llm.resume_generation())  # the frozen requests go on
        self._update = None
        self._kv_epoch += 1  # whatever the session loaded (all, part or nothing), older KV must not serve
        self.state = state
        self._ready.set()
        if self._update_lock.locked():
            self._update_lock.release()

    async def _session_rpc(self, method: str, rpc: str, *args: Any, transport: str = "") -> Any:
        """Worker call ``rpc`` inside the open session; if it fails, the session is aborted (and the error raised).

        ``transport``: the transport delivering this load (counted once the update is verified)."""
        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: {method}() outside begin/finish")
        if transport:
            self._update.transports.add(transport)
        try:
            return await self._rpc(rpc, *args)
        except BaseException:
            await self.abort_weight_update()
            raise

    async def finish_weight_update(self) -> str:
        """Finalize the reload, verify it (coverage + read-back) and return the worker-side checksum."""
        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: finish_weight_update() without begin")
        upd = self._update
        t_finish = time.perf_counter()
        try:
            info = await self._rpc("lhr_finish_update")
        except BaseException as e:
            self._checksum = None
            self._end_update(upd.resume)
            if isinstance(e, Exception) and not isinstance(e, WeightLoadError):
                raise WeightLoadError(f"replica {self.replica_id}: weight update failed: {e}") from e
            raise
        if info.get("error"):
            self._checksum = None
            self._end_update(upd.resume)
            raise WeightLoadError(f"replica {self.replica_id}: {info['error']}")
        self._checksum = info["checksum"]
        self.weight_version = int(upd.version)
        if info.get("mode") == "adapter" and self._lora_request is None:
            from lightning_hybrid_rollout.rollout.vllm.lora_adapter import adapter_request

            self._lora_request = adapter_request()  # the engine holds an adapter now: requests name it
        self.syncs_by_transport.update(upd.transports)
        info["transports"] = sorted(upd.transports)
        if upd.keep:
            self._mark_version(self.weight_version)
        try:
            await self._drop_stale_kv(upd.keep)
        except BaseException:  # cancelled: the engine must not stay paused
            self._end_update(upd.resume)
            raise
        info["seconds"] = time.perf_counter() - upd.t0
        info["finish_s"] = time.perf_counter() - t_finish
        info["begin_s"], info["stage_s"] = upd.begin_s, upd.stage_s
        self.last_update_info = info
        self._end_update(upd.resume)
        logger.info(
            "replica %s: weights v%d loaded in %.3f s (%d tensors, read-back %d/%d params)",
            self.replica_id,
            self.weight_version,
            time.perf_counter() - upd.t0,
            info.get("tensors", -1),
            info.get("readback_verified", -1),
            info.get("params", -1),
        )
        return info["checksum"]

    async def abort_weight_update(self) -> None:
        """Give up an update half-way: vLLM restores the old tensors of layers that got nothing; the engine's
        checksum becomes unknown until the next complete update."""
        if self._update is None:
            return
        upd = self._update
        with contextlib.suppress(Exception):
            await self._rpc("lhr_abort_update")
        self._checksum = None
        self._end_update(upd.resume)

    # ---- the engine's staging file (buckets that came through Ray) ------------------------------------------------
    async def _ensure_staging(self, nbytes: int, touch: bool = False) -> None:
        """Grow the shared staging file to ``nbytes`` (the worker maps the new one; the name is unlinked at once).

        ``touch``: fault the pages in now rather than during the first sync.
        """
        new_path = self._staging.ensure(nbytes, touch=touch)
        if new_path is None:
            return
        try:
            await self._rpc("lhr_attach_staging", new_path, self._staging.size)
        finally:
            self._staging.unlink()

    def _check_room(self, off: int, n: int) -> None:
        if off + n > self._staging.size:
            raise WeightLoadError(
                f"replica {self.replica_id}: bucket of {n} bytes at offset {off} overflows the staging buffer "
                f"({self._staging.size} bytes); pass the real total to begin_weight_update()"
            )

    async def load_weight_bucket(self, bucket: BucketPayload) -> dict[str, Any]:
        """Load one bucket: a :class:`~lightning_hybrid_rollout.rollout.weights.format.WeightBucket` or a
        safetensors blob (bytes / uint8 array), copied into the staging file after the previous one."""
        upd = self._update
        if upd is None:
            raise WeightLoadError(f"replica {self.replica_id}: load_weight_bucket() outside begin/finish")
        off = upd.offset
        t = time.perf_counter()
        try:
            n = payload_nbytes(bucket)
            self._check_room(off, n)
            self._staging.write(bucket, off)
            upd.stage_s += time.perf_counter() - t
            upd.transports.add("ray")
            info = await self._rpc("lhr_load_bucket", off, n)
        except BaseException:
            await self.abort_weight_update()
            raise
        upd.offset = off + n
        return info

    async def stage_weight_bucket(self, bucket: BucketPayload, offset: int, total_bytes: int) -> float:
        """Copy a bucket into this engine's staging file at ``offset`` while the engine keeps serving (staged sync).

        The bytes are loaded later, in the commit, by :meth:`load_weight_from_staging`. Returns the copy seconds.
        """
        if self.llm is None:
            raise WeightLoadError(f"replica {self.replica_id}: engine is not running")
        if self._update is not None:
            raise WeightLoadError(f"replica {self.replica_id}: cannot stage weights during a weight update")
        await self._ensure_staging(total_bytes)
        t = time.perf_counter()
        n = payload_nbytes(bucket)
        self._check_room(offset, n)
        self._staging.write(bucket, offset)
        return time.perf_counter() - t

    async def load_weight_from_staging(self, spans: list[Span]) -> dict[str, Any]:
        """Commit of a staged sync: load the buckets :meth:`stage_weight_bucket` put at ``spans`` in one call."""
        return await self._session_rpc(
            "load_weight_from_staging",
            "lhr_load_spans",
            [(int(o), int(n)) for o, n in spans],
            "staging",
            transport="ray",
        )

    # ---- the trainer's node staging file --------------------------------------------------------------------------
    async def attach_node_staging(self, path: str, size: int, inode: int) -> bool:
        """Map the trainer's node-local shared-memory staging file in the worker.

        Returns False when the file is not visible here (the replica runs on another node) or is not the one the
        trainer made (``inode`` differs): the caller then sends this replica its buckets through Ray instead.
        """
        if self.llm is None:
            raise WeightLoadError(f"replica {self.replica_id}: engine is not running")
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_ino != inode or st.st_size < size:
            return False
        if self._node_staging != (path, size):
            await self._rpc("lhr_attach_node_staging", path, size)
            self._node_staging = (path, size)
        return True

    async def load_weight_from_node_staging(self, spans: list[Span]) -> dict[str, Any]:
        """Load the buckets the trainer wrote at ``spans`` (``(offset, nbytes)`` each) of the node staging file, in
        one call to the worker (no copy on this side)."""
        if self._update is not None and self._node_staging is None:
            raise WeightLoadError(f"replica {self.replica_id}: no node staging file attached")
        return await self._session_rpc(
            "load_weight_from_node_staging",
            "lhr_load_spans",
            [(int(o), int(n)) for o, n in spans],
            "node",
            transport="node_shm",
        )

    # ---- every other transport ----------------------------------------------------------------------------------
    async def receive_weights(self, transport: str, request: Any) -> dict[str, Any]:
        """Hand ``request`` to the worker's receiver of ``transport`` (:mod:`~lightning_hybrid_rollout.rollout.
        weights.factory`): a join or a staged bucket while the engine serves, a load inside the open session."""
        if self.llm is None:
            raise WeightLoadError(f"replica {self.replica_id}: engine is not running")
        blob = pickle.dumps(request)  # crosses vLLM's RPC as bytes
        if request.in_session:
            return await self._session_rpc("receive_weights", "lhr_receive", transport, blob, transport=transport)
        if self._update is not None:
            raise WeightLoadError(f"replica {self.replica_id}: {type(request).__name__} during a weight update")
        return await self._rpc("lhr_receive", transport, blob)

    # ---- the current weights --------------------------------------------------------------------------------------
    async def weights_checksum(self) -> str:
        """Checksum of the last verified load, after re-checking the materialized parameters did not change."""
        if self._checksum is None:
            raise WeightLoadError(
                f"replica {self.replica_id}: weights are in an unknown state (a weight update failed); push again"
            )
        res = await self._rpc("lhr_check_fingerprint")
        if not res["ok"]:
            raise WeightLoadError(f"replica {self.replica_id}: loaded weights changed since the last sync: {res}")
        return self._checksum
