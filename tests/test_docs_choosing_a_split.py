"""docs/choosing_a_split.md's worked example: the chosen YAML is a valid config and is the plan's best row.

The block after the ``tests/test_docs_choosing_a_split.py`` marker is the ``HybridRolloutCallback`` entry a user
pastes. It must load through the package's config classes (``HybridRolloutConfig.from_dict``, the ``lhr`` pre-check of
the callback's arguments), and say what the table above it says: row 1's policy, row 1's option set as
``sim.plan.OPTION_SETS`` defines it, row 1's split as replica counts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_hybrid_rollout.config import ConfigError, HybridRolloutConfig
from lightning_hybrid_rollout.lightning.config_check import check_callback_args
from lightning_hybrid_rollout.sim.plan import OPTION_SETS

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "choosing_a_split.md"
MARKER = "<!-- tests/test_docs_choosing_a_split.py"
SECTION = "### Worked example: a CPU-miniature pilot"


def _worked_example(doc: str) -> str:
    start = doc.index(SECTION)
    end = doc.index("\n### ", start + len(SECTION))
    return doc[start:end]


def _chosen_yaml(doc: str) -> dict[str, Any]:
    """The first ```yaml block after the marker, loaded."""
    after = doc.split(MARKER, 1)[1]
    block = after.split("```yaml\n", 1)[1].split("```", 1)[0]
    return yaml.safe_load(block)


def _callback_args(config: dict[str, Any]) -> dict[str, Any]:
    entries = [
        e for e in config["trainer"]["callbacks"] if e["class_path"] == "lightning_hybrid_rollout.HybridRolloutCallback"
    ]
    assert len(entries) == 1, "the chosen YAML must hold exactly one HybridRolloutCallback entry"
    return entries[0]["init_args"]


def _best_row(section: str) -> dict[str, str]:
    """Row 1 of the plan table in the worked example (the first Markdown table with a ``# | run`` header)."""
    lines = section.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("| # | run |"))
    header = [c.strip() for c in lines[header_at].strip("|").split("|")]
    row = [c.strip() for c in lines[header_at + 2].strip("|").split("|")]
    return dict(zip(header, row, strict=True))


def _load(config: dict[str, Any]) -> HybridRolloutConfig:
    args = _callback_args(config)
    problems = check_callback_args("trainer.callbacks[0].init_args", args)
    if problems:
        raise ConfigError(problems)
    return HybridRolloutConfig.from_dict({"rollout": args["rollout"], "async_training": args["async_training"]})


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC_PATH.read_text()


def test_the_chosen_yaml_loads_through_the_config_classes(doc: str) -> None:
    cfg = _load(_chosen_yaml(doc))
    assert cfg.async_training.dynamic_schedule_policy == "rate_matched"
    assert cfg.rollout.standalone_replicas == 1 and cfg.rollout.hybrid_replicas == 1


def test_the_chosen_yaml_is_the_best_row_of_the_plan_table(doc: str) -> None:
    section = _worked_example(doc)
    best = _best_row(section)
    assert best["#"] == "1"
    args = _callback_args(_chosen_yaml(doc))
    async_training = args["async_training"]
    # the policy and the option set, as the planner defines them
    assert async_training["dynamic_schedule_policy"] == best["policy"]
    hybrid = best["run"].startswith("dynamic_")
    assert hybrid and async_training["use_dynamic_resource_scheduling"] is True
    for key, value in OPTION_SETS[best["options"]].hybrid.items():
        assert async_training[key] == value, f"{key}: the YAML says {async_training[key]!r}, option set {value!r}"
    # the run name the planner gives that row
    suffix = OPTION_SETS[best["options"]].suffix
    train, rollout = (int(n) for n in best["split"].split("+"))
    assert best["run"] == f"dynamic_{train}_{rollout}_{best['policy']}{suffix}"
    # the split, as replica counts (the pilot's replicas are one device each) and the trainer's devices
    assert args["rollout"]["standalone_replicas"] == rollout
    assert args["rollout"]["hybrid_replicas"] == train
    assert _chosen_yaml(doc)["trainer"]["devices"] == train


def test_the_doc_quotes_the_row_it_pastes(doc: str) -> None:
    """The plan's header line and the YAML name the same best run."""
    section = _worked_example(doc)
    header = re.search(r"^plan for 2 devices, .*; best (\S+) ([\d.]+) s,", section, re.M)
    assert header is not None
    assert header.group(1) == _best_row(section)["run"]
    assert f"{header.group(2)} s" == _best_row(section)["time"]


@pytest.mark.parametrize(
    ("key", "bad", "seen"),
    [
        ("dynamic_schedule_policy", "rate_matchd", "rate_matchd"),  # a misspelt policy
        ("standalone_sync_mode", "freeze", "freeze"),  # not abort / keep
        ("staleness_treshold", 0.5, "staleness_treshold"),  # an unknown key
    ],
)
def test_a_broken_chosen_yaml_is_refused(doc: str, key: str, bad: Any, seen: str) -> None:
    """The check bites: the doc's YAML with one value broken is refused, naming it."""
    config = _chosen_yaml(doc)
    _callback_args(config)["async_training"][key] = bad
    with pytest.raises(ConfigError) as err:
        _load(config)
    assert seen in "\n".join(err.value.problems)
