"""The ``"static_fully_async"`` policy: plain fully-async, the baseline (design/scheduling.md §3.2).

With standalone replicas the hybrid ones never help; with ``only_hybrid`` (colocated mode) they generate the whole
cycle, as the specification promises (verl's code never activates there).
"""

from __future__ import annotations

from lightning_hybrid_rollout.schedule.base import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy


@register_policy("static_fully_async")
class StaticFullyAsyncPolicy(DynamicSchedulePolicyBase):
    """Baseline policy: hybrid replicas never help standalone ones (or, colocated, do all the generating).

    The ratio is unused (``only_hybrid`` still forces it to 1.0, like every built-in policy). No adaptive state.

    Args:
        deactivate_ratio: Accepted for a uniform constructor; validated, otherwise unused.
        only_hybrid: No standalone replicas: colocated mode (activate after every sync, wait for a full cycle).

    Example::

        policy = StaticFullyAsyncPolicy()
        ctx = DynamicScheduleContext(required_samples=8, trigger_parameter_sync_step=2)
        assert policy.should_deactivate(1, True, ctx) and policy.deactivate_wait_samples(ctx) == 0
        assert not policy.should_activate_after_step(2, False, ctx)
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
        """0 (deactivate at once); ``step_required_samples`` when ``only_hybrid``.

        Args:
            ctx: The decision context.
        """
        return ctx.step_required_samples if self.only_hybrid else 0

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Never, except in colocated mode (``only_hybrid``): always.

        Args:
            global_steps: The current global step.
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context (unused).
        """
        return self.only_hybrid
