"""Dynamic resource scheduling: when hybrid replicas (on the trainer's devices) help generate, and how they switch.

Pure Python (no torch, Ray, vLLM, I/O or clock reads): the runtime callback and the simulator run this same code.

Two kinds of inference replicas: standalone (dedicated rollout devices, always on) and hybrid (the trainer's
devices, lent to rollout while the trainer would otherwise wait). A policy decides; the controller acts.

State machine (:class:`DynamicResourceController`)::

    STANDALONE_ONLY  <->  HYBRID_ACTIVE
    activate   (after weight sync): wake_up_replicas -> sync_weights -> add_replicas -> resume_generation_replicas
    deactivate (before training):   remove_replicas -> abort_replicas -> sleep_replicas   (order is critical:
                                    cut routing first, so partial-rollout retries go to standalone replicas)

Policy call order per training step (design/scheduling.md §1), encoded in ``controller.before_step`` /
``controller.after_sync``::

    1. should_deactivate()          before training; decide whether to deactivate hybrid replicas
    2. deactivate_wait_samples()    if (1) is True: samples the queue must hold before deactivating
    3. should_activate_after_step() after weight sync; decide whether to (re-)activate hybrid replicas
    4. request_rebalance()          after a real activation, if rebalance is enabled
    5. update_after_step()          after weight sync; update the policy's internal state

Built-in policies: ``"default"`` (:class:`DefaultDynamicSchedulePolicy`), ``"static_fully_async"``
(:class:`StaticFullyAsyncPolicy`), ``"fixed_ratio"`` (:class:`FixedRatioDynamicSchedulePolicy`), ``"rate_matched"``
(:class:`RateMatchedDynamicSchedulePolicy`) and ``"hysteresis_ratio"`` (:class:`HysteresisRatioDynamicSchedulePolicy`,
verl v1 ``separate_async``'s switch rule, a baseline); all are registered on import. Add your own with
:func:`register_policy` or the ``lightning_hybrid_rollout.policies`` entry-point group (docs/policies.md).

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
