"""``HybridDDPStrategy`` ("hybrid_ddp"): DDP whose training state can be offloaded between steps."""

from __future__ import annotations

from typing import Any

from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_hybrid_rollout.lightning.strategies.base import HybridStrategyMixin


class HybridDDPStrategy(HybridStrategyMixin, DDPStrategy):
    """DistributedDataParallel with offload / onload of the training state and full-weight streaming.

    Every rank holds the full model, so :meth:`iter_full_weights` needs no collective. Offload moves parameters,
    gradients, buffers and optimizer state; DDP's reducer keeps its own gradient buckets (about one model-size
    buffer) on the device, which no public API frees: for models where that matters prefer
    :class:`~lightning_hybrid_rollout.lightning.strategies.HybridFSDP2Strategy` or DeepSpeed.

    Args:
        pin_memory: offload into page-locked host memory (CUDA only).
        **kwargs: forwarded to :class:`~lightning.pytorch.strategies.DDPStrategy` (``process_group_backend``
            defaults to gloo on CPU and NCCL on CUDA).

    Example::

        >>> import lightning.pytorch as pl
        >>> import lightning_hybrid_rollout.lightning  # registers the hybrid strategies
        >>> trainer = pl.Trainer(strategy="hybrid_ddp", accelerator="cpu", devices=2, logger=False)
        >>> type(trainer.strategy).__name__
        'HybridDDPStrategy'
    """

    strategy_name = "hybrid_ddp"

    def __init__(self, pin_memory: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pin_memory = pin_memory

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="DDP, training state offloadable for hybrid rollout"
        )
