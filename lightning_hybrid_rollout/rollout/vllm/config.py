"""Settings of one vLLM engine (:class:`VLLMEngineConfig`), the engine arguments they make, and where files go.

Read by the replica actor (which sets :meth:`VLLMEngineConfig.process_env` before the engine starts, so the engine
core process inherits it) and by the engine driver, :mod:`.driver`. :func:`engine_kwargs_for` is the ONE place that
turns a :class:`VLLMEngineConfig` into vLLM's ``AsyncEngineArgs(**kwargs)``: the driver builds its engine from it, and
:func:`~.engine_args.check_engine_args` validates the same dict in the trainer process before any replica starts.
:func:`engine_config_from_rollout` makes the :class:`VLLMEngineConfig` of a run from its ``rollout`` section.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from lightning_hybrid_rollout.config import RolloutConfig

WORKER_EXTENSION_CLS = "lightning_hybrid_rollout.rollout.vllm.worker_extension.LHRWorkerExtension"
"""What vLLM mixes into its worker (``worker_extension_cls``, a dotted class path it imports in the worker)."""

EngineState = Literal["starting", "active", "parked", "syncing", "stopped", "dead"]
"""An engine's state, as ``health()["state"]`` reports it."""


@dataclass
class VLLMEngineConfig:
    """Settings of one vLLM engine (mirrors the rollout part of the run config).

    Args:
        model: Model directory (HF layout) or hub id (resolved on the engine's own node before it starts).
        revision: Branch, tag or commit of a hub id ``model`` (None: its default branch).
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
        tensor_parallel_size: Tensor parallel degree (GPU only; on CPU it is passed only when not 1).
        enable_prefix_caching: vLLM prefix caching (``None``: vLLM's default for the model).
        single_process: CPU: run engine core and worker in one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
        disable_torch_compile: CPU: set ``TORCH_COMPILE_DISABLE=1`` so vLLM's few ``torch.compile``'d helpers (e.g.
            the logprob rank count) run eagerly instead of costing a 3-25 s C++ compile on the first request.
        run_dir: Where TMPDIR / the vLLM cache point (vLLM leaves socket files behind); default: a temp dir.
        staging_dir: Directory of the shared-memory weight staging file (default: the run's private staging
            directory, ``LHR_STAGING_DIR``, on ``/dev/shm`` when writable).
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
        lora: The policy's LoRA adapter (:func:`~lightning_hybrid_rollout.training.lora.engine_lora_config`:
            ``r``, ``lora_alpha``, ``target_modules``, ..., ``max_lora_rank``) when weight syncs send the adapter
            alone (``rollout.lora_sync: adapter``): the engine starts with vLLM's LoRA on, keeps its base weights, and
            every weight update is an adapter built in memory in the worker. None: plain engine, full-weight updates.
        sleep_keeps_weights: GPU sleep mode: sleeping releases the KV cache only and keeps the weights on the device
            (``rollout.lora_keep_base``); otherwise vLLM's level-1 sleep offloads them to host memory.
        extra_engine_args: More ``AsyncEngineArgs`` fields (``rollout.engine_kwargs``); they override the ones
            above (:func:`engine_kwargs_for`).
    """

    model: str
    revision: str | None = None
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
    enable_prefix_caching: bool | None = None
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
    lora: dict[str, Any] | None = None
    sleep_keeps_weights: bool = False
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


