"""Settings of one vLLM engine (:class:`VLLMEngineConfig`) and where its process's files go.

Read by the replica actor (which sets :meth:`VLLMEngineConfig.process_env` before the engine starts, so the engine
core process inherits it) and by the engine driver, :mod:`.driver`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

EngineState = Literal["starting", "active", "parked", "syncing", "stopped", "dead"]
"""An engine's state, as ``health()["state"]`` reports it."""


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


_MAX_TMPDIR_LEN = 60  # vLLM puts ZMQ sockets at $TMPDIR/<uuid4>; a Unix socket path must stay under 108 bytes


def short_tmp_dir(preferred: str | os.PathLike[str]) -> Path:
    """``preferred`` if short enough for vLLM's IPC socket paths, else a short per-user dir under ``/tmp``."""
    path = Path(preferred)
    if len(str(path)) > _MAX_TMPDIR_LEN:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        path = Path("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()) / f"lhr-{os.getuid()}-{digest}"
    path.mkdir(parents=True, exist_ok=True)
    return path
