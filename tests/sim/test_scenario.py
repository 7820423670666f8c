"""Scenario validation, YAML round trip, presets and the length model."""

from __future__ import annotations

import pytest
import yaml

from lightning_hybrid_rollout.sim import LengthModel, ReplicaModel, Scenario, ScenarioError, get_preset, preset_names


def test_presets_load_and_are_named_for_their_regime():
    assert {"seed", "rollout_bound", "drifting", "standalone_sufficient"} <= set(preset_names())
    for name in preset_names():
        sc = get_preset(name)
        assert sc.name == name and sc.runs and sc.description
    with pytest.raises(KeyError, match="unknown preset"):
        get_preset("nope")


def test_seed_preset_uses_the_seeds_devices_and_verls_recipe_batch():
    sc = get_preset("seed")
    splits = {r.name: (r.train_devices, r.rollout_devices, r.hybrid) for r in sc.runs}
    assert splits["static_16_16"] == (16, 16, False)
    assert splits["static_8_24"] == (8, 24, False)
    assert splits["dynamic_default"] == (16, 16, True)
    assert all(r.devices == 32 for r in sc.runs)
    default = sc.run("dynamic_default")
    assert default.policy == "default" and default.sequencing == "seed"
    assert default.policy_kwargs == {"deactivate_ratio": 0.3}
    assert (sc.required_samples, sc.trigger_parameter_sync_step, sc.staleness_threshold) == (128, 4, 0.5)
    assert sc.max_required_samples == 768 and sc.buffer_samples == 256


def test_yaml_round_trip(tmp_path):
    sc = get_preset("drifting")
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(sc.to_dict()))
    assert Scenario.from_yaml(path).to_dict() == sc.to_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 0}, "steps must be an integer >= 1"),
        ({"staleness_threshold": -1}, "staleness_threshold must be a finite number >= 0"),
        ({"lengths": {"mean_tokens": 0}}, "lengths.mean_tokens must be a finite number > 0"),
        ({"lengths": {"min_tokens": 10, "max_tokens": 5}}, "lengths.max_tokens"),
        ({"lengths": {"mean_schedule": [[2, 1.0], [1, 2.0]]}}, "versions must increase"),
        ({"bogus": 1}, "unknown key"),
        ({"runs": [{"name": "a", "train_devices": 1, "rollout_devices": 0}]}, "rollout_devices must be > 0"),
        ({"runs": [{"name": "a", "train_devices": 1, "rollout_devices": 1, "hybrid": True}]}, "needs a policy"),
        ({"runs": [{"name": "a", "train_devices": 1, "rollout_devices": 3}]}, "multiple of replica.devices"),
        ({"runs": [{"name": "a", "train_devices": 4, "rollout_devices": 4, "sequencing": "x"}]}, "sequencing"),
        ({"required_samples": 5, "group_size": 2}, "multiple of group_size"),
    ],
)
def test_invalid_values_name_the_field(change, message):
    data = {"name": "x", "replica": {"devices": 2}, "runs": [{"name": "r", "train_devices": 4, "rollout_devices": 4}]}
    data.update(change)
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(data)


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
