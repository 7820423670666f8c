"""The contract every hybrid strategy implements, and the shared machinery behind it.

A *hybrid* strategy lends the trainer's devices to rollout replicas between training steps: it offloads the training
state to host memory and onloads it back bit-exact, and streams the full HF-named weights in buckets for the weight
sync. On CPU the same copies run, so the path and its cost are exercised there too. The contract, its rules and what
offload does per strategy are in docs/strategies.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lightning_hybrid_rollout.rollout.weights.format import DEFAULT_BUCKET_BYTES as DEFAULT_BUCKET_BYTES
from lightning_hybrid_rollout.training.lora import WeightGroup, adapter_groups, weight_groups

if TYPE_CHECKING:
    import lightning.pytorch as pl

log = logging.getLogger(__name__)


# Wrapper segments that torch / Lightning insert into parameter names; HF (and vLLM's loader) know none of them.
_WRAPPER_SEGMENTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")

WeightBucket = list[tuple[str, Tensor]]


def clean_param_name(name: str) -> str:
    """Strip wrapper segments (``torch.compile``, activation checkpointing, FSDP1) from a parameter name.

    Args:
        name: a fully qualified parameter or buffer name.

    Returns:
        The name as the unwrapped HF model would spell it.

    Example::

        >>> clean_param_name("model._orig_mod.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight")
        'model.layers.0.mlp.up_proj.weight'
    """
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def _is_dtensor(tensor: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(tensor, DTensor)


def copy_tensor_to(tensor: Tensor, device: torch.device, pin_memory: bool = False) -> Tensor:
    """Copy ``tensor`` into a freshly allocated tensor on ``device`` (layout, dtype and strides preserved).

    The copy is issued with ``non_blocking=True``: callers synchronize before relying on it (a CPU to CPU copy is
    synchronous anyway). A ``DTensor`` keeps its mesh and placements; only its local shard is copied.

    Args:
        tensor: the source tensor (plain or ``DTensor``).
        device: where the copy goes.
        pin_memory: allocate the copy in page-locked host memory (only when ``device`` is the CPU and CUDA is
            available), so device to host and host to device copies run asynchronously at full bandwidth.

    Returns:
        The copy; never an alias of ``tensor``.

    Example::

        >>> t = torch.arange(4.0)
        >>> c = copy_tensor_to(t, torch.device("cpu"))
        >>> bool(torch.equal(c, t)), c.data_ptr() != t.data_ptr()
        (True, True)
    """
    pin = pin_memory and device.type == "cpu" and torch.cuda.is_available()
    # For a DTensor both ops run shard-locally (the result keeps mesh and placements, its shard on `device`);
    # `DTensor.from_local` is no way to build it: it moves a host shard back to the mesh's device.
    out = torch.empty_like(tensor, device=device, pin_memory=pin)
    out.copy_(tensor, non_blocking=True)
    return out


def full_nbytes(tensor: Tensor) -> int:
    """Bytes of the *full* (unsharded) tensor: global shape for a ``DTensor``, ``ds_numel`` for a ZeRO-3 parameter.

    Args:
        tensor: a plain tensor, a ``DTensor`` or a DeepSpeed ZeRO-3 partitioned parameter.

    Returns:
        ``numel * element_size`` of the tensor once gathered; identical on every rank, so bucket boundaries derived
        from it are too.
    """
    numel = getattr(tensor, "ds_numel", None)
    if numel is None:
        numel = tensor.numel()  # a DTensor reports its global numel
    return int(numel) * tensor.element_size()


@dataclass
class OptimizerSlot:
    state: dict[str, Any]
    key: str
    home: torch.device


class HybridStrategyMixin:
    """Offload / onload of the training state and full-weight streaming, mixed into a Lightning strategy.

    The mixin must come first in the bases (``class HybridDDPStrategy(HybridStrategyMixin, DDPStrategy)``). It uses
    only the public surface of the strategy it is mixed into (``lightning_module``, ``optimizers``, ``root_device``,
    ``global_rank``), plus two hooks that subclasses may override: :meth:`_offload` / :meth:`_onload` (the default
    moves the LightningModule's parameters, gradients and buffers with ``nn.Module._apply`` and every optimizer
    state tensor) and :meth:`_gather_bucket` (the default gathers ``DTensor`` shards with ``full_tensor()``).

    Attributes:
        last_offload_s: wall seconds of the last :meth:`offload_training_state` (0.0 before the first one).
        last_onload_s: wall seconds of the last :meth:`onload_training_state` (0.0 before the first one).
        pin_memory: use page-locked host buffers for the offloaded state (CUDA only; ignored on CPU).

    Example::

        >>> import lightning.pytorch as pl
        >>> from lightning_hybrid_rollout.lightning.strategies import HybridSingleDeviceStrategy
        >>> strategy = HybridSingleDeviceStrategy()
        >>> strategy.is_offloaded, strategy.last_offload_s
        (False, 0.0)
    """

    last_offload_s: float = 0.0
    last_onload_s: float = 0.0
    pin_memory: bool = True
    _hybrid_offloaded: bool = False
    _hybrid_module_homes: tuple[torch.device, ...] = ()
    _hybrid_parked_grads: tuple[tuple[str, Tensor, torch.device], ...] = ()
    _hybrid_optimizer_slots: tuple[OptimizerSlot, ...] = ()

    # ------------------------------------------------------------------ public contract
    @property
    def is_offloaded(self) -> bool:
        """True between :meth:`offload_training_state` and :meth:`onload_training_state`."""
        return self._hybrid_offloaded

    @property
    def policy_module(self) -> nn.Module:
        """The policy model whose weights are synced to the rollout engines.

        ``lightning_module.policy_model`` if the LightningModule defines it, else ``lightning_module.model``, else the
        LightningModule itself (its parameter names then carry whatever prefix the module uses).
        """
        module = self._hybrid_lightning_module()
        for attr in ("policy_model", "model"):
            candidate = getattr(module, attr, None)
            if isinstance(candidate, nn.Module):
                return candidate
        return module

    def offload_training_state(self) -> float:
        """Move parameters, gradients, buffers and optimizer state to host memory and free the device memory.

        Idempotent: a second call while offloaded does nothing and returns 0.0. Must be called on every rank (a
        sharded strategy may run collectives). The model must not run forward/backward while offloaded: the
        strategy's ``training_step`` / ``validation_step`` raise until :meth:`onload_training_state` is called.

        Returns:
            Wall seconds the offload took (device synchronized), also stored in :attr:`last_offload_s`.
        """
        if self._hybrid_offloaded:
            log.debug("%s: offload_training_state() while already offloaded; nothing to do", type(self).__name__)
            return 0.0
        start = time.perf_counter()
        self._offload()
        self._synchronize_device(empty_cache=True)
        elapsed = time.perf_counter() - start
        self._hybrid_offloaded = True
        self.last_offload_s = elapsed
        log.debug("%s: offloaded training state in %.4f s", type(self).__name__, elapsed)
        return elapsed

    def onload_training_state(self) -> float:
        """Move the offloaded training state back to the device, bit-exact.

        Idempotent: a call while not offloaded does nothing and returns 0.0. Must be called on every rank.

        Returns:
            Wall seconds the onload took (device synchronized), also stored in :attr:`last_onload_s`.
        """
        if not self._hybrid_offloaded:
            log.debug("%s: onload_training_state() while not offloaded; nothing to do", type(self).__name__)
            return 0.0
        start = time.perf_counter()
        self._onload()
        self._synchronize_device(empty_cache=False)
        elapsed = time.perf_counter() - start
        self._hybrid_offloaded = False
        self.last_onload_s = elapsed
        log.debug("%s: onloaded training state in %.4f s", type(self).__name__, elapsed)
        return elapsed

    def iter_full_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, *, rank_zero_only: bool = False, adapter_only: bool = False
    ) -> Iterator[WeightBucket]:
        """Stream the full, unsharded weights of :attr:`policy_module` as buckets of ``(hf_name, cpu_tensor)``.

        Names and order are those of ``policy_module.state_dict()`` (parameters and persistent buffers; tied
        weights appear under each of their names), with wrapper segments removed (:func:`clean_param_name`).
        Tensors are fresh CPU copies, detached and safe to keep. A bucket holds tensors until their full size
        reaches ``bucket_bytes``; a tensor larger than that gets a bucket of its own.

        Sharded strategies gather collectively, so **every rank must call this and consume the iterator to the
        end, in lockstep**; bucket boundaries are computed from the full sizes and are the same on every rank.
        With ``rank_zero_only=True`` only rank 0 copies the gathered tensors to host memory; other ranks still
        take part in the collectives but receive empty buckets (enough when rank 0 drives the weight sync; a
        hybrid replica on every rank needs the default). Works while offloaded, except for DeepSpeed ZeRO-3.

        Args:
            bucket_bytes: target bucket size in bytes (> 0).
            rank_zero_only: materialize the tensors on global rank 0 only.
            adapter_only: a LoRA policy's adapter tensors only, under PEFT's names (``rollout.lora_sync: adapter``,
                :func:`~lightning_hybrid_rollout.training.lora.adapter_groups`), instead of the merged weights.

        Yields:
            Lists of ``(name, tensor)``; the same number of buckets on every rank.

        Example::

            >>> strategy = HybridSingleDeviceStrategy()  # doctest: +SKIP
            >>> names = [n for bucket in strategy.iter_full_weights(64 * 2**20) for n, _ in bucket]  # doctest: +SKIP
        """
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        policy = self.policy_module
        materialize = not rank_zero_only or self._hybrid_global_rank() == 0
        entries = [(clean_param_name(name), tensor) for name, tensor in self._full_weight_entries(policy)]
        # a LoRA policy streams its merged weights under the base names, or only its adapter (docs/lora.md)
        if adapter_only:
            groups = adapter_groups(policy, entries, clean_param_name)
        else:
            groups = weight_groups(policy, entries, clean_param_name)
        bucket: list[WeightGroup] = []
        size = 0
        for group in groups:
            bucket.append(group)
            size += full_nbytes(group.parts[0][1])
            if size >= bucket_bytes:
                yield self._gather_groups(bucket, materialize)
                bucket, size = [], 0
        if bucket:
            yield self._gather_groups(bucket, materialize)

    def _gather_groups(self, groups: list[WeightGroup], materialize: bool) -> WeightBucket:
        """One bucket of :meth:`iter_full_weights`: every part gathered, then each group combined (a LoRA merge)."""
        gathered = self._gather_bucket([part for group in groups for part in group.parts], materialize)
        if not materialize:
            return []
        tensors = iter(tensor for _, tensor in gathered)
        return [(group.name, group.combine([next(tensors) for _ in group.parts])) for group in groups]

    # ------------------------------------------------------------------ hooks for subclasses
    def _full_weight_entries(self, policy: nn.Module) -> list[tuple[str, Tensor]]:
        """``(name, tensor)`` pairs to stream, in ``state_dict`` order (``keep_vars`` keeps sharding metadata)."""
        return list(policy.state_dict(keep_vars=True).items())

    def _gather_bucket(self, bucket: list[tuple[str, Tensor]], materialize: bool) -> WeightBucket:
        """Gather the full value of every tensor of ``bucket`` and return CPU copies (none if not ``materialize``)."""
        out: WeightBucket = []
        for name, tensor in bucket:
            full = self._gather_full_tensor(tensor.detach())
            if materialize:
                out.append((name, copy_tensor_to(full, torch.device("cpu"))))
        self._synchronize_device(empty_cache=False)  # the device-to-host copies are complete when yielded
        return out

    def _gather_full_tensor(self, tensor: Tensor) -> Tensor:
        """Full value of one tensor on this rank (collective for a ``DTensor``; local shards travel via the device)."""
        if not _is_dtensor(tensor):
            return tensor
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            local = tensor.to_local()
            if local.device.type != tensor.device_mesh.device_type:
                # offloaded shard: from_local moves it to the mesh's device, where the collective backend needs it
                tensor = DTensor.from_local(
                    local,
                    tensor.device_mesh,
                    tensor.placements,
                    run_check=False,
                    shape=tensor.shape,
                    stride=tensor.stride(),
                )
            return tensor.full_tensor()

    def _offload(self) -> None:
        """Default offload: module tensors through ``nn.Module._apply`` + optimizer state, to (pinned) host memory."""
        host = torch.device("cpu")
        root = self._hybrid_root_device()
        pin = self.pin_memory and root.type == "cuda"
        homes: list[torch.device] = []

        def host_copy(tensor: Tensor) -> Tensor:
            if tensor.device == root:
                return copy_tensor_to(tensor, host, pin)
            # already off the device (CPU root, or host-resident on a CUDA root): a plain copy keeps the
            # bookkeeping uniform (`_apply` needs a new tensor) and the pinned pool for device tensors
            return copy_tensor_to(tensor, tensor.device)

        def to_host(tensor: Tensor) -> Tensor:
            homes.append(tensor.device)
            return host_copy(tensor)

        module = self._hybrid_lightning_module()
        # gradients are parked apart, by parameter name: Lightning releases them (zero_grad, set to None) before an
        # in-fit validation, which may find the state offloaded; the module's tensor walk must not depend on them
        grads = []
        for name, param in module.named_parameters():
            if param.grad is not None:
                grads.append((name, param.grad))
                param.grad = None
        with torch.no_grad():
            module._apply(to_host)
            self._hybrid_parked_grads = tuple((name, host_copy(grad), grad.device) for name, grad in grads)
        self._hybrid_module_homes = tuple(homes)
        self._hybrid_optimizer_slots = tuple(self._move_optimizer_state(to_host_root=root, pin=pin))

    def _onload(self) -> None:
        """Default onload: the exact inverse of :meth:`_offload` (every tensor goes back to the device it came from)."""
        homes = self._hybrid_module_homes
        position = 0

        def to_home(tensor: Tensor) -> Tensor:
            nonlocal position
            if position >= len(homes):
                raise RuntimeError(
                    f"{type(self).__name__}: the module changed between offload and onload "
                    f"(more tensors than the {len(homes)} offloaded); do not modify the model while offloaded"
                )
            home = homes[position]
            position += 1
            return copy_tensor_to(tensor, home)

        module = self._hybrid_lightning_module()
        with torch.no_grad():
            module._apply(to_home)
        if position != len(homes):
            raise RuntimeError(
                f"{type(self).__name__}: onload restored {position} module tensors but {len(homes)} were offloaded; "
                "do not modify the model while offloaded"
            )
        for name, grad, home in self._hybrid_parked_grads:
            module.get_parameter(name).grad = copy_tensor_to(grad, home)
        self._hybrid_parked_grads = ()
        for slot in self._hybrid_optimizer_slots:
            slot.state[slot.key] = copy_tensor_to(slot.state[slot.key], slot.home)
        self._hybrid_module_homes = ()
        self._hybrid_optimizer_slots = ()

    def _move_optimizer_state(self, to_host_root: torch.device, pin: bool) -> list[OptimizerSlot]:
        slots: list[OptimizerSlot] = []
        host = torch.device("cpu")
        for optimizer in _unwrap_optimizers(getattr(self, "optimizers", [])):
            for state in optimizer.state.values():
                for key, value in state.items():
                    if not isinstance(value, Tensor):
                        continue
                    on_root = value.device == to_host_root
                    slots.append(OptimizerSlot(state, key, value.device))
                    state[key] = copy_tensor_to(value, host if on_root else value.device, pin and on_root)
        return slots

    # ------------------------------------------------------------------ guards and helpers
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run Lightning's ``training_step``; raises while the training state is offloaded."""
        self._raise_if_offloaded("training_step")
        return super().training_step(*args, **kwargs)  # type: ignore[misc]

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run Lightning's ``validation_step``; raises while the training state is offloaded."""
        self._raise_if_offloaded("validation_step")
        return super().validation_step(*args, **kwargs)  # type: ignore[misc]

    def _raise_if_offloaded(self, what: str) -> None:
        if self._hybrid_offloaded:
            raise RuntimeError(
                f"{type(self).__name__}.{what}() called while the training state is offloaded to host memory; "
                "call strategy.onload_training_state() first (HybridRolloutCallback does this before each step)"
            )

    def _synchronize_device(self, empty_cache: bool) -> None:
        root = self._hybrid_root_device()
        if root.type == "cuda":
            torch.cuda.synchronize(root)
            if empty_cache:
                torch.cuda.empty_cache()

    def _hybrid_lightning_module(self) -> pl.LightningModule:
        module = getattr(self, "lightning_module", None)
        if module is None:
            raise RuntimeError(
                f"{type(self).__name__}: no LightningModule attached yet; offload, onload and the full-weight "
                "gather are available once `trainer.fit` has set the strategy up"
            )
        return module

    def _hybrid_root_device(self) -> torch.device:
        return self.root_device  # type: ignore[attr-defined]

    def _hybrid_global_rank(self) -> int:
        return int(getattr(self, "global_rank", 0))


def _unwrap_optimizers(optimizers: list[Any]) -> Iterator[torch.optim.Optimizer]:
    for optimizer in optimizers:
        yield getattr(optimizer, "_optimizer", optimizer)
