"""Scenario validation, YAML round trip, presets and the length model."""

from __future__ import annotations

import pytest
import yaml

from lightning_hybrid_rollout.config import AsyncTrainingConfig, derived_counts, field_docs
from lightning_hybrid_rollout.config.fields import field_rule
from lightning_hybrid_rollout.sim import (
    AgenticModel,
    LengthModel,
    LoraModel,
    ReplicaModel,
    RunSpec,
    Scenario,
    ScenarioError,
    SwitchCosts,
    TrainerModel,
    get_preset,
    preset_names,
)
from lightning_hybrid_rollout.sim.lending import LendingModel


def test_presets_load_and_are_named_for_their_regime():
    assert {"verl_32_devices", "rollout_bound", "drifting", "standalone_sufficient"} <= set(preset_names())
    for name in preset_names():
        sc = get_preset(name)
        assert sc.name == name and sc.runs and sc.description
    with pytest.raises(KeyError, match="unknown preset"):
        get_preset("nope")


def test_seed_preset_uses_the_seeds_devices_and_verls_recipe_batch():
    sc = get_preset("verl_32_devices")
    splits = {r.name: (r.train_devices, r.rollout_devices, r.hybrid) for r in sc.runs}
    assert splits["static_16_16"] == (16, 16, False)
    assert splits["static_8_24"] == (8, 24, False)
    assert splits["dynamic_default"] == (16, 16, True)
    assert all(r.devices == 32 for r in sc.runs)
    default = sc.run("dynamic_default")
    assert default.policy == "default" and default.sequencing == "sequential"
    assert default.policy_kwargs == {"deactivate_ratio": 0.3}
    assert (sc.required_samples, sc.trigger_parameter_sync_step, sc.staleness_threshold) == (128, 4, 0.5)
    assert sc.max_required_samples == 768 and sc.buffer_samples == 256
    assert sc.derived_counts == derived_counts(
        mini_batch_size=128, trigger_parameter_sync_step=4, staleness_threshold=0.5
    )


def test_yaml_round_trip(tmp_path):
    sc = get_preset("drifting")
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(sc.to_dict()))
    assert Scenario.from_yaml(path).to_dict() == sc.to_dict()


_RUN = {"name": "a", "train_devices": 4, "rollout_devices": 4}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 0}, "steps must be >= 1, got 0"),
        ({"async_training": {"staleness_threshold": -1}}, "async_training.staleness_threshold must be a number >= 0"),
        ({"async_training": {"mini_batch_size": 0}}, "async_training.mini_batch_size must be >= 1"),
        ({"async_training": {"stalenes_threshold": 0.1}}, "Did you mean 'staleness_threshold'"),
        ({"lengths": {"mean_tokens": 0}}, "lengths.mean_tokens must be a number > 0, got 0"),
        (
            {"lengths": {"min_tokens": 10, "max_tokens": 5}},
            r"lengths.max_tokens must be >= lengths.min_tokens \(10\), got 5",
        ),
        (
            {"lengths": {"mean_schedule": [[2, 1.0], [1, 2.0]]}},
            r"lengths.mean_schedule\[1\]\[0\] must be > 2 .*, got 1.0. The points' versions must increase",
        ),
        ({"bogus": 1}, "Scenario has no key 'bogus'"),
        ({"runs": [{"name": "a", "train_devices": 1, "rollout_devices": 0}]}, "rollout_devices must be > 0"),
        ({"runs": [{"name": "a", "train_devices": 1, "rollout_devices": 3}]}, "multiple of replica.devices"),
        (
            {"runs": [{**_RUN, "async_training": {"overlap_sync": "x"}}]},
            r"runs\[a\]: async_training.overlap_sync must be a bool",
        ),
        (
            {"runs": [{**_RUN, "hybrid": True, "async_training": {"dynamic_schedule_policy": "defualt"}}]},
            r"runs\[a\]: async_training.dynamic_schedule_policy must be one of .* Did you mean 'default'",
        ),
        (
            {"runs": [{**_RUN, "async_training": {"dynamic_schedule_policy_kwargs": {"deactivate_ratio": 0.5}}}]},
            "use async_training.dynamic_schedule_deactivate_ratio instead",
        ),
        ({"runs": [{**_RUN, "async_training": {"overlap": True}}]}, r"runs\[a\].async_training has no key 'overlap'"),
        (
            {"runs": [{**_RUN, "async_training": {"staleness_threshold": 0.2}}]},
            "not a run's own key: .* set it in the scenario's async_training section",
        ),
        ({"runs": [{**_RUN, "async_training": {"only_hybrid": True}}]}, "follows each run's split"),
        ({"async_training": {"only_hybrid": True}}, "async_training.only_hybrid must be false in a scenario, got true"),
        ({"async_training": {"partial_rollout": False}}, "models partial rollout only"),
        (
            {"runs": [{**_RUN, "hybrid": True, "async_training": {"use_dynamic_resource_scheduling": False}}]},
            "hybrid: true needs async_training.use_dynamic_resource_scheduling true",
        ),
        ({"async_training": {"mini_batch_size": 5}, "group_size": 2}, "multiple of group_size"),
    ],
)
def test_invalid_values_name_the_field(change, message):
    data = {"name": "x", "replica": {"devices": 2}, "runs": [{"name": "r", "train_devices": 4, "rollout_devices": 4}]}
    data.update(change)
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(data)


