"""``rollout``: :class:`RolloutConfig`, the rollout side (model, replicas, sampling, weight sync, engines)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from lightning_hybrid_rollout.config.base import DTYPES, WEIGHT_ENCODINGS, WEIGHT_TRANSPORTS, Checker, ConfigBase
from lightning_hybrid_rollout.config.fields import boolean, choice, custom, integer, real, text


@dataclass
class RolloutConfig(ConfigBase):
    """The ``rollout`` section: replicas, their concurrency, sampling and engine settings."""

    SECTION: ClassVar[str] = "rollout"
    # vLLM engine argument -> the field of this section that sets it (refused in engine_kwargs)
    ENGINE_ARG_FIELDS: ClassVar[dict[str, str]] = {
        "model": "model_path",
        "dtype": "dtype",
        "max_model_len": "max_model_len",
        "kv_cache_memory_bytes": "kv_cache_memory_bytes",
        "enforce_eager": "enforce_eager",
        "seed": "seed",
        "max_num_seqs": "concurrent_samples_per_replica",
        "tensor_parallel_size": "tensor_parallel_size",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "enable_prefix_caching": "enable_prefix_caching",
    }
    # vLLM engine arguments the package sets itself (refused in engine_kwargs) -> why
    RESERVED_ENGINE_ARGS: ClassVar[dict[str, str]] = {
        "worker_extension_cls": "weight sync runs through the package's worker extension",
        "logprobs_mode": "the trainer's importance ratios need the log-probs of the distribution sampled from",
        "enable_sleep_mode": "hybrid replicas sleep and wake through the package (on when CUDA is available)",
    }

    # --- Parameters that control the replicas ------------------------------------------------------------------

    model_path: str = text("", empty_ok=True, fix="Give a model directory or a hub id, e.g. 'Qwen/Qwen3-0.6B'.")
    """Hugging Face model directory or hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``) the trainer and the engines
    load. A hub id is fetched into the Hugging Face cache once per node (``HF_HOME``; ``HF_HUB_OFFLINE=1`` reads the
    cache only). Required by the runtime; may stay empty for simulator-only configs."""

    model_revision: str | None = text(None, nullable=True, fix="E.g. 'main' or a commit hash.")
    """Branch, tag or commit of a hub id ``model_path`` (TRL's ``model_revision``); ``null``: its default branch.
    Ignored for a local directory."""

    standalone_replicas: int = integer(
        1, at_least=0, fix="Use 0 (with only_hybrid) or a positive count of dedicated rollout replicas."
    )
    """Always-on rollout replicas on dedicated devices (verl: rollout nodes). 0 with ``only_hybrid``."""

    hybrid_replicas: int = integer(1, at_least=0, fix="Use 0 (plain fully-async) or a positive count.")
    """Rollout replicas sharing the trainer's devices, lent to rollout while the trainer waits."""

    concurrent_samples_per_replica: int = integer(
        16, at_least=1, fix="Use a positive count such as 16 (verl's default)."
    )
    """Concurrent samples one replica serves (``s`` in ``cap = min(servers * s, max_required_samples)``)."""

    # --- Parameters that control generation --------------------------------------------------------------------

    n: int = integer(8, at_least=1, fix="Use the group size, e.g. 8 samples per prompt.")
    """Samples per prompt (the GRPO group size)."""

    response_length: int = integer(128, at_least=1, fix="Give the maximum new tokens per sample, e.g. 128.")
    """Maximum new tokens per sample (a resumed partial rollout counts the tokens it already has)."""

    prompt_length: int = integer(64, at_least=1, fix="Give the maximum prompt tokens, e.g. 64.")
    """Maximum prompt tokens; longer prompts are rejected by the data path."""

    temperature: float = real(1.0, at_least=0.0, fix="Use 1.0 for plain sampling or 0 for greedy.")
    """Sampling temperature (>= 0; 0 = greedy)."""

    top_p: float = real(1.0, above=0.0, at_most=1.0, fix="Use 1.0 to disable nucleus sampling.")
    """Nucleus sampling mass, in (0, 1]; 1.0 = disabled."""

    # --- Parameters that control which groups are trained on (dynamic sampling) -------------------------------

    filter_groups: bool | str = custom(
        False,
        requirement="true, false or 'package.module:function' / 'path/to/file.py:function'",
        check=lambda cfg, key, value: _filter_groups_problems(key, value),
    )
    """Drop finished groups before they reach the queue and admit a new prompt in each one's place, so every step
    still trains on its configured number of samples (DAPO's dynamic sampling). ``true``: drop groups whose rewards
    are all equal (zero advantage, no learning signal); a string ``"package.module:function"`` or
    ``"path/to/file.py:function"``: drop a group when ``function(samples)`` (its finished, rewarded ``Sample``
    list) returns False. ``false``: every group is trained on."""

    max_num_gen_batches: int = integer(
        10, at_least=0, fix="Use 0 (no cap) or a count of batches such as 10 (verl's default)."
    )
    """Cap on generation per weight-sync cycle while ``filter_groups`` drops groups, in batches of the cycle's
    required samples (verl's ``max_num_gen_batches``): once the cycle's dropped samples reach ``(max_num_gen_batches
    - 1) x step_required_samples``, groups pass unfiltered until the next sync (one warning) instead of stalling the
    trainer. 0: no cap."""

    # --- Parameters that control the engine --------------------------------------------------------------------

    dtype: Literal["float32", "bfloat16", "float16", "auto"] = choice(
        "float32", DTYPES, fix="Use float32 on CPU for parity with transformers."
    )
    """Engine weight dtype. ``float32`` gives exact parity with transformers on CPU; ``auto`` follows the
    checkpoint (a float32 checkpoint then loads as bf16 in vLLM)."""

    kv_cache_memory_bytes: int = integer(256 * 1024**2, at_least=1, fix="Give a byte count, e.g. 268435456 (256 MiB).")
    """KV-cache bytes per replica (default 256 MiB). Always bounded: vLLM's default takes 0.9 of the device or node
    memory."""

    cpus_per_replica: int = integer(1, at_least=1, fix="Give at least one core per replica.")
    """CPU cores per replica's Ray actor (a CPU replica is pinned to them)."""

    gpus_per_replica: float = real(0.0, at_least=0.0, fix="Use 0 on CPU, or e.g. 1.0 per GPU replica.")
    """GPUs per replica's Ray actor (0 on CPU machines; may be fractional)."""

    ray_address: str | None = text(None, nullable=True, fix="Use null for a local Ray, or e.g. 'ray://head:10001'.")
    """Address of a running Ray cluster; ``None`` starts a local Ray on 127.0.0.1."""

    enforce_eager: bool = boolean(True)
    """Disable graph capture/compilation in the engine (faster start; compile does not pay off for tiny models)."""

    seed: int = integer(0, at_least=0, fix="Use a non-negative integer.")
    """Seed of the engines' sampling (replica ``i`` uses ``seed + i``)."""

    tensor_parallel_size: int = integer(
        1, at_least=1, fix="Use 1 (one GPU per engine), or the number of GPUs to shard over."
    )
    """GPUs one engine shards the model over (vLLM ``tensor_parallel_size``). GPU only: 1 on CPU, and at most
    ``gpus_per_replica`` (a replica's actor must see all of its engine's GPUs)."""

    gpu_memory_utilization: float = real(
        0.4, above=0.0, at_most=1.0, fix="Use a fraction of each GPU's memory, e.g. 0.4 (GPU only)."
    )
    """GPU only: fraction of each GPU's memory an engine may take for weights + KV cache, in (0, 1] (low, since a
    hybrid replica shares the GPU with the trainer). On CPU ``kv_cache_memory_bytes`` sizes the cache."""

    max_model_len: int | None = integer(None, nullable=True, fix="Use null (prompt + response + 8) or e.g. 4096.")
    """Longest prompt + response an engine accepts (vLLM ``max_model_len``). ``None``: ``prompt_length +
    response_length + 8``; if set, at least ``prompt_length + response_length`` and at most what the model
    supports (checked against its ``config.json`` before any replica starts)."""

    enable_prefix_caching: bool | None = boolean(
        None, nullable=True, fix="Use null (vLLM's default), true or false (no quotes)."
    )
    """Reuse the KV cache of shared prompt prefixes (a group's ``n`` samples share their prompt; vLLM
    ``enable_prefix_caching``). ``None``: vLLM's default for the model."""

    engine_kwargs: dict[str, Any] = custom(
        default_factory=dict,
        requirement="a mapping of vLLM engine argument names to values",
        check=lambda cfg, key, value: cfg._engine_kwargs_problems(key, value),
    )
    """More vLLM engine arguments (``AsyncEngineArgs`` fields, e.g. ``{max_num_batched_tokens: 2048}``), passed to
    every engine and checked with vLLM's own code before any replica starts. A key a field of this section sets
    (e.g. ``max_model_len``, ``dtype``, ``max_num_seqs``) is refused: set that field instead."""

    pin_trainer: bool = boolean(True)
    """CPU only: pin the trainer process to the hybrid replicas' cores (they take turns), leaving the other cores to
    the standalone replicas."""

    weight_transport: Literal["auto", "node_shm", "ray", "collective", "cuda_ipc"] = choice(
        "auto",
        WEIGHT_TRANSPORTS,
        fix="Use 'auto' (chosen per replica by placement) unless you need one transport for every replica.",
    )
    """How the trainer's weights reach the replicas at each sync: ``node_shm`` (a node-local shared-memory file),
    ``ray`` (Ray's object store), ``collective`` (a torch.distributed broadcast in a group of its own: gloo on CPU,
    NCCL on GPU), ``cuda_ipc`` (CUDA only: the hybrid replica on the trainer's GPU maps its tensors). ``auto``: per
    replica by placement; without CUDA ``node_shm`` on the trainer's node and ``ray`` elsewhere, with CUDA
    ``cuda_ipc`` for a hybrid replica on the trainer's GPU and ``collective`` otherwise. Every sync is verified by
    checksum; a named transport never falls back to another."""

    weight_encoding: Literal["auto", "full", "delta"] = choice(
        "auto",
        WEIGHT_ENCODINGS,
        fix="Use 'auto' (deltas to 16-bit engines), 'delta' (send only the changed elements) or 'full' (send the "
        "whole weights every sync).",
    )
    """What each weight sync sends. ``auto``: ``delta`` to the replicas whose engine holds bfloat16 or float16
    weights, ``full`` to the others (a float32 engine's weights change almost everywhere under Adam: 99.9% of
    SmolLM2's per step, so a delta saves nothing and costs its encoding). ``delta``: the elements that changed
    since the version the replica holds, in
    the engine's dtype (int32 index + value per changed element, or the whole tensor where most changed), applied to
    a dense copy of the weights the replica keeps; the first sync, a restarted replica, one whose checksum disagreed
    and one too far behind (the chain of deltas bigger than a full sync) get the full weights in the engine's dtype.
    Exact: every sync is verified by the same checksum as a full one. Costs one copy of the weights in the engine's
    dtype on the trainer and on each replica. ``full``: the trainer's tensors as they are, every sync. A LoRA
    adapter-only sync (``lora_sync: adapter``) and ``cuda_ipc`` always send in full (docs/rollout.md)."""

    lora_sync: Literal["adapter", "merged"] = choice(
        "adapter",
        ("adapter", "merged"),
        fix="Use 'adapter' (send only the LoRA adapter) or 'merged' (send the merged full weights).",
    )
    """With a LoRA policy (``GRPOModule(peft=...)``), what each weight sync sends. ``adapter``: the adapter's
    ``lora_A`` / ``lora_B`` tensors only; the engines start with vLLM's LoRA on (``max_lora_rank`` from
    ``peft.r``), keep the base they loaded at start, and serve every request admitted after a sync with the new
    adapter. ``merged``: the full merged weights ``W + B @ A * scaling`` under the base names, to plain engines.
    Without ``peft`` every sync is a full one and this is ignored (docs/lora.md)."""

    lora_keep_base: bool = boolean(True)
    """With ``lora_sync: adapter``, on GPU: a hybrid replica's deactivation releases its KV cache only and keeps the
    base weights on the device, so its activation costs the adapter push alone; false: vLLM's level-1 sleep (the
    weights go to host memory and are copied back at the wake). CPU engines never sleep (they park and keep
    everything), so there it changes nothing (docs/lora.md)."""

    # --- Parameters that control placement and failures --------------------------------------------------------

    standalone_resource: str | None = text(
        None,
        nullable=True,
        fix="Use null (no placement constraint) or the resource your rollout nodes advertise, e.g. 'lhr_rollout'.",
    )
    """Ray resource a node must advertise to host standalone replicas (e.g. ``lhr_rollout``, set with ``ray start
    --resources '{"lhr_rollout": 8}'``; one unit per replica). ``None``: anywhere Ray finds room. Hybrid replicas
    always go to the trainer ranks' own nodes."""

    replica_health_timeout_s: float = real(
        60.0, above=0.0, fix="Use seconds, e.g. 60 (longer than an engine's slowest step)."
    )
    """A replica that does not answer a health check within this many seconds is treated as dead: it is killed,
    its in-flight samples continue on other replicas, and a replacement starts."""

    max_replica_restarts: int = integer(
        3, at_least=0, fix="Use 0 (never replace a dead replica) or a small count such as 3."
    )
    """Replacements tried per replica slot in a row before giving up on it (a successful one resets the count); with
    no replica left, the fit saves a checkpoint and stops with a ``ReplicaFailureError``."""

    deactivation_drain_s: float = real(
        0.0, at_least=0.0, fix="Use 0 (abort everything, verl's deactivation) or a small budget such as 0.15 seconds."
    )
    """Drain budget in seconds when hybrid replicas are deactivated: requests expected to finish within it complete
    instead of being aborted (the others continue elsewhere from their prefix). The trainer waits meanwhile, so keep
    it near the abort's own cost (e.g. 0.15). 0 = verl's deactivation: abort everything at once."""

    def check(self, c: Checker) -> None:
        tp, gpus = self.tensor_parallel_size, self.gpus_per_replica
        if tp > 1 and gpus < tp:
            if gpus == 0:
                c.add("tensor_parallel_size", "1 on CPU (gpus_per_replica: 0)", tp, "Tensor parallelism is GPU only.")
            else:
                c.add(
                    "tensor_parallel_size",
                    f"<= gpus_per_replica ({gpus:g})",
                    tp,
                    f"A replica's actor must see all its engine's GPUs: set gpus_per_replica: {tp} or lower "
                    f"tensor_parallel_size.",
                )
        need = self.prompt_length + self.response_length
        if self.max_model_len is not None and self.max_model_len < need:
            c.add(
                "max_model_len",
                f">= prompt_length + response_length = {need}",
                self.max_model_len,
                f"Use null ({need + 8}) or at least {need}, or lower prompt_length / response_length.",
            )

    def engine_max_model_len(self) -> int:
        """The engines' ``max_model_len``: the field if set, else ``prompt_length + response_length + 8``."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.prompt_length + self.response_length + 8

    def _engine_kwargs_problems(self, key: str, kwargs: Any) -> list[str]:
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            return [
                f"{key} must be a mapping of vLLM engine argument names to values, got {kwargs!r}. Write e.g. "
                "`engine_kwargs: {max_num_batched_tokens: 2048}`."
            ]
        problems = []
        for name, value in kwargs.items():
            if name in self.ENGINE_ARG_FIELDS:
                owner = self.ENGINE_ARG_FIELDS[name]
                problems.append(
                    f"{key}.{name} is set by {self.SECTION}.{owner}: remove it from engine_kwargs and "
                    f"set `{owner}: {value!r}` in the {self.SECTION} section instead."
                )
            elif name in self.RESERVED_ENGINE_ARGS:
                problems.append(
                    f"{key}.{name} cannot be set: lightning_hybrid_rollout sets it itself "
                    f"({self.RESERVED_ENGINE_ARGS[name]}). Remove it from engine_kwargs."
                )
        return problems


def _filter_groups_problems(key: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return []
    requirement = "true, false or 'package.module:function' / 'path/to/file.py:function'"
    if isinstance(value, str):
        where, _, attr = value.strip().rpartition(":")
        if where and attr.isidentifier():
            return []
        fix = "Name the function after a colon, e.g. 'my_filters.py:keep_group'."
    else:
        fix = "Use true (drop groups whose rewards are all equal) or a filter function's import path."
    return [f"{key} must be {requirement}, got {value!r}. {fix}"]
