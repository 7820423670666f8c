"""vLLM ``AsyncLLM``-backed :class:`~lightning_hybrid_rollout.rollout.engine.RolloutEngine` (CPU and GPU).

Process layout (one engine): the frontend (``AsyncLLM``, in the process that creates the engine, normally a Ray
replica actor) and one ``EngineCore`` process that also hosts the model worker. On CPU the engine runs with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the core and the worker share that one process (a third process would
fight them for a pinned core); the frontend spawns the core, so the creating program needs the
``if __name__ == "__main__":`` idiom unless it is a Ray worker.

Weights (see :mod:`.weight_sync` for the trainer side): the frontend owns a shared-memory *staging file* (``/dev/shm``;
its name is unlinked as soon as both processes mapped it, so nothing leaks if the actor is killed). A weight update
is a session: :meth:`VLLMEngine.begin_weight_update` aborts in-flight requests and holds new ones back,
:meth:`VLLMEngine.load_weight_bucket` copies each safetensors bucket into the staging file (one copy) and the
worker feeds zero-copy views of it to vLLM's layer-wise in-place reload (a replica on the trainer's node instead
maps the trainer's node staging file once, :meth:`VLLMEngine.attach_node_staging`, and loads each bucket straight
from it with :meth:`VLLMEngine.load_weight_from_node_staging`: no copy on this side);
:meth:`VLLMEngine.finish_weight_update` finalizes the reload and returns the worker's verification:

- ``checksum``: :func:`~.weight_sync.checksum_state` of the tensors the *worker* received and fed to
  ``load_weights`` (HF names, so it is comparable with the trainer's);
- coverage: every parameter of the vLLM model was written by this update (otherwise vLLM silently keeps the old
  values for it: an error here);
- read-back: every parameter vLLM keeps materialized is compared with the received tensors (fused ``qkv_proj`` /
  ``gate_up_proj`` are re-derived from the HF pieces). On CPU vLLM repacks linear weights into oneDNN handles and
  drops the tensors, so read-back covers embeddings and norms only; on GPU it covers every parameter.

``weights_checksum()`` re-reads the materialized parameters, compares them with the fingerprint recorded at the
last verified load, and returns that load's checksum (or raises :class:`WeightLoadError` if they drifted, e.g.
after a GPU wake-up restored stale memory).

Sleep: on GPU (``enable_sleep_mode``) level-1 sleep; wake-up restores weights first, then the KV cache (avoids the
OOM of vLLM #13941), then re-verifies the weight fingerprint. On CPU vLLM's sleep mode is unavailable, so sleep
*parks* the engine: new requests are answered at once with ``finish_reason="abort"``, in-flight ones are aborted,
and the idle engine core blocks on its input queue (its core is really free; ``tests/rollout/test_replica.py``
measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import mmap
import os
import resource
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from lightning_hybrid_rollout.errors import WeightLoadError as WeightLoadError  # re-exported
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.run_guard import default_staging_dir

logger = logging.getLogger(__name__)

EngineState = Literal["starting", "active", "parked", "syncing", "stopped", "dead"]


@dataclass
class VLLMEngineConfig:
    """Settings of one vLLM engine (mirrors the rollout part of the run config).

    Args:
        model: Model directory (HF layout) or name.
        dtype: Model dtype; ``float32`` gives exact parity with a float32 transformers model.
        max_model_len: Longest prompt + response.
        kv_cache_memory_bytes: KV cache size (always bound it on CPU: the default takes most of the node's memory).
        enforce_eager: No torch.compile / CUDA graphs for the model (compile is not faster for tiny models).
        seed: Engine seed.
        max_num_seqs: Most sequences in one batch.
        logprobs_mode: Which log-probabilities to return (``processed_logprobs``: of the distribution actually sampled
            from, after temperature/top-p; ``raw_logprobs``: of the model's raw logits).
        return_logprobs: Return the sampled token's log-probability for every generated token.
        enable_sleep_mode: vLLM sleep mode (``None``: on when CUDA is available; it is CUDA-only).
        gpu_memory_utilization: GPU memory fraction for vLLM (GPU only).
        tensor_parallel_size: Tensor parallel degree (GPU only).
        single_process: CPU: run engine core and worker in one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
        disable_torch_compile: CPU: set ``TORCH_COMPILE_DISABLE=1`` so vLLM's few ``torch.compile``'d helpers (e.g.
            the logprob rank count) run eagerly instead of costing a 3-25 s C++ compile on the first request.
        run_dir: Where TMPDIR / the vLLM cache point (vLLM leaves socket files behind); default: a temp dir.
        staging_dir: Directory of the shared-memory weight staging file (default ``/dev/shm`` if present).
        abort_timeout_s: How long to wait for aborted requests to drain before a weight update / park proceeds.
        update_timeout_s: A weight update not finished this long after it began is aborted (driver died mid-sync).
        verify_initial_weights: At start, hash the checkpoint on disk and read back the engine's materialized
            parameters against it, so :meth:`VLLMEngine.weights_checksum` is meaningful before the first sync.
        presize_staging: At start, size (and fault in) the shared-memory staging file for the checkpoint's size, so
            the first weight sync is as fast as the next ones (costs that much shared memory per engine).
        keep_freed_memory: CPU: tell glibc (``MALLOC_*`` variables of the engine process) to keep freed memory
            rather than return it to the OS. A weight sync frees and reallocates every linear layer's packed weights;
            without this each sync page-faults them in afresh, which made the reload up to 3x slower (measured in
            ``benchmarks/weight_sync.py``). The engine then keeps about one model's size of freed memory.
        direct_reload: CPU: load a weight update by packing each linear layer's oneDNN weights straight from the
            received (shared-memory) tensors, and copying the other parameters in place, instead of vLLM's
            layer-wise reload (which materializes every layer, copies into it, packs, and frees it): half the memory
            traffic, about 2x faster (``benchmarks/weight_sync.py``). Used only where it is exact: unquantized
            models on the oneDNN path whose checkpoint names map onto the vLLM modules; otherwise the layer-wise
            reload runs. ``health()["last_update"]["mode"]`` says which one ran.
        extra_engine_args: More ``AsyncEngineArgs`` fields.
    """

    model: str
    dtype: str = "float32"
    max_model_len: int = 512
    kv_cache_memory_bytes: int = 256 * 2**20
    enforce_eager: bool = True
    seed: int = 0
    max_num_seqs: int = 64
    logprobs_mode: str = "processed_logprobs"
    return_logprobs: bool = True
    enable_sleep_mode: bool | None = None
    gpu_memory_utilization: float = 0.4
    tensor_parallel_size: int = 1
    single_process: bool = True
    disable_torch_compile: bool = True
    run_dir: str | None = None
    staging_dir: str | None = None
    abort_timeout_s: float = 30.0
    update_timeout_s: float = 600.0
    verify_initial_weights: bool = True
    presize_staging: bool = True
    keep_freed_memory: bool = True
    direct_reload: bool = True
    extra_engine_args: dict[str, Any] = field(default_factory=dict)

    @property
    def on_cuda(self) -> bool:
        """Whether this engine will run on a CUDA device."""
        return torch.cuda.is_available()

    def sleep_mode(self) -> bool:
        """Effective sleep-mode flag."""
        return self.on_cuda if self.enable_sleep_mode is None else bool(self.enable_sleep_mode and self.on_cuda)

    def process_env(self, on_cuda: bool | None = None) -> dict[str, str]:
        """Environment variables the engine needs set *before* it starts (the engine core process inherits them).

        Args:
            on_cuda: Whether the engine's process will see a GPU (default: whether this process does).
        """
        env: dict[str, str] = {"VLLM_NO_USAGE_STATS": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        if not (self.on_cuda if on_cuda is None else on_cuda):
            if self.keep_freed_memory:
                # glibc: serve allocations up to 32 MiB from the heap and keep freed heap memory instead of returning
                # it to the OS, so every weight sync's reload reuses warm pages instead of page-faulting fresh ones
                env["MALLOC_MMAP_THRESHOLD_"] = str(32 * 2**20)
                env["MALLOC_TRIM_THRESHOLD_"] = str(2**40)
                env["MALLOC_TOP_PAD_"] = str(64 * 2**20)
            if self.single_process:
                env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            if self.disable_torch_compile:
                env["TORCH_COMPILE_DISABLE"] = "1"
        return env


# ---------------------------------------------------------------------------------------------------------------
# frontend side
# ---------------------------------------------------------------------------------------------------------------
_MAX_TMPDIR_LEN = 60  # vLLM puts ZMQ sockets at $TMPDIR/<uuid4>; a Unix socket path must stay under 108 bytes


def short_tmp_dir(preferred: str | os.PathLike[str]) -> Path:
    """``preferred`` if short enough for vLLM's IPC socket paths, else a short per-user dir under ``/tmp``."""
    path = Path(preferred)
    if len(str(path)) > _MAX_TMPDIR_LEN:
        import hashlib

        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        path = Path("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()) / f"lhr-{os.getuid()}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    return path


class _Staging:
    """A shared-memory file the frontend writes weight buckets into and the vLLM worker maps read-only."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory or str(default_staging_dir())
        self.size = 0
        self.mm: mmap.mmap | None = None
        self.path: str | None = None

    def ensure(self, nbytes: int) -> str | None:
        """Make the buffer at least ``nbytes``; returns the new file path if one was created (worker must attach)."""
        if self.mm is not None and self.size >= nbytes:
            return None
        self.close()
        size = max(nbytes, 1 << 20)
        path = os.path.join(self.directory, f"lhr-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.size, self.path = size, path
        return path

    def unlink(self) -> None:
        """Remove the file name (both mappings stay valid; memory is freed when both processes unmap)."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self) -> None:
        self.unlink()
        if self.mm is not None:
            with contextlib.suppress(BufferError):
                self.mm.close()
        self.mm, self.size, self.path = None, 0, None


class VLLMEngine:
    """A :class:`~lightning_hybrid_rollout.rollout.engine.RolloutEngine` on ``vllm.v1.engine.async_llm.AsyncLLM``.

    Create it with :meth:`create` (or the constructor, then :meth:`start`) inside the process that will own it.

    Args:
        config: Engine settings.
        replica_id: Name used in results, logs and errors.
        weight_version: Version of the weights in ``config.model``.
    """

    def __init__(self, config: VLLMEngineConfig, replica_id: str = "engine", weight_version: int = 0) -> None:
        self.config = config
        self.replica_id = replica_id
        self.weight_version = weight_version
        self.state: EngineState = "starting"
        self.llm: Any = None
        self.start_seconds = 0.0
        self.engine_pid: int | None = None
        self._checksum: str | None = None
        self._inflight: dict[str, int] = {}
        self._inflight_tokens: dict[str, int] = {}
        self._abort_requested: set[str] = set()
        self._ready = asyncio.Event()
        self._update_lock = asyncio.Lock()
        self._update: dict[str, Any] | None = None
        self._update_watchdog: asyncio.Future[None] | None = None
        self._staging = _Staging(config.staging_dir)
        self._node_staging: tuple[str, int] | None = None
        self._tmp_dir: Path | None = None
        self._tokens_generated = 0
        self._sleep_seconds: list[float] = []
        self.timings: dict[str, float] = {}
        self.last_update_info: dict[str, Any] = {}

    # ---- lifecycle ------------------------------------------------------------------------------------------------
    @classmethod
    async def create(cls, config: VLLMEngineConfig, replica_id: str = "engine", weight_version: int = 0) -> VLLMEngine:
        """Build and start an engine (runs the blocking start in a thread so the event loop stays responsive)."""
        eng = cls(config, replica_id, weight_version)
        await asyncio.to_thread(eng._build)
        await eng._post_start()
        return eng

    def start(self) -> None:
        """Blocking start (for synchronous callers, e.g. a Ray actor ``__init__``); call :meth:`post_start` after."""
        self._build()

    async def post_start(self) -> None:
        """Async part of the start (initial weight verification); :meth:`create` calls it for you."""
        await self._post_start()

    def _build(self) -> None:
        t_import = time.perf_counter()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.timings["import_vllm_s"] = time.perf_counter() - t_import
        cfg = self.config
        os.environ.update(cfg.process_env())
        run_dir = Path(cfg.run_dir) if cfg.run_dir else Path(tempfile.gettempdir()) / "lhr-vllm"
        run_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("VLLM_CACHE_ROOT", str(run_dir / "vllm-cache"))
        self._tmp_dir = short_tmp_dir(run_dir / "tmp" / uuid.uuid4().hex[:8])  # this engine's; removed at shutdown
        os.environ["TMPDIR"] = str(self._tmp_dir)
        tempfile.tempdir = None  # re-read TMPDIR
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "dtype": cfg.dtype,
            "max_model_len": cfg.max_model_len,
            "enforce_eager": cfg.enforce_eager,
            "seed": cfg.seed,
            "max_num_seqs": cfg.max_num_seqs,
            "logprobs_mode": cfg.logprobs_mode,
            "worker_extension_cls": f"{__name__}.LHRWorkerExtension",
            "disable_log_stats": True,
        }
        if cfg.on_cuda:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            kwargs["tensor_parallel_size"] = cfg.tensor_parallel_size
            kwargs["enable_sleep_mode"] = cfg.sleep_mode()
        else:
            kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
        kwargs.update(cfg.extra_engine_args)
        t = time.perf_counter()
        try:
            self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except Exception as e:
            self.state = "dead"
            raise RuntimeError(
                f"replica {self.replica_id}: vLLM engine failed to start for model {cfg.model!r} "
                f"({type(e).__name__}: {e}). On CPU check kv_cache_memory_bytes fits in memory and that the model "
                f"dir has config.json + safetensors + tokenizer."
            ) from e
        self.start_seconds = time.perf_counter() - t
        self.timings["engine_start_s"] = self.start_seconds

    async def _post_start(self) -> None:
        t = time.perf_counter()
        info = (
            await self.llm.collective_rpc(
                "lhr_init", args=(self.config.verify_initial_weights, self.config.direct_reload)
            )
        )[0]
        self.timings["init_rpc_s"] = time.perf_counter() - t
        self.engine_pid = int(info["pid"])
        self._checksum = info.get("checksum")
        self.timings["direct_reload"] = float(bool(info.get("direct_reload")))
        if self.config.presize_staging and info.get("checkpoint_bytes"):
            await self._ensure_staging(int(info["checkpoint_bytes"]) + (1 << 20), touch=True)
        self.state = "active"
        self._ready.set()
        logger.info(
            "replica %s: vLLM engine up in %.1f s (engine pid %s, initial checksum %s)",
            self.replica_id,
            self.start_seconds,
            self.engine_pid,
            self._checksum,
        )

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine (aborts everything; the engine core is killed if it does not exit within ``timeout``)."""
        if self.llm is None:
            return
        self._ready.set()
        self.state = "stopped"
        llm, self.llm = self.llm, None
        with contextlib.suppress(Exception):
            await asyncio.to_thread(llm.shutdown, timeout)
        self._staging.close()
        if self._tmp_dir is not None:  # vLLM leaves its IPC socket files there
            shutil.rmtree(self._tmp_dir, ignore_errors=True)

    # ---- generation -----------------------------------------------------------------------------------------------
    def _aborted_result(self, request_id: str, reason: str) -> GenerationResult:
        return GenerationResult(
            request_id=request_id,
            token_ids=[],
            logprobs=[],
            finish_reason="abort",
            weight_version=self.weight_version,
            replica_id=self.replica_id,
            info={"rejected": reason},
        )

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        """Generate one response.

        A parked (sleeping) or stopped engine answers at once with ``finish_reason="abort"``, no tokens and
        ``info["rejected"]``; during a weight update the request waits for the new weights.

        Args:
            request_id: Unique id (also what :meth:`abort` takes).
            prompt_token_ids: The prompt (including any partial-rollout prefix).
            sampling: Sampling parameters.

        Returns:
            A :class:`GenerationResult` (``logprobs[i]`` is the log-probability of ``token_ids[i]``).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if self.state in ("parked", "stopped", "dead") or self.llm is None:
            return self._aborted_result(request_id, self.state)
        if not self._ready.is_set():
            await self._ready.wait()
            if self.state != "active":
                return self._aborted_result(request_id, self.state)
        if sampling.max_tokens <= 0:
            return GenerationResult(request_id, [], [], "length", self.weight_version, self.replica_id)
        if request_id in self._inflight:
            raise ValueError(f"replica {self.replica_id}: request id {request_id!r} is already in flight")
        params = SamplingParams(
            n=1,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=getattr(sampling, "ignore_eos", False),
            logprobs=0 if self.config.return_logprobs else None,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
        )
        version = self.weight_version
        self._inflight[request_id] = version
        tokens: list[int] = []
        logprobs: list[float] = []
        finish: str | None = None
        t0 = time.perf_counter()
        try:
            async for out in self.llm.generate(
                TokensPrompt(prompt_token_ids=list(prompt_token_ids)), params, request_id=request_id
            ):
                comp = out.outputs[0]
                new = list(comp.token_ids)
                tokens.extend(new)
                self._inflight_tokens[request_id] = len(tokens)
                if self.config.return_logprobs:
                    lps = comp.logprobs or []
                    for i, tok in enumerate(new):
                        logprobs.append(float(lps[i][tok].logprob) if i < len(lps) else float("nan"))
                if comp.finish_reason is not None:
                    finish = comp.finish_reason
                if request_id in self._abort_requested and not out.finished:
                    await self.llm.abort(request_id)  # abort arrived before vLLM knew the request
        finally:
            self._inflight.pop(request_id, None)
            self._inflight_tokens.pop(request_id, None)
            self._abort_requested.discard(request_id)
        self._tokens_generated += len(tokens)
        reason = finish if finish in ("stop", "length", "abort") else "abort"
        return GenerationResult(
            request_id=request_id,
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason=reason,  # type: ignore[arg-type]
            weight_version=version,
            replica_id=self.replica_id,
            info={"seconds": time.perf_counter() - t0, "vllm_finish_reason": finish},
        )

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in-flight requests (unknown ids are ignored); their ``generate`` returns the partial output."""
        live = [r for r in request_ids if r in self._inflight]
        if not live or self.llm is None:
            return
        self._abort_requested.update(live)
        await self.llm.abort(live)

    async def _abort_all(self) -> int:
        """Abort every in-flight request and wait (bounded) until their streams ended."""
        live = list(self._inflight)
        if live and self.llm is not None:
            self._abort_requested.update(live)
            await self.llm.abort(live)
        deadline = time.monotonic() + self.config.abort_timeout_s
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        if self._inflight:
            logger.warning(
                "replica %s: %d aborted requests still in flight after %.0f s",
                self.replica_id,
                len(self._inflight),
                self.config.abort_timeout_s,
            )
        return len(live)

    # ---- sleep / wake ---------------------------------------------------------------------------------------------
    async def sleep(self) -> float:
        """Stop serving: abort in-flight requests, refuse new ones; GPU: level-1 sleep. Returns seconds taken."""
        t0 = time.perf_counter()
        if self.state == "parked":
            return 0.0
        async with self._update_lock:
            self.state = "parked"
            self._ready.set()  # waiters wake up and see "parked"
            await self._abort_all()
            if self.config.sleep_mode():
                await self.llm.sleep(level=1)
        dt = time.perf_counter() - t0
        self._sleep_seconds.append(dt)
        return dt

    async def wake_up(self) -> float:
        """Serve again; GPU: weights first, then KV cache, then the weight fingerprint is re-checked."""
        t0 = time.perf_counter()
        if self.state != "parked":
            return 0.0
        async with self._update_lock:
            if self.config.sleep_mode():
                await self.llm.wake_up(tags=["weights"])
                await self.llm.wake_up(tags=["kv_cache"])
                await self.llm.reset_prefix_cache()
                await self.weights_checksum()
            self.state = "active"
            self._ready.set()
        return time.perf_counter() - t0

    # ---- weights --------------------------------------------------------------------------------------------------
    async def _rpc(self, method: str, *args: Any) -> Any:
        return (await self.llm.collective_rpc(method, args=args))[0]

    async def begin_weight_update(self, version: int, total_bytes: int) -> None:
        """Start a weight update: abort in-flight requests, hold new ones back, size the staging buffer.

        Args:
            version: Version the engine reports once :meth:`finish_weight_update` verified the load.
            total_bytes: Total serialized size of the staged buckets that will follow (0 for the GPU transports).
        """
        if self.llm is None:
            raise WeightLoadError(f"replica {self.replica_id}: engine is not running")
        if self.state == "parked" and self.config.sleep_mode():
            raise WeightLoadError(f"replica {self.replica_id}: engine is asleep (GPU); wake_up() before syncing")
        t_begin = time.perf_counter()
        await self._update_lock.acquire()
        resume_state = self.state if self.state in ("active", "parked") else "active"
        try:
            self.state = "syncing"
            self._ready.clear()
            await self._abort_all()
            if total_bytes > 0:
                await self._ensure_staging(total_bytes)
            await self._rpc("lhr_begin_update")
            self._update = {
                "version": version,
                "offset": 0,
                "resume": resume_state,
                "t0": t_begin,
                "begin_s": time.perf_counter() - t_begin,
                "stage_s": 0.0,
            }
        except BaseException:
            self._end_update(resume_state)
            raise
        self._update_watchdog = asyncio.ensure_future(self._watch_update(self._update))

    async def _watch_update(self, upd: dict[str, Any]) -> None:
        """Abort an update nobody finishes (the driver died mid-sync): the engine must not stay blocked."""
        await asyncio.sleep(self.config.update_timeout_s)
        if self._update is upd:
            logger.warning(
                "replica %s: weight update v%s not finished after %.0f s; aborting it (weights now unknown)",
                self.replica_id,
                upd["version"],
                self.config.update_timeout_s,
            )
            await self.abort_weight_update()

    async def _ensure_staging(self, nbytes: int, touch: bool = False) -> None:
        """Grow the shared staging file to ``nbytes`` (the worker maps the new one; the name is unlinked at once)."""
        new_path = self._staging.ensure(nbytes)
        if new_path is None:
            return
        try:
            await self._rpc("lhr_attach_staging", new_path, self._staging.size)
        finally:
            self._staging.unlink()
        if touch:  # fault the pages in now rather than during the first sync
            import numpy as np

            assert self._staging.mm is not None
            np.frombuffer(self._staging.mm, dtype=np.uint8)[:] = 0

    def _end_update(self, state: str) -> None:
        watchdog, self._update_watchdog = self._update_watchdog, None
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()
        self._update = None
        self.state = state  # type: ignore[assignment]
        self._ready.set()
        if self._update_lock.locked():
            self._update_lock.release()

    async def load_weight_bucket(self, bucket: Any) -> dict[str, Any]:
        """Load one bucket: a :class:`~.weight_sync.WeightBucket` or a safetensors blob (bytes / uint8 array)."""
        import numpy as np

        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: load_weight_bucket() outside begin/finish")
        off = self._update["offset"]
        mm = self._staging.mm
        assert mm is not None
        t = time.perf_counter()
        try:
            if hasattr(bucket, "write_into"):
                n = bucket.nbytes
                self._check_room(off, n)
                bucket.write_into(np.frombuffer(mm, dtype=np.uint8), off)
            else:
                src = np.frombuffer(memoryview(bucket).cast("B"), dtype=np.uint8)
                n = src.nbytes
                self._check_room(off, n)
                np.frombuffer(mm, dtype=np.uint8)[off : off + n] = src
            self._update["stage_s"] += time.perf_counter() - t
            info = await self._rpc("lhr_load_bucket", off, n)
        except BaseException:
            await self.abort_weight_update()
            raise
        self._update["offset"] = off + n
        return info

    async def attach_node_staging(self, path: str, size: int, inode: int) -> bool:
        """Map the trainer's node-local shared-memory staging file (see ``weight_sync.NodeStaging``) in the worker.

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

    async def load_weight_from_node_staging(self, spans: list[tuple[int, int]]) -> dict[str, Any]:
        """Load the buckets the trainer wrote at ``spans`` (``(offset, nbytes)`` each) of the node staging file, in
        one call to the worker (no copy on this side)."""
        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: load_weight_from_node_staging() outside begin/finish")
        if self._node_staging is None:
            raise WeightLoadError(f"replica {self.replica_id}: no node staging file attached")
        try:
            return await self._rpc("lhr_load_spans", [(int(o), int(n)) for o, n in spans], "node")
        except BaseException:
            await self.abort_weight_update()
            raise

    async def stage_weight_bucket(self, bucket: Any, offset: int, total_bytes: int) -> float:
        """Copy a bucket into this engine's staging file at ``offset`` while the engine keeps serving (staged sync).

        The bytes are loaded later, in the commit, by :meth:`load_weight_from_staging`. Returns the copy seconds.
        """
        import numpy as np

        if self.llm is None:
            raise WeightLoadError(f"replica {self.replica_id}: engine is not running")
        if self._update is not None:
            raise WeightLoadError(f"replica {self.replica_id}: cannot stage weights during a weight update")
        await self._ensure_staging(total_bytes)
        t = time.perf_counter()
        mm = self._staging.mm
        assert mm is not None
        n = bucket.nbytes if hasattr(bucket, "write_into") else memoryview(bucket).nbytes
        self._check_room(offset, n)
        if hasattr(bucket, "write_into"):
            bucket.write_into(np.frombuffer(mm, dtype=np.uint8), offset)
        else:
            np.frombuffer(mm, dtype=np.uint8)[offset : offset + n] = np.frombuffer(
                memoryview(bucket).cast("B"), dtype=np.uint8
            )
        return time.perf_counter() - t

    async def load_weight_from_staging(self, spans: list[tuple[int, int]]) -> dict[str, Any]:
        """Commit of a staged sync: load the buckets :meth:`stage_weight_bucket` put at ``spans`` in one call."""
        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: load_weight_from_staging() outside begin/finish")
        try:
            return await self._rpc("lhr_load_spans", [(int(o), int(n)) for o, n in spans], "staging")
        except BaseException:
            await self.abort_weight_update()
            raise

    def _check_room(self, off: int, n: int) -> None:
        if off + n > self._staging.size:
            raise WeightLoadError(
                f"replica {self.replica_id}: bucket of {n} bytes at offset {off} overflows the staging buffer "
                f"({self._staging.size} bytes); pass the real total to begin_weight_update()"
            )

    async def load_weight_ipc(self, blob: bytes) -> dict[str, Any]:
        """GPU, colocated: load tensors from the trainer's CUDA IPC handles (see ``weight_sync.cuda_ipc_bucket``)."""
        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: load_weight_ipc() outside begin/finish")
        try:
            return await self._rpc("lhr_load_ipc", blob)
        except BaseException:
            await self.abort_weight_update()
            raise

    async def init_nccl_group(self, host: str, port: int, rank: int, world_size: int) -> bool:
        """GPU, standalone: join the trainer's NCCL broadcast group (rank >= 1; the trainer is rank 0)."""
        return await self._rpc("lhr_init_nccl", host, port, rank, world_size)

    async def stage_weight_nccl(self, meta: dict[str, Any]) -> dict[str, Any]:
        """GPU, staged sync: receive one broadcast bucket into a GPU buffer the engine keeps, while it serves."""
        if self._update is not None:
            raise WeightLoadError(f"replica {self.replica_id}: cannot stage weights during a weight update")
        return await self._rpc("lhr_stage_nccl", meta)

    async def load_weight_from_gpu_stage(self) -> dict[str, Any]:
        """GPU, staged sync commit: load every bucket :meth:`stage_weight_nccl` received."""
        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: load_weight_from_gpu_stage() outside begin/finish")
        try:
            return await self._rpc("lhr_load_gpu_stage")
        except BaseException:
            await self.abort_weight_update()
            raise

    async def load_weight_nccl(self, meta: dict[str, Any]) -> dict[str, Any]:
        """GPU, standalone: receive one NCCL-broadcast bucket (must run while the trainer broadcasts it)."""
        if self._update is None:
            raise WeightLoadError(f"replica {self.replica_id}: load_weight_nccl() outside begin/finish")
        try:
            return await self._rpc("lhr_load_nccl", meta)
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
            await self.llm.reset_prefix_cache()
        except BaseException as e:
            self._checksum = None
            self._end_update(upd["resume"])
            if isinstance(e, Exception) and not isinstance(e, WeightLoadError):
                raise WeightLoadError(f"replica {self.replica_id}: weight update failed: {e}") from e
            raise
        if info.get("error"):
            self._checksum = None
            self._end_update(upd["resume"])
            raise WeightLoadError(f"replica {self.replica_id}: {info['error']}")
        self._checksum = info["checksum"]
        self.weight_version = int(upd["version"])
        info["seconds"] = time.perf_counter() - upd["t0"]
        info["finish_s"] = time.perf_counter() - t_finish
        info["begin_s"], info["stage_s"] = upd["begin_s"], upd["stage_s"]
        self.last_update_info = info
        self._end_update(upd["resume"])
        logger.info(
            "replica %s: weights v%d loaded in %.3f s (%d tensors, read-back %d/%d params)",
            self.replica_id,
            self.weight_version,
            time.perf_counter() - upd["t0"],
            info.get("tensors", -1),
            info.get("readback_verified", -1),
            info.get("params", -1),
        )
        return self._checksum

    async def abort_weight_update(self) -> None:
        """Give up an update half-way: vLLM restores the old tensors of layers that got nothing; the engine's
        checksum becomes unknown until the next complete update."""
        if self._update is None:
            return
        upd = self._update
        with contextlib.suppress(Exception):
            await self._rpc("lhr_abort_update")
        self._checksum = None
        self._end_update(upd["resume"])

    async def update_weights(self, named_tensors_blob: Any, version: int) -> str:
        """Load full weights from one safetensors blob (bytes) or a sequence of buckets; returns the checksum."""
        buckets = named_tensors_blob if isinstance(named_tensors_blob, list | tuple) else [named_tensors_blob]
        total = sum(b.nbytes if hasattr(b, "write_into") else memoryview(b).nbytes for b in buckets)
        await self.begin_weight_update(version, total)
        for b in buckets:
            await self.load_weight_bucket(b)
        return await self.finish_weight_update()

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

    # ---- introspection --------------------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """State, weight version, in-flight count, checksum, engine pid; raises if the vLLM engine died."""
        if self.llm is not None:
            await self.llm.check_health()
        return {
            "replica_id": self.replica_id,
            "state": self.state,
            "weight_version": self.weight_version,
            "inflight": len(self._inflight),
            "tokens_in_flight": sum(self._inflight_tokens.values()),
            "checksum": self._checksum,
            "engine_pid": self.engine_pid,
            "frontend_pid": os.getpid(),
            "tokens_generated": self._tokens_generated,
            "start_seconds": self.start_seconds,
            "timings": dict(self.timings),
            "last_update": dict(self.last_update_info),
        }


# ---------------------------------------------------------------------------------------------------------------
# worker side (runs inside the vLLM engine-core / worker process; loaded via worker_extension_cls)
# ---------------------------------------------------------------------------------------------------------------
def _expected_param(pname: str, received: dict[str, torch.Tensor], packed: dict[str, list[str]]) -> torch.Tensor | None:
    """The HF tensor(s) a vLLM parameter should equal (fused projections are concatenated on dim 0)."""
    if pname in received:
        return received[pname]
    prefix, _, leaf = pname.rpartition(".")
    mod_prefix, _, mod = prefix.rpartition(".")
    parts = packed.get(mod)
    if not parts:
        return None
    pieces = [received.get(f"{mod_prefix}.{p}.{leaf}" if mod_prefix else f"{p}.{leaf}") for p in parts]
    if any(x is None for x in pieces):
        return None
    return torch.cat(pieces, dim=0)  # type: ignore[arg-type]


class LHRWorkerExtension:
    """Methods mixed into vLLM's worker (``worker_extension_cls``), called via ``collective_rpc("lhr_*")``."""

    # ---- helpers --------------------------------------------------------------------------------------------------
    def _lhr_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _lhr_fingerprint(self) -> dict[str, str]:
        from lightning_hybrid_rollout.rollout.weights.format import tensor_digest

        out = {}
        for name, p in self._lhr_model().named_parameters():
            if p.numel() == 0 or p.is_meta:
                continue
            if p.device.type == "cpu":
                out[name] = tensor_digest(name, p.detach())
            else:  # GPU: cheap device-side moments instead of copying every weight to the host
                v = p.detach().reshape(-1).double()
                idx = torch.arange(1, v.numel() + 1, device=v.device, dtype=torch.float64)
                out[name] = f"{v.sum().item():.17g}/{(v * v).sum().item():.17g}/{(v * idx).sum().item():.17g}"
        return out

    def _lhr_readback(self, received: dict[str, torch.Tensor]) -> tuple[int, int, list[str]]:
        model = self._lhr_model()
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        verified, skipped, bad = 0, 0, []
        first: dict[int, str] = {}
        # every name of a tied parameter (lm_head tied to embed_tokens): what the trainer sent under each must agree
        for name, p in model.named_parameters(remove_duplicate=False):
            canonical = first.setdefault(id(p), name)
            if p.numel() == 0 or p.is_meta:
                skipped += 1
                continue
            exp = _expected_param(name, received, packed)
            if exp is None:
                skipped += 1
                continue
            got = p.detach().cpu()
            if got.shape != exp.shape and got.dim() == exp.dim() and got.shape[1:] == exp.shape[1:]:
                got = got[: exp.shape[0]]  # vocab padding
            if got.shape != exp.shape or not torch.equal(got, exp.to(got.dtype)):
                bad.append(name if canonical == name else f"{name} (tied to {canonical})")
            else:
                verified += 1
        return verified, skipped, bad

    # ---- rpc methods ----------------------------------------------------------------------------------------------
    def _lhr_direct_plan(self, checkpoint_names: set[str]) -> dict[str, tuple[str, int, int]] | None:
        """``hf_name -> (module, part, parts)`` for every linear weight, when the direct reload is exact here.

        Exact means: CPU, oneDNN available and not the Zen path (the packed handle then owns a copy of the weights,
        so packing from the shared staging memory is safe), every linear layer unquantized with its dense weight
        dropped after packing, and each one's checkpoint names (fused projections: their parts, from the model's
        ``packed_modules_mapping``) present in the checkpoint on disk.
        """
        from vllm import _custom_ops as ops
        from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
        from vllm.platforms import current_platform

        if not current_platform.is_cpu() or not getattr(ops, "_supports_onednn", False):
            return None
        if getattr(current_platform, "is_zen_cpu", lambda: False)():
            return None
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
            VocabParallelEmbedding,
        )

        model = self._lhr_model()
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        plan: dict[str, tuple[str, int, int]] = {}
        # modules whose kernels hold a processed copy of a parameter loaded in place (on CPU the embedding / LM head
        # packs its weight for the logits matmul): re-processed after the in-place copy, keyed by parameter id
        self._lhr_reprocess: dict[int, list[torch.nn.Module]] = {}
        for mname, mod in model.named_modules():
            qm = getattr(mod, "quant_method", None)
            if isinstance(mod, VocabParallelEmbedding) and isinstance(qm, UnquantizedEmbeddingMethod):
                for p in mod.parameters(recurse=False):
                    self._lhr_reprocess.setdefault(id(p), []).append(mod)
                continue
            if not isinstance(mod, LinearBase):
                if qm is not None:  # a kind of layer this path does not know how to refresh (MoE, quantized, ...)
                    return None
                continue
            w = getattr(mod, "weight", None)
            if not isinstance(mod.quant_method, UnquantizedLinearMethod) or w is None or w.numel() != 0:
                return None
            if getattr(mod, "_cpu_skip_gemm_dispatch", False) or not hasattr(mod, "cpu_linear"):
                return None
            prefix, _, leaf = mname.rpartition(".")
            parts = packed.get(leaf) or [leaf]
            names = [f"{prefix}.{p}.weight" if prefix else f"{p}.weight" for p in parts]
            if not all(n in checkpoint_names for n in names):
                return None
            for i, n in enumerate(names):
                plan[n] = (mname, i, len(names))
        # tied parameters (e.g. lm_head tied to embed_tokens): vLLM loads only the first name; a bucket holding the
        # alias without its canonical tensor must not make it complain
        first: dict[int, str] = {}
        self._lhr_aliases = {
            n for n, p in model.named_parameters(remove_duplicate=False) if first.setdefault(id(p), n) != n
        }
        return plan or None

    def lhr_init(self, verify: bool, direct_reload: bool = True) -> dict[str, Any]:
        """Engine pid + (optionally) the checksum of the checkpoint on disk, read back against the engine."""
        out: dict[str, Any] = {"pid": os.getpid(), "checksum": None}
        self._lhr_mm = None
        self._lhr_update = None
        model_dir = Path(self.vllm_config.model_config.model)  # type: ignore[attr-defined]
        files = sorted(model_dir.glob("*.safetensors")) if model_dir.is_dir() else []
        out["checkpoint_bytes"] = sum(f.stat().st_size for f in files)
        self._lhr_direct = None
        if direct_reload and files:
            from safetensors import safe_open

            names: set[str] = set()
            for f in files:
                with safe_open(str(f), framework="pt") as fh:
                    names.update(fh.keys())
            self._lhr_direct = self._lhr_direct_plan(names)
        out["direct_reload"] = self._lhr_direct is not None
        if verify:
            from safetensors.torch import load_file

            from lightning_hybrid_rollout.rollout.weights.format import checksum_state

            if files:
                tensors: dict[str, torch.Tensor] = {}
                for f in files:
                    tensors.update(load_file(str(f)))
                out["checksum"] = checksum_state(tensors)
                verified, _, bad = self._lhr_readback(tensors)
                if bad:
                    raise RuntimeError(f"engine parameters differ from the checkpoint on disk: {bad[:5]}")
                out["readback_verified"] = verified
        self._lhr_fp = self._lhr_fingerprint()
        return out

    def _lhr_map(self, attr: str, path: str, size: int) -> bool:
        """Map ``path`` read-write into ``self.<attr>``, closing the mapping it replaces."""
        old = getattr(self, attr, None)
        if old is not None:
            with contextlib.suppress(BufferError):
                old.close()
        fd = os.open(path, os.O_RDWR)
        try:
            setattr(self, attr, mmap.mmap(fd, size))
        finally:
            os.close(fd)
        return True

    def lhr_attach_staging(self, path: str, size: int) -> bool:
        """Map the frontend's staging file (the frontend unlinks the name right after)."""
        return self._lhr_map("_lhr_mm", path, size)

    def lhr_attach_node_staging(self, path: str, size: int) -> bool:
        """Map the trainer's node-local staging file (shared, not copied: the trainer wrote the buckets once)."""
        return self._lhr_map("_lhr_node_mm", path, size)

    def lhr_begin_update(self) -> bool:
        """Start a layer-wise in-place reload session."""
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        model = self._lhr_model()
        self._lhr_update = {
            "params": {n for n, _ in model.named_parameters()},
            "loaded": set(),
            "digests": {},
            "received": {},
            "keep": [],
            "t0": time.perf_counter(),
            "mode": "direct" if getattr(self, "_lhr_direct", None) else "layerwise",
            "load_s": 0.0,
            "hash_s": 0.0,
            "minflt0": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
        }
        if self._lhr_update["mode"] == "layerwise":
            initialize_layerwise_reload(model)
        return True

    def _lhr_feed(self, items: list[tuple[str, torch.Tensor]], source: Any = None) -> dict[str, Any]:
        """Hash the received tensors, remember them for the read-back, and load them (direct or layer-wise).

        ``source``: the buffer the tensors are views of (lets the direct reload pack a fused projection from its
        adjacent parts without concatenating them first).
        """
        from vllm.config import set_current_vllm_config

        from lightning_hybrid_rollout.rollout.weights.format import tensor_digest

        upd = self._lhr_update
        if upd is None:
            raise RuntimeError("weights arrived without lhr_begin_update")
        t = time.perf_counter()
        for name, tensor in items:
            if name in upd["digests"]:
                raise RuntimeError(f"tensor {name!r} arrived twice in one update")
            upd["digests"][name] = tensor_digest(name, tensor)
            upd["received"][name] = tensor
        upd["hash_s"] += time.perf_counter() - t
        t = time.perf_counter()
        with set_current_vllm_config(self.vllm_config), torch.no_grad():  # type: ignore[attr-defined]
            if upd["mode"] == "direct":
                loaded = self._lhr_direct_load(items, source)
            else:
                loaded = self._lhr_model().load_weights(items)
        upd["load_s"] += time.perf_counter() - t
        if loaded is None:
            upd["loaded"] = None
        elif upd["loaded"] is not None:
            upd["loaded"].update(loaded)
        return {"tensors": len(items)}

    def _lhr_direct_load(self, items: list[tuple[str, torch.Tensor]], source: Any) -> set[str]:
        """Direct reload of one bucket: pack each linear layer's weights from the received tensors, copy the rest
        in place through their own weight loaders. Returns the vLLM parameter names written."""
        import numpy as np
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        plan = self._lhr_direct
        assert plan is not None
        model = self._lhr_model()
        modules = dict(model.named_modules())
        groups: dict[str, list[torch.Tensor | None]] = {}
        rest: list[tuple[str, torch.Tensor]] = []
        for name, tensor in items:
            hit = plan.get(name)
            if hit is None:
                if name not in self._lhr_aliases:
                    rest.append((name, tensor))
                continue
            mname, i, n = hit
            groups.setdefault(mname, [None] * n)[i] = tensor
        loaded: set[str] = set()
        if rest:
            got = set(model.load_weights(rest) or ())
            loaded.update(got)
            params = dict(model.named_parameters(remove_duplicate=False))
            redo: dict[int, torch.nn.Module] = {}
            for pname in got:
                for mod in self._lhr_reprocess.get(id(params.get(pname)), ()):
                    redo[id(mod)] = mod
            for mod in redo.values():
                mod.quant_method.process_weights_after_loading(mod)
        base = np.frombuffer(source, dtype=np.uint8).ctypes.data if source is not None else None
        for mname, parts in groups.items():
            if any(p is None for p in parts):
                raise RuntimeError(
                    f"{mname}: only some of its fused parts arrived in this bucket; a layer's tensors must travel "
                    f"together (plan_buckets keeps decoder layers whole)"
                )
            tensors: list[torch.Tensor] = parts  # type: ignore[assignment]
            mod = modules[mname]
            rows = sum(int(t.shape[0]) for t in tensors)
            cols = int(tensors[0].shape[1]) if tensors[0].dim() == 2 else -1
            want = (int(mod.output_size_per_partition), int(mod.input_size_per_partition))
            if (rows, cols) != want or any(t.dim() != 2 or t.shape[1] != cols for t in tensors):
                raise RuntimeError(
                    f"{mname}: received weight(s) of shape {[tuple(t.shape) for t in tensors]}, the layer needs "
                    f"{want} in total"
                )
            dtype = mod.params_dtype if hasattr(mod, "params_dtype") else tensors[0].dtype
            adjacent = all(
                a.data_ptr() + a.numel() * a.element_size() == b.data_ptr() for a, b in itertools.pairwise(tensors)
            )
            if len(tensors) == 1:
                full = tensors[0]
            elif adjacent and base is not None and all(t.dtype == tensors[0].dtype for t in tensors):
                full = torch.frombuffer(
                    source, dtype=tensors[0].dtype, count=rows * cols, offset=tensors[0].data_ptr() - base
                ).view(rows, cols)
            else:
                full = torch.cat(tensors)
            if full.dtype != dtype or not full.is_contiguous():
                full = full.to(dtype).contiguous()
            mod.weight = torch.nn.Parameter(full, requires_grad=False)
            dispatch_cpu_unquantized_gemm(mod, remove_weight=True)  # packs a copy, then drops the dense weight
            if mod.weight.numel() != 0:  # never keep a view of the staging memory (the next push overwrites it)
                mod.weight = torch.nn.Parameter(full.clone(), requires_grad=False)
            loaded.add(f"{mname}.weight")
        return loaded

    def lhr_load_bucket(self, offset: int, nbytes: int, source: str = "staging") -> dict[str, Any]:
        """Load the safetensors blob at ``offset`` of a staging file (zero-copy views) into the model.

        ``source``: ``"staging"`` (this engine's own file, written by its frontend) or ``"node"`` (the trainer's
        node-local file).
        """
        from lightning_hybrid_rollout.rollout.weights.format import parse_safetensors

        mm = self._lhr_mm if source == "staging" else getattr(self, "_lhr_node_mm", None)
        if self._lhr_update is None or mm is None:
            raise RuntimeError(f"lhr_load_bucket without lhr_begin_update / {source} staging")
        items, size = parse_safetensors(mm, offset)
        if size != nbytes:
            raise RuntimeError(f"bucket at {offset}: header says {size} bytes, frontend wrote {nbytes}")
        return {**self._lhr_feed(items, mm), "bytes": nbytes}

    def lhr_load_spans(self, spans: list[tuple[int, int]], source: str = "node") -> dict[str, Any]:
        """Load several buckets of a staging file (``"node"``: the trainer's; ``"staging"``: this engine's) in one
        RPC."""
        tensors = nbytes = 0
        for offset, n in spans:
            info = self.lhr_load_bucket(offset, n, source)
            tensors += info["tensors"]
            nbytes += info["bytes"]
        return {"tensors": tensors, "bytes": nbytes, "buckets": len(spans)}

    def lhr_load_ipc(self, blob: bytes) -> dict[str, Any]:
        """GPU, colocated trainer: rebuild the trainer's tensors from CUDA IPC handles (zero copy) and load them."""
        import pickle

        device = torch.cuda.current_device()
        items = []
        for name, fn, args in pickle.loads(blob):
            args = list(args)
            args[6] = device  # storage_device of rebuild_cuda_tensor: this process's device index
            items.append((name, fn(*args)))
        self._lhr_update["keep"].append(items)  # type: ignore[index]  # views must outlive the layer-wise reload
        return self._lhr_feed(items)

    def lhr_init_nccl(self, host: str, port: int, rank: int, world_size: int) -> bool:
        """GPU, standalone: join the trainer's NCCL broadcast group (see ``weight_sync.NcclWeightBroadcaster``)."""
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self._lhr_nccl = PyNcclCommunicator(pg, device=torch.cuda.current_device())
        return True

    def _lhr_recv_nccl(self, meta: dict[str, Any]) -> torch.Tensor:
        buf = torch.empty(int(meta["nbytes"]), dtype=torch.uint8, device=torch.cuda.current_device())
        stream = torch.cuda.current_stream()
        self._lhr_nccl.broadcast(buf, src=0, stream=stream)
        stream.synchronize()
        return buf

    @staticmethod
    def _lhr_nccl_views(meta: dict[str, Any], buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        from lightning_hybrid_rollout.rollout.weights.format import SAFETENSORS_DTYPE_BY_NAME

        items = []
        for m in meta["tensors"]:
            dtype = SAFETENSORS_DTYPE_BY_NAME[m["dtype"]]
            n = int(torch.Size(m["shape"]).numel()) * torch.empty((), dtype=dtype).element_size()
            items.append((m["name"], buf[m["offset"] : m["offset"] + n].view(dtype).reshape(m["shape"])))
        return items

    def lhr_load_nccl(self, meta: dict[str, Any]) -> dict[str, Any]:
        """GPU, standalone: receive one broadcast bucket (layout in ``meta``) and load it."""
        buf = self._lhr_recv_nccl(meta)
        self._lhr_update["keep"].append(buf)  # type: ignore[index]
        return self._lhr_feed(self._lhr_nccl_views(meta, buf))

    def lhr_stage_nccl(self, meta: dict[str, Any]) -> dict[str, Any]:
        """GPU, staged sync: receive one broadcast bucket and keep it for :meth:`lhr_load_gpu_stage`."""
        stage = getattr(self, "_lhr_gpu_stage", None)
        if stage is None:
            stage = self._lhr_gpu_stage = []
        stage.append((meta, self._lhr_recv_nccl(meta)))
        return {"bytes": int(meta["nbytes"]), "staged": len(stage)}

    def lhr_load_gpu_stage(self) -> dict[str, Any]:
        """GPU, staged sync commit: load every staged bucket (the buffers are freed after the update)."""
        stage, self._lhr_gpu_stage = getattr(self, "_lhr_gpu_stage", None) or [], []
        if not stage:
            raise RuntimeError("lhr_load_gpu_stage: nothing staged")
        tensors = 0
        for meta, buf in stage:
            self._lhr_update["keep"].append(buf)  # type: ignore[index]
            tensors += self._lhr_feed(self._lhr_nccl_views(meta, buf))["tensors"]
        return {"tensors": tensors, "buckets": len(stage)}

    def lhr_finish_update(self) -> dict[str, Any]:
        """Finalize the reload, check coverage and read-back; returns the checksum (or ``error``)."""
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        from lightning_hybrid_rollout.rollout.weights.format import combine_digests

        upd = self._lhr_update
        if upd is None:
            raise RuntimeError("lhr_finish_update without lhr_begin_update")
        self._lhr_update = None
        model = self._lhr_model()
        if upd["mode"] == "layerwise":
            finalize_layerwise_reload(model, self.vllm_config.model_config)  # type: ignore[attr-defined]
        runner = self.model_runner  # type: ignore[attr-defined]
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(runner, reset, None)
            if fn is not None:
                with contextlib.suppress(Exception):
                    fn()
        out: dict[str, Any] = {
            "tensors": len(upd["digests"]),
            "params": len(upd["params"]),
            "mode": upd["mode"],
            "load_s": upd["load_s"],
            "hash_s": upd["hash_s"],
            "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - upd["minflt0"],
        }
        errors = []
        if upd["loaded"] is not None:
            missing = sorted(upd["params"] - upd["loaded"])
            if missing:
                errors.append(
                    f"{len(missing)} model parameter(s) got no new weights (vLLM kept the old values): {missing[:5]}"
                )
        verified, skipped, bad = self._lhr_readback(upd["received"])
        out["readback_verified"], out["readback_skipped"] = verified, skipped
        if bad:
            errors.append(f"read-back mismatch after load for {len(bad)} parameter(s): {bad[:5]}")
        out["checksum"] = combine_digests(upd["digests"])
        upd["received"].clear()
        upd["keep"].clear()
        self._lhr_fp = self._lhr_fingerprint()
        if errors:
            out["error"] = "; ".join(errors)
        return out

    def lhr_abort_update(self) -> bool:
        """Finalize a half-done reload (layers that got nothing keep their old tensors)."""
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        upd = getattr(self, "_lhr_update", None)
        if upd is None:
            return False
        self._lhr_update = None
        if upd["mode"] == "layerwise":
            finalize_layerwise_reload(self._lhr_model(), self.vllm_config.model_config)  # type: ignore[attr-defined]
        return True

    def lhr_check_fingerprint(self) -> dict[str, Any]:
        """Compare the materialized parameters with the fingerprint recorded at the last verified load."""
        now = self._lhr_fingerprint()
        before = getattr(self, "_lhr_fp", None)
        if before is None:
            return {"ok": True, "params": len(now), "note": "no fingerprint recorded"}
        changed = sorted(k for k in set(now) | set(before) if now.get(k) != before.get(k))
        return {"ok": not changed, "params": len(now), "changed": changed[:10]}