def test_runs_take_the_scenarios_async_training_and_change_only_their_own_keys():
    sc = Scenario.from_dict(
        {
            "name": "x",
            "async_training": {"mini_batch_size": 16, "dynamic_schedule_policy": "rate_matched", "overlap_sync": True},
            "runs": [
                {"name": "inherits", "train_devices": 4, "rollout_devices": 4, "hybrid": True},
                {
                    "name": "own",
                    "train_devices": 4,
                    "rollout_devices": 4,
                    "hybrid": True,
                    "async_training": {
                        "dynamic_schedule_policy_kwargs": {"gate_margin_fraction": 0.2},  # checked against rate_matched
                        "overlap_sync": False,
                    },
                },
                {"name": "static", "train_devices": 4, "rollout_devices": 4},
            ],
        }
    )
    inherits, own, static = (sc.run(n) for n in ("inherits", "own", "static"))
    assert (inherits.policy, inherits.sequencing) == ("rate_matched", "overlap_sync")
    assert (own.policy, own.sequencing) == ("rate_matched", "sequential")
    assert own.policy_kwargs == {"deactivate_ratio": 0.3, "gate_margin_fraction": 0.2}
    assert static.policy is None  # no hybrid replicas: nothing to schedule
    assert own.config == AsyncTrainingConfig(
        mini_batch_size=16,
        dynamic_schedule_policy="rate_matched",
        dynamic_schedule_policy_kwargs={"gate_margin_fraction": 0.2},
    )
    # one declaration: the scenario's counts are the config's
    assert sc.required_samples == 16 and sc.max_required_samples == sc.async_training.max_required_samples


def test_a_run_moved_to_another_scenario_takes_that_scenarios_config():
    a = Scenario.from_dict({"name": "a", "async_training": {"overlap_sync": True}, "runs": [{**_RUN, "hybrid": True}]})
    b = Scenario.from_dict({"name": "b", "runs": []}).with_runs(a.runs)
    assert b.run("a").sequencing == "sequential" and a.run("a").sequencing == "overlap_sync"
    loose = RunSpec("loose", 4, 4, hybrid=True, async_training={"early_first_sync": True})
    assert loose.config == AsyncTrainingConfig(early_first_sync=True)  # outside a scenario: the config's defaults
    assert a.with_runs([loose]).run("loose").sequencing == "overlap_sync"


def test_length_model_drift_schedule_and_clipping():
    lm = LengthModel(mean_tokens=1000, sigma=0.0, drift_per_step=0.1, mean_schedule=[[0, 1.0], [10, 0.5]])
    assert lm.length(0.0, 0) == 1000
    assert lm.mean_at(10) == pytest.approx(1000 * 2.0 * 0.5)
    assert lm.schedule_at(5) == pytest.approx(0.75) and lm.schedule_at(99) == 0.5
    clipped = LengthModel(mean_tokens=1000, sigma=1.0, max_tokens=1200)
    assert clipped.length(5.0, 0) == 1200


