"""Both sections checked together: :func:`validate_run_config` (the cross-field rules) and
:class:`HybridRolloutConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_hybrid_rollout.config.async_training import AsyncTrainingConfig
from lightning_hybrid_rollout.config.base import Checker, ConfigBase
from lightning_hybrid_rollout.config.fields import section
from lightning_hybrid_rollout.config.rollout import RolloutConfig
from lightning_hybrid_rollout.errors import ConfigError

# --------------------------------------------------------------------------------------------------------------
# both sections
# --------------------------------------------------------------------------------------------------------------


def _cross_field_problems(a: AsyncTrainingConfig, r: RolloutConfig) -> list[str]:
    problems: list[str] = []
    if a.only_hybrid and r.hybrid_replicas == 0:
        problems.append(
            "rollout.hybrid_replicas must be >= 1 when async_training.only_hybrid is true, got 0. Colocated mode "
            "generates on hybrid replicas only: set rollout.hybrid_replicas >= 1 or only_hybrid: false."
        )
    if a.only_hybrid and r.standalone_replicas > 0:
        problems.append(
            f"rollout.standalone_replicas must be 0 when async_training.only_hybrid is true, got "
            f"{r.standalone_replicas}. Colocated mode has no standalone replicas: set standalone_replicas: 0 or "
            f"only_hybrid: false."
        )
    if a.only_hybrid and not a.use_dynamic_resource_scheduling:
        problems.append(
            "async_training.use_dynamic_resource_scheduling must be true when async_training.only_hybrid is true, "
            "got false. Without scheduling the hybrid replicas never generate: enable it or set only_hybrid: false."
        )
    if not a.use_dynamic_resource_scheduling and r.hybrid_replicas > 0:
        problems.append(
            f"rollout.hybrid_replicas must be 0 when async_training.use_dynamic_resource_scheduling is false, got "
            f"{r.hybrid_replicas}. Set hybrid_replicas: 0, or keep scheduling on with dynamic_schedule_policy: "
            f"static_fully_async for a baseline that never lends them."
        )
    if r.standalone_replicas + r.hybrid_replicas == 0:
        problems.append(
            "rollout.standalone_replicas + rollout.hybrid_replicas must be >= 1, got 0 + 0. Nothing would generate "
            "samples: add at least one replica."
        )
    if a.mini_batch_size % r.n:
        prompts = max(1, round(a.mini_batch_size / r.n))
        problems.append(
            f"async_training.mini_batch_size must be a multiple of rollout.n={r.n}, got {a.mini_batch_size}. A "
            f"step trains whole groups: use e.g. {prompts * r.n} ({prompts} prompts × n={r.n})."
        )
    return problems


def validate_run_config(async_cfg: AsyncTrainingConfig, rollout_cfg: RolloutConfig) -> None:
    """Check what needs both sections (each section validated itself already).

    Raises:
        ConfigError: with one message per violated rule.
    """
    problems = _cross_field_problems(async_cfg, rollout_cfg)
    if problems:
        raise ConfigError(problems)


@dataclass
class HybridRolloutConfig(ConfigBase):
    """A whole run's scheduling config: the ``async_training`` and ``rollout`` sections, checked together.

    Example::

        >>> HybridRolloutConfig(
        ...     AsyncTrainingConfig(only_hybrid=True), RolloutConfig(standalone_replicas=0, hybrid_replicas=2)
        ... ).rollout_capacity(2)  # min(2 * 16, int(64 * 1.1 * 4))
        32
    """

    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig, fix="Use HybridRolloutConfig.from_dict for plain mappings."
    )
    """verl's ``async_training`` section: dynamic resource scheduling and fully-async staleness."""

    rollout: RolloutConfig = section(RolloutConfig, fix="Use HybridRolloutConfig.from_dict for plain mappings.")
    """Replicas, sampling and engine settings."""

    def check(self, c: Checker) -> None:
        c.problems.extend(_cross_field_problems(self.async_training, self.rollout))

    def rollout_capacity(self, active_servers: int) -> int:
        """The rollouter's concurrency cap with ``active_servers`` replicas routed:
        ``min(active_servers * concurrent_samples_per_replica, max_required_samples)`` (design/scheduling.md §4.2)."""
        from lightning_hybrid_rollout.metrics import rollout_capacity

        return rollout_capacity(
            active_servers, self.rollout.concurrent_samples_per_replica, self.async_training.max_required_samples
        )
