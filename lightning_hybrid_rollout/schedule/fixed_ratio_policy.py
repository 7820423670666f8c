"""The ``"fixed_ratio"`` policy: the ``default`` policy with a constant ratio and a plain gap check, for ablations
(design/scheduling.md §3.3).
"""

from __future__ import annotations

import logging

from lightning_hybrid_rollout.schedule.base import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy
from lightning_hybrid_rollout.schedule.default_policy import deactivate_gap, deactivate_threshold

logger = logging.getLogger(__name__)


@register_policy("fixed_ratio")
class FixedRatioDynamicSchedulePolicy(DynamicSchedulePolicyBase):
    """Fixed-ratio policy: like ``default`` with a constant ratio and a plain gap check for activation.

    Its only state is the (constant) ratio.

    Args:
        deactivate_ratio: The fixed ratio in (0, 1].
        only_hybrid: No standalone replicas: forces ratio 1.0 and always activates.

    Example::

        policy = FixedRatioDynamicSchedulePolicy(deactivate_ratio=0.5)
        ctx = DynamicScheduleContext(required_samples=10, trigger_parameter_sync_step=2,
                                     total_generated_samples=109, expected_samples=100)
        assert policy.deactivate_wait_samples(ctx) == 10
        assert policy.should_activate_after_step(2, False, ctx)  # gap = 10 - 9 = 1 > 0
    """

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        """Deactivate whenever the hybrid replicas are active.

        Args:
            global_steps: The current global step.
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context (unused).
        """
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """``int(step_required_samples × ratio)``.

        Args:
            ctx: The decision context.
        """
        return int(deactivate_threshold(self.deactivate_ratio, ctx))

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """True if ``only_hybrid``; else iff the gap to the deactivate threshold is positive.

        Args:
            global_steps: The current global step.
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context.
        """
        if self.only_hybrid:
            return True
        gap = deactivate_gap(self.deactivate_ratio, ctx)
        logger.debug("fixed_ratio policy step=%d gate: gap=%.3f -> %s", global_steps, gap, gap > 0)
        return gap > 0

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        """No-op: the ratio never changes.

        Args:
            global_steps: The current global step.
            ctx: The decision context (unused).
        """