def test_replica_throughput_is_capped_by_concurrency_and_kv_cache():
    m = ReplicaModel(devices=1, tokens_per_s=10.0, batch_slowdown=0.0, kv_cache_tokens=1000)
    assert m.throughput(4, 16) == 40.0
    assert m.throughput(40, 16) == 160.0  # beyond the limit the extra samples wait
    assert m.run_limit(16, 250.0) == 4  # only 4 contexts of 250 tokens fit
    assert m.run_limit(16, 1e9) == 1


#: Every section of a scenario, and the arguments it needs besides the one under test.
_SECTIONS = {
    LengthModel: {},
    ReplicaModel: {},
    TrainerModel: {},
    SwitchCosts: {},
    AgenticModel: {},
    LoraModel: {},
    LendingModel: {},
    RunSpec: {"name": "a", "train_devices": 4, "rollout_devices": 4},
    Scenario: {"name": "x"},
}


@pytest.mark.parametrize(
    ("cls", "field", "bad"),
    [
        (LengthModel, "mean_tokens", 0),
        (LengthModel, "min_tokens", 0),
        (LengthModel, "drift_per_step", -1.5),
        (ReplicaModel, "devices", 0),
        (ReplicaModel, "kv_cache_tokens", -1),
        (TrainerModel, "device_s_per_token", 0.0),
        (SwitchCosts, "wake_s", -0.5),
        (AgenticModel, "tool_output_tokens", -1),
        (LoraModel, "kv_fraction", 1.5),
        (LoraModel, "enabled", "yes"),
        (LendingModel, "sync_per_replica_fraction", -0.1),
        (LendingModel, "value_bytes", 0),
        (RunSpec, "train_devices", 0),
        (Scenario, "group_size", 0),
        (Scenario, "seed", -1),
    ],
)
def test_a_value_breaking_a_fields_declared_rule_is_one_line_naming_section_field(cls, field, bad):
    with pytest.raises(ScenarioError) as err:
        cls(**{**_SECTIONS[cls], field: bad})
    key = f"{cls.SECTION}.{field}" if cls.SECTION else field  # the scenario's own keys are top-level
    message = str(err.value)
    assert message.startswith(f"{key} must be "), message
    assert f"got {bad!r}." in message and err.value.problems == [message]


@pytest.mark.parametrize("cls", list(_SECTIONS), ids=lambda c: c.__name__)
def test_every_field_of_every_section_is_declared_and_documented(cls):
    fields = cls.field_names()
    docs = field_docs(cls)
    assert [f for f in fields if field_rule(cls.__dataclass_fields__[f]) is None] == []
    assert [f for f in fields if not docs.get(f)] == []


def test_sections_coerce_integers_to_floats_accept_mappings_or_null_and_name_the_run():
    assert LendingModel(sync_per_replica_fraction=1).sync_per_replica_fraction == 1.0
    lm = LengthModel(mean_tokens=1000, mean_schedule=[(0, 1), (5, 2)])
    assert isinstance(lm.mean_tokens, float) and lm.mean_schedule == [[0.0, 1.0], [5.0, 2.0]]
    sc = Scenario(name="x", lengths={"mean_tokens": 100}, switch=None, runs=[dict(_RUN)])
    assert sc.lengths == LengthModel(mean_tokens=100.0) and sc.switch == SwitchCosts() and sc.runs[0].name == "a"
    with pytest.raises(ScenarioError, match=r"^runs\[a\] has no key 'trian_devices'. Did you mean 'train_devices'"):
        Scenario.from_dict({"name": "x", "runs": [{"name": "a", "trian_devices": 4, "rollout_devices": 4}]})
    with pytest.raises(
        ScenarioError, match=r"^runs\[a\]\.train_devices must be >= 1, got 0\."
    ):  # in a scenario: which run
        Scenario.from_dict({"name": "x", "runs": [{"name": "a", "train_devices": 0, "rollout_devices": 4}]})
    with pytest.raises(ScenarioError, match=r"^runs\[1\]\.name is missing\."):
        Scenario.from_dict({"name": "x", "runs": [dict(_RUN), {"train_devices": 4, "rollout_devices": 4}]})
