"""``HybridFSDP2Strategy`` ("hybrid_fsdp2"): FSDP2 (``fully_shard``) with offload / onload and full-weight streaming."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.init import _materialize_distributed_module
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn
from typing_extensions import override

from lightning_hybrid_rollout.lightning.strategies.base import DEFAULT_BUCKET_BYTES, HybridStrategyMixin, WeightBucket


def find_decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a causal LM, each of which becomes its own FSDP2 unit.

    HF models name their block classes in ``_no_split_modules`` (``["LlamaDecoderLayer"]`` for Llama); failing
    that, ``model.model.layers`` / ``model.layers`` (a ``ModuleList``) is used.

    Args:
        model: the policy model (e.g. a ``transformers.LlamaForCausalLM``).

    Returns:
        The blocks in module order; empty if none were found.

    Example::

        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                   num_attention_heads=4, num_key_value_heads=4)
        >>> [type(m).__name__ for m in find_decoder_layers(LlamaForCausalLM(cfg))]
        ['LlamaDecoderLayer', 'LlamaDecoderLayer']
    """
    block_names = set(getattr(model, "_no_split_modules", None) or ())
    if block_names:
        blocks = [m for m in model.modules() if type(m).__name__ in block_names]
        if blocks:
            return blocks
    for owner in (getattr(model, "model", None), model):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, (nn.ModuleList, nn.Sequential)):
            return list(layers)
    return []


class HybridFSDP2Strategy(HybridStrategyMixin, ModelParallelStrategy):
    """FSDP2 training (``ModelParallelStrategy`` + ``fully_shard``) whose state can be offloaded between steps.

    If the LightningModule does not apply ``fully_shard`` in ``configure_model`` (or does not define it), the
    strategy shards each decoder layer of :attr:`policy_module` (see :func:`find_decoder_layers`) and then the policy
    model as the root unit, over the data-parallel mesh (all ranks by default). Trainable parameters outside the
    policy model then raise: shard them yourself in ``configure_model``.

    The full-weight stream all-gathers one tensor at a time, so its peak extra memory is one full tensor plus one
    bucket; it works while offloaded.

    Args:
        data_parallel_size: FSDP sharding group size; ``"auto"`` uses every rank (world size / tensor parallel).
        tensor_parallel_size: tensor-parallel group size (default 1; with more, apply the parallelism yourself in
            ``configure_model``).
        fsdp_kwargs: extra keyword arguments for ``fully_shard`` when the strategy shards the model
            (e.g. ``{"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)}``).
        pin_memory: offload into page-locked host memory (CUDA only).
        **kwargs: forwarded to :class:`~lightning.pytorch.strategies.ModelParallelStrategy`.

    Example::

        >>> import lightning.pytorch as pl
        >>> import lightning_hybrid_rollout.lightning  # registers the hybrid strategies
        >>> trainer = pl.Trainer(strategy="hybrid_fsdp2", accelerator="cpu", devices=2, logger=False)
        >>> type(trainer.strategy).__name__
        'HybridFSDP2Strategy'
    """

    strategy_name = "hybrid_fsdp2"

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = 1,
        fsdp_kwargs: dict[str, Any] | None = None,
        pin_memory: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_parallel_size=data_parallel_size, tensor_parallel_size=tensor_parallel_size, **kwargs)
        self.fsdp_kwargs = dict(fsdp_kwargs or {})
        self.pin_memory = pin_memory

    @override
    def setup_environment(self) -> None:
        world_size = self.num_nodes * self.num_processes
        if self._tensor_parallel_size == "auto":
            self._tensor_parallel_size = 1
        if self._data_parallel_size == "auto":
            self._data_parallel_size = max(1, world_size // int(self._tensor_parallel_size))
        super().setup_environment()

    @override
    def setup(self, trainer: pl.Trainer) -> None:
        # ModelParallelStrategy.setup, minus its requirement that the module overrides `configure_model`:
        # here the strategy shards the model itself when the module did not.
        from torch.distributed.fsdp import FullyShardedDataParallel

        assert self.model is not None
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        if any(isinstance(mod, FullyShardedDataParallel) for mod in self.model.modules()):
            raise TypeError(
                "Found modules wrapped with FSDP1 `FullyShardedDataParallel`; "
                f"`{type(self).__name__}` supports only FSDP2 (`fully_shard`)."
            )
        self._shard_if_needed()
        _materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _shard_if_needed(self) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        assert self.model is not None
        if any(isinstance(mod, FSDPModule) for mod in self.model.modules()):
            return  # the module applied its own parallelism in configure_model
        if int(self._tensor_parallel_size) != 1:
            raise ValueError(
                f"{type(self).__name__}: tensor_parallel_size={self._tensor_parallel_size} requires the LightningModule"
                " to apply its parallelism in `configure_model`; the automatic sharding is FSDP-only (size 1)"
            )
        policy = self.policy_module
        policy_name = type(policy).__name__
        mesh = self.device_mesh["data_parallel"]
        layers = find_decoder_layers(policy)
        if not layers:
            rank_zero_warn(f"{type(self).__name__}: no decoder layers found on {policy_name}; sharding it as one unit")
        for layer in layers:
            fully_shard(layer, mesh=mesh, **self.fsdp_kwargs)
        fully_shard(policy, mesh=mesh, **self.fsdp_kwargs)
        policy_params = {id(p) for p in policy.parameters()}
        outside = [n for n, p in self.model.named_parameters() if p.requires_grad and id(p) not in policy_params]
        if outside:
            raise TypeError(
                f"{type(self).__name__} sharded the policy model but the LightningModule has trainable parameters "
                f"outside it ({outside[:3]}...); apply `fully_shard` to them in `configure_model`"
            )
        rank_zero_info(
            f"{type(self).__name__}: applied fully_shard to {len(layers)} decoder layers + {policy_name}"
            f" over {mesh.size()} ranks"
        )

    @override
    def iter_full_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, *, rank_zero_only: bool = False, adapter_only: bool = False
    ) -> Iterator[WeightBucket]:
        from torch.distributed.fsdp import FSDPModule

        for module in self.policy_module.modules():
            if isinstance(module, FSDPModule):
                module.reshard()  # the state dict must expose the sharded parameters, not unsharded leftovers
        yield from super().iter_full_weights(bucket_bytes, rank_zero_only=rank_zero_only, adapter_only=adapter_only)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        if not torch.distributed.is_available():
            return
        strategy_registry.register(
            cls.strategy_name, cls, description="FSDP2 (fully_shard), training state offloadable for hybrid rollout"
        )
