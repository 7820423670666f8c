"""Dynamic resource scheduling: when hybrid replicas (on the trainer's devices) help generate, and how they switch.

Pure Python (no torch, Ray, vLLM, I/O or clock reads), so the runtime callback and the simulator run this same
code: a policy decides (docs/policies.md), the :class:`DynamicResourceController` acts (docs/controller.md). All
built-in policies are registered on import; add your own with :func:`register_policy` or the
``lightning_hybrid_rollout.policies`` entry-point group.

Example::

    from lightning_hybrid_rollout.schedule import DynamicScheduleContext, available_policies, create_policy

    assert {"default", "fixed_ratio", "static_fully_async"} <= set(available_policies())
    policy = create_policy("default", deactivate_ratio=0.3)
    assert policy.deactivate_wait_samples(DynamicScheduleContext(required_samples=10)) == 3
"""

from lightning_hybrid_rollout.schedule.base import (
    ENTRY_POINT_GROUP,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    available_policies,
    create_policy,
    get_policy_class,
    policy_starting_ratio,
    register_policy,
)
from lightning_hybrid_rollout.schedule.controller import (
    ControllerState,
    DynamicResourceController,
    ReplicaPool,
    ReplicaPoolError,
    StepEndResult,
    StepStartResult,
    SwitchRecord,
)
from lightning_hybrid_rollout.schedule.default_policy import ActivationEstimate, DefaultDynamicSchedulePolicy
from lightning_hybrid_rollout.schedule.fixed_ratio_policy import FixedRatioDynamicSchedulePolicy
from lightning_hybrid_rollout.schedule.hysteresis_ratio_policy import HysteresisRatioDynamicSchedulePolicy
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateMatchedDynamicSchedulePolicy, RateScheduleContext
from lightning_hybrid_rollout.schedule.static_fully_async_policy import StaticFullyAsyncPolicy

__all__ = [
    "ENTRY_POINT_GROUP",
    "ActivationEstimate",
    "ControllerState",
    "DefaultDynamicSchedulePolicy",
    "DynamicResourceController",
    "DynamicScheduleContext",
    "DynamicSchedulePolicyBase",
    "FixedRatioDynamicSchedulePolicy",
    "HysteresisRatioDynamicSchedulePolicy",
    "RateMatchedDynamicSchedulePolicy",
    "RateScheduleContext",
    "ReplicaPool",
    "ReplicaPoolError",
    "StaticFullyAsyncPolicy",
    "StepEndResult",
    "StepStartResult",
    "SwitchRecord",
    "available_policies",
    "create_policy",
    "get_policy_class",
    "policy_starting_ratio",
    "register_policy",
]
