"""Compatibility path for the hybrid strategies (``docs/architecture.md`` names ``lightning/strategy.py``).

The strategies live in :mod:`lightning_hybrid_rollout.lightning.strategies`, one file per strategy; this module
re-exports them so both import paths work.
"""

from lightning_hybrid_rollout.lightning.strategies import (
    DEFAULT_BUCKET_BYTES,
    HybridDDPStrategy,
    HybridDeepSpeedStrategy,
    HybridFSDP2Strategy,
    HybridSingleDeviceStrategy,
    HybridStrategyMixin,
    register_hybrid_strategies,
)

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "HybridDDPStrategy",
    "HybridDeepSpeedStrategy",
    "HybridFSDP2Strategy",
    "HybridSingleDeviceStrategy",
    "HybridStrategyMixin",
    "register_hybrid_strategies",
]
