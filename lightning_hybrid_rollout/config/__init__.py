"""Typed, validated configuration with verl's parameter names (design/scheduling.md §2).

:class:`AsyncTrainingConfig` (``async_training``, with the derived sample counts of :func:`derived_counts`),
:class:`RolloutConfig` (``rollout``) and :class:`HybridRolloutConfig` (both, checked together). Every field's
attribute docstring is its LightningCLI ``--help`` text (docs/configuration.md has the full table); every bad value
gives one line naming the key, the value and the fix, collected into one :class:`ConfigError`.

Example::

    >>> cfg = HybridRolloutConfig.from_dict(
    ...     {"async_training": {"mini_batch_size": 32}, "rollout": {"n": 8, "standalone_replicas": 1}}
    ... )
    >>> cfg.async_training.max_required_samples  # int(32 * 1 * (0.1 + 1) * 4)
    140
"""

from __future__ import annotations

from lightning_hybrid_rollout.config.async_training import AsyncTrainingConfig, DerivedCounts, derived_counts
from lightning_hybrid_rollout.config.base import (
    BUILTIN_POLICIES,
    DTYPES,
    RUN_CONFIG_FILE,
    WEIGHT_ENCODINGS,
    WEIGHT_TRANSPORTS,
    available_policy_names,
    field_docs,
    policy_kwargs_problems,
)
from lightning_hybrid_rollout.config.rollout import RolloutConfig
from lightning_hybrid_rollout.config.run import HybridRolloutConfig, validate_run_config
from lightning_hybrid_rollout.config.tiny_model import TinyModelConfig
from lightning_hybrid_rollout.errors import ConfigError

__all__ = [
    "BUILTIN_POLICIES",
    "DTYPES",
    "RUN_CONFIG_FILE",
    "WEIGHT_ENCODINGS",
    "WEIGHT_TRANSPORTS",
    "AsyncTrainingConfig",
    "ConfigError",
    "DerivedCounts",
    "HybridRolloutConfig",
    "RolloutConfig",
    "TinyModelConfig",
    "available_policy_names",
    "derived_counts",
    "field_docs",
    "policy_kwargs_problems",
    "validate_run_config",
]