def engine_kwargs_for(cfg: VLLMEngineConfig, on_cuda: bool | None = None) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``AsyncEngineArgs`` for an engine with settings ``cfg``.

    The driver starts its engine with exactly this dict, and :func:`~.engine_args.check_engine_args` validates it
    before any replica starts. GPU: ``gpu_memory_utilization``, ``tensor_parallel_size`` and sleep mode; CPU:
    ``kv_cache_memory_bytes`` (and ``tensor_parallel_size`` only when not 1). ``enable_prefix_caching`` only when
    set; ``cfg.extra_engine_args`` last (they override).

    Args:
        cfg: The engine's settings.
        on_cuda: Whether the engine will run on a GPU (default: whether this process sees one).

    Example::

        >>> kw = engine_kwargs_for(VLLMEngineConfig(model="m", enable_prefix_caching=True), on_cuda=False)
        >>> kw["enable_prefix_caching"], kw["kv_cache_memory_bytes"], "gpu_memory_utilization" in kw
        (True, 268435456, False)
    """
    cuda = cfg.on_cuda if on_cuda is None else bool(on_cuda)
    kwargs: dict[str, Any] = {
        "model": cfg.model,
        **({"revision": cfg.revision} if cfg.revision else {}),
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "enforce_eager": cfg.enforce_eager,
        "seed": cfg.seed,
        "max_num_seqs": cfg.max_num_seqs,
        "logprobs_mode": cfg.logprobs_mode,
        "worker_extension_cls": WORKER_EXTENSION_CLS,
        "disable_log_stats": True,
    }
    if cuda:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        kwargs["tensor_parallel_size"] = cfg.tensor_parallel_size
        kwargs["enable_sleep_mode"] = cuda if cfg.enable_sleep_mode is None else bool(cfg.enable_sleep_mode)
    else:
        kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
        if cfg.tensor_parallel_size != 1:  # not silently dropped: vLLM says whether it can
            kwargs["tensor_parallel_size"] = cfg.tensor_parallel_size
    if cfg.enable_prefix_caching is not None:
        kwargs["enable_prefix_caching"] = cfg.enable_prefix_caching
    if cfg.lora is not None:  # one adapter, replaced in place at each sync (worker_extension.py)
        kwargs.update(enable_lora=True, max_lora_rank=int(cfg.lora["max_lora_rank"]), max_loras=1, max_cpu_loras=1)
    kwargs.update(cfg.extra_engine_args)
    return kwargs


def engine_config_from_rollout(
    rollout: RolloutConfig, run_dir: str | os.PathLike[str], lora: dict[str, Any] | None = None
) -> VLLMEngineConfig:
    """The engine settings of a run's replicas, from its ``rollout`` section.

    ``max_model_len`` is :meth:`RolloutConfig.engine_max_model_len` (``prompt_length + response_length + 8`` unless
    set); ``max_num_seqs`` is ``concurrent_samples_per_replica``; ``engine_kwargs`` become ``extra_engine_args``.

    Args:
        rollout: The run's ``rollout`` section (already validated).
        run_dir: Where the engines' temp files and vLLM cache go (the run's ``vllm`` directory).
        lora: The adapter when syncs send it alone (:attr:`VLLMEngineConfig.lora`); ``rollout.lora_keep_base``
            applies with it only.
    """
    r = rollout
    return VLLMEngineConfig(
        model=str(r.model_path),
        revision=r.model_revision,
        dtype=r.dtype,
        max_model_len=r.engine_max_model_len(),
        kv_cache_memory_bytes=r.kv_cache_memory_bytes,
        enforce_eager=r.enforce_eager,
        seed=r.seed,
        max_num_seqs=max(r.concurrent_samples_per_replica, 1),
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=r.tensor_parallel_size,
        enable_prefix_caching=r.enable_prefix_caching,
        run_dir=str(run_dir),
        lora=dict(lora) if lora is not None else None,
        sleep_keeps_weights=lora is not None and r.lora_keep_base,
        extra_engine_args=dict(r.engine_kwargs),
    )


_MAX_TMPDIR_LEN = 60  # vLLM puts ZMQ sockets at $TMPDIR/<uuid4>; a Unix socket path must stay under 108 bytes


def short_tmp_dir(preferred: str | os.PathLike[str]) -> Path:
    """``preferred`` if short enough for vLLM's IPC socket paths, else a short per-user dir under ``/tmp``."""
    path = Path(preferred)
    if len(str(path)) > _MAX_TMPDIR_LEN:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        path = Path("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()) / f"lhr-{os.getuid()}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    return path
