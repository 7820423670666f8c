"""Policy base class, the decision context, and the policy registry.

A policy decides when hybrid replicas are activated and deactivated, purely from the
:class:`DynamicScheduleContext` and its own state (no I/O, no clock); the controller carries the decisions out in
the call order of design/scheduling.md §1, described with the registry's entry points in docs/policies.md.

Example::

    from lightning_hybrid_rollout.schedule import DynamicScheduleContext, create_policy

    policy = create_policy("default", deactivate_ratio=0.3)
    ctx = DynamicScheduleContext(required_samples=32, trigger_parameter_sync_step=4)
    assert policy.deactivate_wait_samples(ctx) == 38  # int(0.3 * 128)
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import math
import types
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

#: Entry-point group third-party packages use to ship policies.
ENTRY_POINT_GROUP = "lightning_hybrid_rollout.policies"

_REGISTRY: dict[str, type[DynamicSchedulePolicyBase]] = {}
# entry points already loaded (name, value), and the errors of those that failed to load, by entry-point name
_LOADED_ENTRY_POINTS: set[tuple[str, str]] = set()
_ENTRY_POINT_ERRORS: dict[str, BaseException] = {}

_P = TypeVar("_P", bound=type["DynamicSchedulePolicyBase"])


@dataclass
class DynamicScheduleContext:
    """Everything a policy may look at when it decides (design/scheduling.md §6 "Use DynamicScheduleContext fields").

    Args:
        required_samples: Samples consumed per collection (one micro fit-step): ``ppo_mini_batch_size ×
            require_batches``.
        trigger_parameter_sync_step: Collections per weight-sync cycle.
        total_generated_samples: Samples the rollouter has produced since training began (cumulative).
        expected_samples: Samples the trainer should have consumed up to the current sync step (cumulative).
        buffer_samples: Allowed buffer headroom above ``expected_samples``. The built-in policies do not read it;
            its exact definition belongs to whoever builds the context (see ``config/async_training.py``).
        step_wait_times: Per collection of the latest cycle: seconds the trainer waited for its batch.
        step_wait_samples: Per collection of the latest cycle (parallel to ``step_wait_times``): samples that had to
            be waited for, ``max(0, required_samples - queue_size_at_collection_start)`` (backlog excluded).
        only_hybrid: True when there are no standalone replicas (rollout ``nnodes = 0``: colocated mode).
        last_activate_duration_s: Seconds the activation of this cycle took (0.0 if none); set by the controller.
        last_deactivate_duration_s: Seconds the deactivation of this cycle took (0.0 if none); set by the controller.

    Example::

        ctx = DynamicScheduleContext(required_samples=32, trigger_parameter_sync_step=4)
        assert ctx.step_required_samples == 128
    """

    required_samples: int = 1
    trigger_parameter_sync_step: int = 1
    total_generated_samples: int = 0
    expected_samples: int = 0
    buffer_samples: int = 0
    step_wait_times: list[float] = field(default_factory=list)
    step_wait_samples: list[int] = field(default_factory=list)
    only_hybrid: bool = False
    last_activate_duration_s: float = 0.0
    last_deactivate_duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.required_samples < 1:
            raise ValueError(f"required_samples must be >= 1, got {self.required_samples}")
        if self.trigger_parameter_sync_step < 1:
            raise ValueError(f"trigger_parameter_sync_step must be >= 1, got {self.trigger_parameter_sync_step}")

    @property
    def step_required_samples(self) -> int:
        """Samples one weight-sync cycle consumes: ``required_samples × trigger_parameter_sync_step``."""
        return self.required_samples * self.trigger_parameter_sync_step


def validate_deactivate_ratio(value: float, name: str = "dynamic_schedule_deactivate_ratio") -> float:
    """Return ``value`` as a float if it lies in (0, 1], else raise ``ValueError`` naming the setting.

    Args:
        value: The ratio to check.
        name: The setting's name, used in the error message.

    Example::

        assert validate_deactivate_ratio(0.3) == 0.3
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    value = float(value)
    if not (0.0 < value <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return value


class DynamicSchedulePolicyBase(ABC):
    """Abstract base of the dynamic resource scheduling policies.

    Subclasses implement :meth:`should_deactivate`, :meth:`deactivate_wait_samples` and
    :meth:`should_activate_after_step`; :meth:`update_after_step` and :meth:`request_rebalance` are optional
    (no-ops here), and so is :meth:`activate_replica_count` (all replicas here). A subclass with adaptive state
    extends :meth:`state_dict` / :meth:`load_state_dict` so that a resumed run makes the same decisions as an
    uninterrupted one.

    ``only_hybrid=True`` (no standalone replicas) forces ``deactivate_ratio = 1.0``.

    Args:
        deactivate_ratio: Fraction in (0, 1] of a sync cycle's samples (``step_required_samples``) to collect
            before hybrid replicas are deactivated. Readable (and writable) as ``policy.deactivate_ratio``.
        only_hybrid: True when there are no standalone replicas (colocated mode).

    Example::

        from lightning_hybrid_rollout.schedule import DynamicSchedulePolicyBase, register_policy

        @register_policy("never_hybrid")
        class NeverHybrid(DynamicSchedulePolicyBase):
            def should_deactivate(self, global_steps, is_hybrid_active, ctx):
                return is_hybrid_active

            def deactivate_wait_samples(self, ctx):
                return 0

            def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
                return False
    """

    deactivate_ratio: float
    only_hybrid: bool

    def __init__(self, deactivate_ratio: float = 0.3, only_hybrid: bool = False) -> None:
        self.deactivate_ratio = validate_deactivate_ratio(deactivate_ratio)
        self.only_hybrid = bool(only_hybrid)
        if self.only_hybrid and self.deactivate_ratio != 1.0:
            logger.info("%s: only_hybrid=True forces deactivate_ratio=1.0", type(self).__name__)
            self.deactivate_ratio = 1.0

    @abstractmethod
    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        """Before training: return True to deactivate the hybrid replicas this step.

        Args:
            global_steps: The current global step (parameter version).
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context.
        """

    @abstractmethod
    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """If :meth:`should_deactivate` said True: how many samples the queue must hold before deactivating.

        Args:
            ctx: The decision context.
        """

    @abstractmethod
    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """After the standalone weight sync: return True to (re-)activate the hybrid replicas for the next cycle.

        Args:
            global_steps: The current global step (parameter version).
            is_hybrid_active: Whether the hybrid replicas are active now.
            ctx: The decision context.
        """

    def activate_replica_count(self, global_steps: int, ctx: DynamicScheduleContext, num_hybrid_replicas: int) -> int:
        """Right after :meth:`should_activate_after_step` said True: how many of the hybrid replicas to lend.

        All of them by default (all-or-nothing, as verl). Asked only by a controller that lends subsets (built with
        ``num_hybrid_replicas``); the answer is clamped to [1, n] and the subset stays fixed until the next
        deactivation.

        Args:
            global_steps: The step that just synced.
            ctx: The decision context.
            num_hybrid_replicas: ``n``, the hybrid replicas there are.
        """
        return num_hybrid_replicas

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:  # noqa: B027
        """After the weight sync (and any activation): update internal state. No-op by default.

        Args:
            global_steps: The current global step (parameter version).
            ctx: The decision context, with this cycle's switch durations filled in.
        """

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> None:  # noqa: B027
        """Right after a real activation, if rebalance is enabled, before the pool rebalances. No-op by default.

        Args:
            global_steps: The current global step (parameter version).
            ctx: The decision context.
        """

    def state_dict(self) -> dict[str, Any]:
        """Return all adaptive state as plain Python values (checkpointable as-is).

        Example::

            state = policy.state_dict()
            policy.load_state_dict(state)
        """
        return {"deactivate_ratio": float(self.deactivate_ratio)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state produced by :meth:`state_dict`.

        Args:
            state_dict: A mapping from :meth:`state_dict`.
        """
        if "deactivate_ratio" in state_dict:
            self.deactivate_ratio = validate_deactivate_ratio(state_dict["deactivate_ratio"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(deactivate_ratio={getattr(self, 'deactivate_ratio', None)!r}, "
            f"only_hybrid={getattr(self, 'only_hybrid', None)!r})"
        )


# ---------------------------------------------------------------------------------------------------- registry


def register_policy(name: str) -> Callable[[_P], _P]:
    """Class decorator: register a :class:`DynamicSchedulePolicyBase` subclass under ``name``.

    Re-registering the same class (or its reload) replaces the entry; a different class under a taken name raises
    ``ValueError``.

    Args:
        name: The name users put in ``dynamic_schedule_policy``.

    Example::

        @register_policy("my_policy")
        class MyPolicy(DynamicSchedulePolicyBase): ...
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy name must be a non-empty string, got {name!r}")

    def decorator(cls: _P) -> _P:
        _register(name, cls)
        return cls

    return decorator


def _register(name: str, cls: Any) -> None:
    if not (isinstance(cls, type) and issubclass(cls, DynamicSchedulePolicyBase)):
        raise TypeError(f"@register_policy({name!r}) needs a DynamicSchedulePolicyBase subclass, got {cls!r}")
    existing = _REGISTRY.get(name)
    if existing is not None and _qualified(existing) != _qualified(cls):
        raise ValueError(
            f"dynamic schedule policy name {name!r} is already registered to {_qualified(existing)}; "
            f"cannot register {_qualified(cls)} under it, choose another name"
        )
    _REGISTRY[name] = cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _load_entry_points() -> None:
    """Load the not-yet-loaded entry points of :data:`ENTRY_POINT_GROUP` (errors are kept, not raised)."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = (ep.name, ep.value)
        if key in _LOADED_ENTRY_POINTS:
            continue
        _LOADED_ENTRY_POINTS.add(key)
        try:
            obj = ep.load()
            if isinstance(obj, type):
                if ep.name not in _REGISTRY or _REGISTRY[ep.name] is not obj:
                    _register(ep.name, obj)
            elif not isinstance(obj, types.ModuleType):  # a module registers through @register_policy on import
                raise TypeError(
                    f"must point at a DynamicSchedulePolicyBase subclass or a module, got {type(obj).__name__}"
                )
        except Exception as err:  # a broken plugin must not break listing; create_policy reports it by name
            _ENTRY_POINT_ERRORS[ep.name] = err
            logger.warning("could not load dynamic schedule policy entry point %s = %s: %s", ep.name, ep.value, err)


def available_policies() -> list[str]:
    """Return the sorted names of all registered policies (entry points included).

    Example::

        assert {"default", "static_fully_async", "fixed_ratio"} <= set(available_policies())
    """
    _load_entry_points()
    return sorted(_REGISTRY)


def policy_starting_ratio(name: str) -> float | None:
    """The ``deactivate_ratio`` default of the policy registered as ``name``'s constructor; None without one.

    The planner and the benchmarks start a policy there unless the user configured it.

    Args:
        name: A registered policy name.

    Example::

        assert (policy_starting_ratio("hysteresis_ratio"), policy_starting_ratio("default")) == (0.4, 0.3)
    """
    param = inspect.signature(get_policy_class(name).__init__).parameters.get("deactivate_ratio")
    if param is None or isinstance(param.default, bool) or not isinstance(param.default, (int, float)):
        return None
    return float(param.default)


def get_policy_class(name: str) -> type[DynamicSchedulePolicyBase]:
    """Return the class registered under ``name``; raise ``ValueError`` listing the known names if none is.

    Args:
        name: A registered policy name.

    Example::

        assert get_policy_class("default").__name__ == "DefaultDynamicSchedulePolicy"
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        _load_entry_points()
        cls = _REGISTRY.get(name)
    if cls is None:
        message = (
            f"unknown dynamic_schedule_policy {name!r}; registered policies: {', '.join(sorted(_REGISTRY)) or '-'}. "
            f"To add one, decorate a DynamicSchedulePolicyBase subclass with @register_policy({name!r}) and import "
            f"its module before the trainer is built, or expose it in the {ENTRY_POINT_GROUP!r} entry-point group "
            f"of your package (see docs/policies.md)"
        )
        error = _ENTRY_POINT_ERRORS.get(name)
        if error is not None:
            raise ValueError(f"{message}. The entry point {name!r} failed to load: {error}") from error
        raise ValueError(message)
    return cls


def create_policy(name: str, **kwargs: Any) -> DynamicSchedulePolicyBase:
    """Instantiate the policy registered under ``name``, forwarding ``kwargs`` to its constructor.

    Args:
        name: A registered policy name (``"default"``, ``"static_fully_async"``, ``"fixed_ratio"``, or your own).
        **kwargs: Constructor arguments, typically ``deactivate_ratio`` and ``only_hybrid``.

    Example::

        policy = create_policy("fixed_ratio", deactivate_ratio=0.5)
        assert policy.deactivate_ratio == 0.5
    """
    return get_policy_class(name)(**kwargs)


def finite_state_value(value: float, name: str) -> float:
    """``value`` as a float, refused if it is not finite (a policy's ``load_state_dict`` checks its numbers so).

    Args:
        value: The number read from a state dict.
        name: Its key, for the error message.

    Raises:
        ValueError: ``value`` is NaN or infinite.
    """
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value
