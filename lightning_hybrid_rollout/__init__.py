"""lightning_hybrid_rollout: fully-async RL for LLMs on PyTorch Lightning with hybrid rollout replicas.

The top-level package is light: importing it registers the built-in scheduling policies (pure Python) and
nothing else. Heavy parts (torch, Ray, vLLM, Lightning) load lazily on first attribute access, so
``import lightning_hybrid_rollout.schedule`` works in a process that never touches a GPU stack.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_hybrid_rollout import schedule  # noqa: F401  (registers the built-in policies)

__version__ = "0.1.0"

# public name -> module that defines it (loaded on first access)
_LAZY: dict[str, str] = {
    "DynamicResourceController": "lightning_hybrid_rollout.schedule",
    "DynamicSchedulePolicyBase": "lightning_hybrid_rollout.schedule",
    "DynamicScheduleContext": "lightning_hybrid_rollout.schedule",
    "register_policy": "lightning_hybrid_rollout.schedule",
    "create_policy": "lightning_hybrid_rollout.schedule",
    "available_policies": "lightning_hybrid_rollout.schedule",
    "AsyncTrainingConfig": "lightning_hybrid_rollout.config",
    "RolloutConfig": "lightning_hybrid_rollout.config",
    "HybridRolloutConfig": "lightning_hybrid_rollout.config",
    "ConfigError": "lightning_hybrid_rollout.config",
    "HybridRolloutCallback": "lightning_hybrid_rollout.lightning.callback",
    "GRPOModule": "lightning_hybrid_rollout.lightning.module",
    "RolloutDataModule": "lightning_hybrid_rollout.lightning.data",
    "HybridRolloutError": "lightning_hybrid_rollout.errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_hybrid_rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
