"""Hybrid Lightning strategies, whose training state steps aside for rollout replicas between training steps; importing
this package registers ``hybrid_single_device``, ``hybrid_ddp``, ``hybrid_fsdp2``, ``hybrid_deepspeed`` and
``hybrid_deepspeed_stage_N`` in Lightning's ``StrategyRegistry`` (docs/strategies.md).

Example::

    >>> import lightning.pytorch as pl
    >>> import lightning_hybrid_rollout.lightning.strategies
    >>> type(pl.Trainer(strategy="hybrid_fsdp2", accelerator="cpu", devices=2, logger=False).strategy).__name__
    'HybridFSDP2Strategy'
"""

from __future__ import annotations

from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.strategies import StrategyRegistry

from lightning_hybrid_rollout.lightning.strategies.base import (
    DEFAULT_BUCKET_BYTES,
    HybridStrategyMixin,
    WeightBucket,
    clean_param_name,
    copy_tensor_to,
    full_nbytes,
)
from lightning_hybrid_rollout.lightning.strategies.ddp import HybridDDPStrategy
from lightning_hybrid_rollout.lightning.strategies.deepspeed import HybridDeepSpeedStrategy
from lightning_hybrid_rollout.lightning.strategies.fsdp2 import HybridFSDP2Strategy, find_decoder_layers
from lightning_hybrid_rollout.lightning.strategies.single_device import HybridSingleDeviceStrategy

HYBRID_STRATEGIES: tuple[type[HybridStrategyMixin], ...] = (
    HybridSingleDeviceStrategy,
    HybridDDPStrategy,
    HybridFSDP2Strategy,
    HybridDeepSpeedStrategy,
)


def register_hybrid_strategies(registry: _StrategyRegistry = StrategyRegistry) -> list[str]:
    """Register the hybrid strategies' short names in ``registry`` (idempotent).

    Args:
        registry: the registry to fill; Lightning's global ``StrategyRegistry`` by default.

    Returns:
        The short names registered by this call (empty when they were already present).
    """
    before = set(registry)
    for cls in HYBRID_STRATEGIES:
        if cls.strategy_name not in registry:  # type: ignore[attr-defined]
            cls.register_strategies(registry)  # type: ignore[attr-defined]
    return sorted(set(registry) - before)


register_hybrid_strategies()

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "HYBRID_STRATEGIES",
    "HybridDDPStrategy",
    "HybridDeepSpeedStrategy",
    "HybridFSDP2Strategy",
    "HybridSingleDeviceStrategy",
    "HybridStrategyMixin",
    "WeightBucket",
    "clean_param_name",
    "copy_tensor_to",
    "find_decoder_layers",
    "full_nbytes",
    "register_hybrid_strategies",
]
