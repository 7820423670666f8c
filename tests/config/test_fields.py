"""Every config section uses the one idiom of ``config/fields.py``: the list below names them all (a section added
anywhere in the package without joining it fails the first test), every field declares its rule and its help, no
section checks values by hand, and each declared rule refuses a bad value in one line naming the key."""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.agentic.config import AgenticConfig
from lightning_hybrid_rollout.config import (
    AsyncTrainingConfig,
    ConfigError,
    HybridRolloutConfig,
    RolloutConfig,
    TinyModelConfig,
)
from lightning_hybrid_rollout.config.base import ConfigBase, field_docs, field_help
from lightning_hybrid_rollout.config.fields import Rule, field_rule
from lightning_hybrid_rollout.rewards.config import RewardConfig
from lightning_hybrid_rollout.sim import lending, scenario
from lightning_hybrid_rollout.sources.config import DatasetConfig
from lightning_hybrid_rollout.training.off_policy import OffPolicyCorrection

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_hybrid_rollout"

#: Every config section of the package, with the keyword arguments its required fields need.
SECTIONS: dict[type, dict[str, Any]] = {
    AsyncTrainingConfig: {},
    RolloutConfig: {},
    HybridRolloutConfig: {},
    TinyModelConfig: {},
    DatasetConfig: {"path": "data/train.jsonl"},
    RewardConfig: {},
    AgenticConfig: {},
    OffPolicyCorrection: {},
    scenario.LengthModel: {},
    scenario.ReplicaModel: {},
    scenario.TrainerModel: {},
    scenario.SwitchCosts: {},
    scenario.AgenticModel: {},
    scenario.LoraModel: {},
    lending.LendingModel: {},
    scenario.RunSpec: {"name": "r", "train_devices": 1, "rollout_devices": 1},
    scenario.Scenario: {"name": "x"},
}


def _section_classes_in_source() -> set[str]:
    """Classes of the package that subclass ``ConfigBase`` or declare a ``SECTION`` (read from the source)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name == "ConfigBase":
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            declares = any(
                isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == "SECTION"
                for s in node.body
            )
            if "ConfigBase" in bases or declares:
                found.add(node.name)
    return found


def test_every_config_section_of_the_package_is_on_the_list() -> None:
    listed = {cls.__name__ for cls in SECTIONS}
    assert _section_classes_in_source() - listed == set()
    assert all(issubclass(cls, ConfigBase) for cls in SECTIONS)


@pytest.mark.parametrize("cls", list(SECTIONS), ids=lambda c: c.__name__)
def test_every_field_declares_its_rule_and_its_help(cls: type) -> None:
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        assert isinstance(field_rule(f), Rule), f"{cls.__name__}.{f.name} has no declared rule"
        assert len(docs.get(f.name, "")) > 10, f"{cls.__name__}.{f.name} has no attribute docstring"


@pytest.mark.parametrize("cls", list(SECTIONS), ids=lambda c: c.__name__)
def test_no_section_checks_its_values_by_hand(cls: type) -> None:
    assert "__post_init__" not in vars(cls), f"{cls.__name__} checks in __post_init__: declare rules, use check()"


def _bad_values(rule: Rule | None) -> list[Any]:
    """Values the rule must refuse, derived from the declaration alone."""
    if rule is None:  # reported by test_every_field_declares_its_rule_and_its_help
        return []
    if rule.kind == "int":
        return ["8", 1.5] + ([int(rule.low) - 1] if rule.low is not None else [])
    if rule.kind == "real":
        bad: list[Any] = ["1.0", float("nan")]
        if rule.low is not None:
            bad.append(rule.low if rule.low_open else rule.low - 1)
        if rule.high is not None:
            bad.append(rule.high if rule.high_open else rule.high + 1)
        return bad
    if rule.kind == "bool":
        return ["yes", 1]
    if rule.kind == "choice":
        return ["no-such-choice", 3]
    if rule.kind == "text":
        return [3] + ([] if rule.empty_ok else [""])
    return []


CASES = [
    pytest.param(cls, f.name, bad, id=f"{cls.__name__}.{f.name}={bad!r}")
    for cls in SECTIONS
    for f in dataclasses.fields(cls)
    for bad in _bad_values(field_rule(f))
]


@pytest.mark.parametrize(("cls", "name", "bad"), CASES)
def test_each_declared_rule_refuses_a_bad_value_in_one_line_naming_the_key(cls: type, name: str, bad: Any) -> None:
    with pytest.raises(cls.ERROR) as err:
        cls(**{**SECTIONS[cls], name: bad})
    key = f"{cls.SECTION}.{name}" if cls.SECTION else name
    lines = err.value.problems
    assert len(lines) == 1 and lines[0].startswith(f"{key} must be "), lines


def test_help_and_error_come_from_the_same_declaration() -> None:
    rule = field_rule(next(f for f in dataclasses.fields(RolloutConfig) if f.name == "top_p"))
    assert rule is not None and rule.requirement() == "a number in (0, 1]"
    assert field_help(RolloutConfig)["top_p"].endswith("Accepts a number in (0, 1].")
    with pytest.raises(ConfigError, match=r"^rollout\.top_p must be a number in \(0, 1\], got 0"):
        RolloutConfig(top_p=0)


def test_a_real_given_as_an_integer_is_stored_as_a_float() -> None:
    cfg = RolloutConfig(temperature=1)
    assert isinstance(cfg.temperature, float) and cfg.temperature == 1.0


def test_a_missing_required_key_is_one_line_with_its_fix() -> None:
    with pytest.raises(ConfigError, match=r"^dataset\.path is missing\. Give the prompt file"):
        DatasetConfig.from_dict({"shuffle": False})


def test_a_nested_section_is_built_from_its_mapping_and_checked_by_itself() -> None:
    cfg = HybridRolloutConfig.from_dict({"rollout": {"n": 4}, "async_training": {"mini_batch_size": 8}})
    assert isinstance(cfg.rollout, RolloutConfig) and cfg.rollout.n == 4
    with pytest.raises(ConfigError, match=r"^rollout\.n must be >= 1, got 0"):
        HybridRolloutConfig.from_dict({"rollout": {"n": 0}})


def test_the_docs_section_example_runs_and_refuses_what_it_says() -> None:
    text = (PACKAGE.parent / "docs" / "configuration.md").read_text()
    block = re.search(r"### Declaring a section.*?```python\n(.*?)```", text, re.S)
    assert block is not None
    module = types.ModuleType("docs_configuration_example")
    sys.modules[module.__name__] = module  # dataclasses resolve ClassVar through the defining module
    try:
        exec(compile(block.group(1), "docs/configuration.md", "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    budget = module.BudgetConfig
    with pytest.raises(ConfigError, match=r"^budget\.max_tokens must be >= 1, got 0\. E\.g\. 512\.$"):
        budget(max_tokens=0)
    with pytest.raises(ConfigError, match="Did you mean 'max_tokens'"):
        budget.from_dict({"max_token": 8})
    with pytest.raises(ConfigError, match=r"budget\.max_tokens must be >= min_tokens \(16\)"):
        budget(max_tokens=8)
