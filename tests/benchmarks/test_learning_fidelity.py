"""``benchmarks/learning_fidelity.py``'s pure parts: the per-run figures, the pooled-sd difference of its last line, and
the config each arm runs (its real fits are the benchmark itself)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.benchmarks import load_benchmark

lf = load_benchmark("learning_fidelity")


def test_final_is_the_last_tenth_and_auc_the_mean_of_the_whole_curve():
    curve = [0.0] * 18 + [0.5, 1.0]
    assert lf.curve_figures(curve) == {"final": 0.75, "auc": 1.5 / 20}
    assert lf.curve_figures([0.3]) == {"final": 0.3, "auc": 0.3}
    with pytest.raises(ValueError, match="train/reward_mean"):
        lf.curve_figures([])


def test_the_difference_is_in_pooled_standard_deviations_over_both_figures_and_every_pair():
    runs = {
        "static_fully_async": [{"final": 0.5, "auc": 0.3}, {"final": 0.7, "auc": 0.3}],  # final sd 0.1414
        "default": [{"final": 0.6, "auc": 0.3}, {"final": 0.8, "auc": 0.3}],
        "rate_matched": [{"final": 0.4, "auc": 0.2}, {"final": 0.6, "auc": 0.4}],  # auc sd 0.1414
    }
    worst, where = lf.max_pooled_difference(runs)
    # final: default vs rate_matched differ by 0.2 with pooled sd 0.1414 -> 1.414; auc: no mean differs
    assert worst == pytest.approx(0.2 / math.sqrt(0.02))
    assert where == "final default vs rate_matched (pooled sd)"


def test_one_repeat_gives_the_raw_difference_and_zero_spread_with_a_difference_is_infinite():
    assert lf.max_pooled_difference({"a": [{"final": 0.5, "auc": 0.1}], "b": [{"final": 0.2, "auc": 0.1}]}) == (
        pytest.approx(0.3),
        "final a vs b (raw)",
    )
    same = [{"final": 0.5, "auc": 0.1}] * 2
    assert lf.max_pooled_difference({"a": same, "b": [{"final": 0.6, "auc": 0.1}] * 2})[0] == math.inf


def test_each_arm_runs_the_quickstart_with_its_policy_seed_and_own_run_dir(tmp_path: Path):
    base = yaml.safe_load(lf.QUICKSTART.read_text())
    path = lf.write_config(base, tmp_path / "default" / "seed2", "default", 2, 40)
    config = yaml.safe_load(path.read_text())
    cb = config["trainer"]["callbacks"][0]["init_args"]
    assert config["seed_everything"] == 2 and config["trainer"]["max_steps"] == 40
    assert cb["async_training"]["dynamic_schedule_policy"] == "default"
    assert cb["rollout"]["model_path"] == str(tmp_path / "default" / "seed2" / "model")
    assert config["trainer"]["logger"]["init_args"]["save_dir"] == str(tmp_path / "default" / "seed2")
    assert base["seed_everything"] == 0  # the base config is not modified


def test_settings_reach_every_arm_and_partial_lending_only_rate_matched(tmp_path: Path):
    base = yaml.safe_load(lf.QUICKSTART.read_text())
    settings = lf.parse_set(["rollout.dtype=bfloat16", "rollout.weight_encoding=delta", "async_training.x.y=0.5"])
    assert settings == {"rollout.dtype": "bfloat16", "rollout.weight_encoding": "delta", "async_training.x.y": 0.5}
    for policy, lends_k in (("static_fully_async", False), ("rate_matched", True)):
        path = lf.write_config(base, tmp_path / policy, policy, 0, 4, settings, partial_lending=True)
        cb = yaml.safe_load(path.read_text())["trainer"]["callbacks"][0]["init_args"]
        assert cb["rollout"]["dtype"] == "bfloat16" and cb["rollout"]["weight_encoding"] == "delta"
        assert cb["async_training"]["x"] == {"y": 0.5}
        kwargs = cb["async_training"].get("dynamic_schedule_policy_kwargs", {})
        assert kwargs.get("partial_lending", False) is lends_k
    assert "dtype" not in base["trainer"]["callbacks"][0]["init_args"]["rollout"]
    with pytest.raises(ValueError, match=r"SECTION\.KEY=VALUE"):
        lf.parse_set(["dtype=bfloat16"])


def test_the_reward_curve_is_read_in_step_order_skipping_rows_without_a_reward(tmp_path: Path):
    (tmp_path / "metrics.csv").write_text("step,train/reward_mean,x\n2,0.3,\n0,0.1,\n1,,5\n1,0.2,\n")
    assert lf.reward_curve(tmp_path / "metrics.csv") == [0.1, 0.2, 0.3]
