"""Policy registry: the decorator, entry points (a fake importlib.metadata EntryPoint), errors, validation."""

from __future__ import annotations

import importlib.metadata
import logging
import math
import uuid
from pathlib import Path

import pytest

from lightning_hybrid_rollout.schedule import (
    DefaultDynamicSchedulePolicy,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    FixedRatioDynamicSchedulePolicy,
    StaticFullyAsyncPolicy,
    available_policies,
    create_policy,
    get_policy_class,
    policy_starting_ratio,
    register_policy,
)
from lightning_hybrid_rollout.schedule.base import ENTRY_POINT_GROUP

POLICY_SOURCE = """
from lightning_hybrid_rollout.schedule import DynamicSchedulePolicyBase, register_policy


class EpPolicy(DynamicSchedulePolicyBase):
    def should_deactivate(self, global_steps, is_hybrid_active, ctx):
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx):
        return 7

    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
        return False


@register_policy("ep_module_policy")
class EpModulePolicy(EpPolicy):
    pass


def not_a_policy():
    return None
"""


class _Noop(DynamicSchedulePolicyBase):
    def should_deactivate(self, global_steps, is_hybrid_active, ctx):
        return False

    def deactivate_wait_samples(self, ctx):
        return 0

    def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
        return False


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh importable module (unique name) defining EpPolicy, and EpModulePolicy registered on import."""
    name = f"lhr_fake_plugin_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(POLICY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def fake_entry_points(monkeypatch: pytest.MonkeyPatch, *entries: tuple[str, str]) -> list[str]:
    """Make importlib.metadata.entry_points return these (name, value) pairs; return a log of group queries."""
    calls: list[str] = []
    eps = [importlib.metadata.EntryPoint(name=n, value=v, group=ENTRY_POINT_GROUP) for n, v in entries]

    def entry_points(**params):
        calls.append(params.get("group"))
        return [ep for ep in eps if ep.group == params.get("group")]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return calls


def test_builtin_policies_are_registered_under_their_seed_names():
    assert {"default", "static_fully_async", "fixed_ratio"} <= set(available_policies())
    assert get_policy_class("default") is DefaultDynamicSchedulePolicy
    assert get_policy_class("static_fully_async") is StaticFullyAsyncPolicy
    assert get_policy_class("fixed_ratio") is FixedRatioDynamicSchedulePolicy


def test_create_policy_forwards_constructor_arguments():
    policy = create_policy("default", deactivate_ratio=0.4, only_hybrid=False, min_deactivate_ratio=0.1)
    assert isinstance(policy, DefaultDynamicSchedulePolicy)
    assert (policy.deactivate_ratio, policy.only_hybrid, policy.min_deactivate_ratio) == (0.4, False, 0.1)


def test_register_policy_decorator_makes_a_class_creatable_by_name(isolated_registry):
    @register_policy("noop_for_test")
    class Noop(_Noop):
        pass

    assert "noop_for_test" in available_policies()
    policy = create_policy("noop_for_test", deactivate_ratio=0.9)
    assert isinstance(policy, Noop)
    assert policy.deactivate_ratio == 0.9


def test_register_policy_refuses_a_taken_name_for_a_different_class(isolated_registry):
    with pytest.raises(ValueError, match=r"'default' is already registered to .*DefaultDynamicSchedulePolicy"):
        register_policy("default")(_Noop)


def test_register_policy_accepts_the_same_class_again(isolated_registry):
    register_policy("noop_twice")(_Noop)
    register_policy("noop_twice")(_Noop)
    assert get_policy_class("noop_twice") is _Noop


def test_register_policy_refuses_a_non_policy_class(isolated_registry):
    with pytest.raises(TypeError, match="needs a DynamicSchedulePolicyBase subclass"):
        register_policy("not_a_policy")(dict)
    with pytest.raises(ValueError, match="non-empty string"):
        register_policy("")


def test_unknown_policy_error_lists_registered_names_and_how_to_register(isolated_registry, monkeypatch):
    fake_entry_points(monkeypatch)
    with pytest.raises(ValueError) as info:
        create_policy("nope")
    message = str(info.value)
    assert "unknown dynamic_schedule_policy 'nope'" in message
    for name in ("default", "fixed_ratio", "static_fully_async", "rate_matched"):
        assert name in message
    assert "@register_policy('nope')" in message
    assert ENTRY_POINT_GROUP in message


def test_entry_point_to_a_class_registers_it_under_the_entry_point_name(isolated_registry, monkeypatch, plugin_module):
    fake_entry_points(monkeypatch, ("ep_class_policy", f"{plugin_module}:EpPolicy"))
    cls = get_policy_class("ep_class_policy")
    assert cls.__name__ == "EpPolicy"
    policy = create_policy("ep_class_policy", deactivate_ratio=0.5)
    assert policy.deactivate_wait_samples(DynamicScheduleContext()) == 7
    assert "ep_class_policy" in available_policies()


def test_entry_point_to_a_module_registers_through_its_decorators(isolated_registry, monkeypatch, plugin_module):
    fake_entry_points(monkeypatch, ("my_plugin", plugin_module))
    assert "ep_module_policy" in available_policies()
    assert "my_plugin" not in available_policies()  # a module entry point's own name is not a policy
    assert get_policy_class("ep_module_policy").__name__ == "EpModulePolicy"


def test_entry_points_are_not_loaded_when_the_name_is_already_registered(isolated_registry, monkeypatch):
    calls = fake_entry_points(monkeypatch, ("ep_class_policy", "no_such_module_xyz:Nope"))
    create_policy("default")
    assert calls == []
    available_policies()
    assert calls == [ENTRY_POINT_GROUP]


def test_a_broken_entry_point_does_not_break_listing_but_is_reported_by_name(isolated_registry, monkeypatch, caplog):
    fake_entry_points(monkeypatch, ("broken", "no_such_module_xyz:Nope"))
    with caplog.at_level(logging.WARNING, logger="lightning_hybrid_rollout.schedule.base"):
        names = available_policies()
    assert "default" in names and "broken" not in names
    assert "could not load dynamic schedule policy entry point broken" in caplog.text
    with pytest.raises(ValueError, match="entry point 'broken' failed to load: No module named 'no_such_module_xyz'"):
        create_policy("broken")


def test_an_entry_point_to_something_else_is_reported(isolated_registry, monkeypatch, plugin_module):
    fake_entry_points(monkeypatch, ("weird", f"{plugin_module}:not_a_policy"))
    with pytest.raises(ValueError, match="'weird' failed to load: must point at a DynamicSchedulePolicyBase subclass"):
        get_policy_class("weird")


@pytest.mark.parametrize("bad", [1.5, 0, 0.0, -0.1, math.nan, math.inf])
@pytest.mark.parametrize("name", ["default", "static_fully_async", "fixed_ratio"])
def test_every_policy_validates_deactivate_ratio_in_zero_one(name, bad):
    with pytest.raises(ValueError, match=r"^dynamic_schedule_deactivate_ratio must be in \(0, 1\], got "):
        create_policy(name, deactivate_ratio=bad)


def test_ratio_error_message_shows_the_value_seen():
    with pytest.raises(ValueError) as info:
        create_policy("default", deactivate_ratio=1.5)
    assert str(info.value) == "dynamic_schedule_deactivate_ratio must be in (0, 1], got 1.5"
    with pytest.raises(ValueError, match="must be a number in"):
        create_policy("default", deactivate_ratio="0.3")
    with pytest.raises(ValueError, match="must be a number in"):
        create_policy("default", deactivate_ratio=True)


def test_ratio_of_exactly_one_is_valid():
    assert create_policy("fixed_ratio", deactivate_ratio=1).deactivate_ratio == 1.0


def test_context_step_required_samples_is_derived_and_follows_changes():
    ctx = DynamicScheduleContext(required_samples=32, trigger_parameter_sync_step=4)
    assert ctx.step_required_samples == 128
    ctx.required_samples = 16
    assert ctx.step_required_samples == 64
    assert DynamicScheduleContext().step_wait_times == [] and DynamicScheduleContext().step_wait_samples == []


@pytest.mark.parametrize("field", ["required_samples", "trigger_parameter_sync_step"])
def test_context_rejects_non_positive_sizes(field):
    with pytest.raises(ValueError, match=f"{field} must be >= 1, got 0"):
        DynamicScheduleContext(**{field: 0})


def test_seed_style_subclass_without_super_init_works_and_checkpoints():
    # design/scheduling.md §6's example sets the attributes itself and never calls super().__init__()
    class SeedStyle(DynamicSchedulePolicyBase):
        def __init__(self, deactivate_ratio: float = 0.5, only_hybrid: bool = False):
            self.deactivate_ratio = deactivate_ratio
            self.only_hybrid = only_hybrid

        def should_deactivate(self, global_steps, is_hybrid_active, ctx):
            return is_hybrid_active

        def deactivate_wait_samples(self, ctx):
            return int(ctx.required_samples * ctx.trigger_parameter_sync_step * self.deactivate_ratio)

        def should_activate_after_step(self, global_steps, is_hybrid_active, ctx):
            return ctx.total_generated_samples < ctx.expected_samples + ctx.buffer_samples

    policy = SeedStyle()
    policy.update_after_step(1, DynamicScheduleContext())  # optional hooks default to no-ops
    policy.request_rebalance(1, DynamicScheduleContext())
    assert policy.state_dict() == {"deactivate_ratio": 0.5}
    assert "SeedStyle(deactivate_ratio=0.5" in repr(policy)


def test_a_policy_starts_from_its_constructors_deactivate_ratio_default(isolated_registry):
    class Eager(_Noop):
        def __init__(self, deactivate_ratio: float = 0.55, only_hybrid: bool = False) -> None:
            super().__init__(deactivate_ratio, only_hybrid)

    class NoRatio(_Noop):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)

    register_policy("eager_for_test")(Eager)
    register_policy("no_ratio_for_test")(NoRatio)
    assert policy_starting_ratio("eager_for_test") == 0.55 == create_policy("eager_for_test").deactivate_ratio
    assert policy_starting_ratio("no_ratio_for_test") is None
    # verl v1's rule starts from verl's switch_threshold_ratio; the seed's policies from the config's default
    assert policy_starting_ratio("hysteresis_ratio") == 0.4 == create_policy("hysteresis_ratio").deactivate_ratio
    assert policy_starting_ratio("default") == 0.3
