"""``benchmarks/smollm2_learning.py``'s pure parts: the config each arm fits (one prepared model and data, its own run
directory), the ``--arms`` parsing, and the noise of its last line (its fits are the benchmark itself)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.benchmarks import load_benchmark

sl = load_benchmark("smollm2_learning")


@pytest.mark.parametrize("arm", ["full", "lora"])
def test_each_arm_fits_the_shared_model_and_data_in_its_own_run_dir_with_the_run_s_limits(arm: str, tmp_path: Path):
    path = sl.write_config(tmp_path, max_steps=40, minutes=7, arm=arm)
    assert path == tmp_path / arm / sl.ARMS[arm].name
    config = yaml.safe_load(path.read_text())
    t = config["trainer"]
    cb = t["callbacks"][0]["init_args"]
    assert cb["rollout"]["model_path"] == str(tmp_path / "model")
    assert cb["dataset"]["path"] == str(tmp_path / "data" / "train.jsonl")
    assert cb["dataset"]["val_path"] == str(tmp_path / "data" / "val.jsonl")
    assert Path(cb["rewards"]["reward_funcs"][0].split(":")[0]).is_file()
    assert t["default_root_dir"] == t["logger"]["init_args"]["save_dir"] == str(tmp_path / arm)
    assert t["callbacks"][1]["init_args"]["dirpath"] == str(tmp_path / arm / "checkpoints")
    assert (t["max_steps"], t["max_time"]) == (40, "00:00:07:00")
    assert t["callbacks"][1]["init_args"]["every_n_train_steps"] == 10  # the example's cadence
    # the arms differ in the fine-tune only: the LoRA arm trains an adapter and syncs it alone
    peft = config["model"]["init_args"].get("peft")
    assert (peft is not None) == (arm == "lora")
    if arm == "lora":
        assert peft["r"] == 16 and cb["rollout"]["lora_sync"] == "adapter"
    full = yaml.safe_load(sl.write_config(tmp_path, max_steps=40, minutes=7, arm="full").read_text())
    assert cb["async_training"] == full["trainer"]["callbacks"][0]["init_args"]["async_training"]
    assert {k: v for k, v in cb["rollout"].items() if not k.startswith("lora_")} == full["trainer"]["callbacks"][0][
        "init_args"
    ]["rollout"]


def test_a_short_run_checkpoints_at_its_last_step(tmp_path: Path):
    config = yaml.safe_load(sl.write_config(tmp_path, max_steps=2, minutes=1, arm="lora").read_text())
    assert config["trainer"]["callbacks"][1]["init_args"]["every_n_train_steps"] == 2


def test_arms_are_distinct_known_names_in_the_order_given():
    assert sl.parse_arms("full") == ["full"]
    assert sl.parse_arms(" lora , full ") == ["lora", "full"]
    for bad in ("", "full,full", "full,qlora"):
        with pytest.raises(ValueError, match=r"--arms .*full, lora"):
            sl.parse_arms(bad)


def test_the_noise_is_the_standard_error_of_the_difference_of_the_two_after_means():
    # N = 64 prompts x 4 samples; the shared "before" cancels in the difference of the gains
    assert sl.gain_difference_noise(0.7, 0.7, 256) == pytest.approx(math.sqrt(2 * 0.7 * 0.3 / 256))
    assert sl.gain_difference_noise(0.5, 0.9, 100) == pytest.approx(math.sqrt((0.25 + 0.09) / 100))
    assert sl.gain_difference_noise(0.0, 1.0, 256) == 0.0  # no spread in either arm
    # four times the samples halve it
    assert sl.gain_difference_noise(0.6, 0.4, 1024) == pytest.approx(sl.gain_difference_noise(0.6, 0.4, 256) / 2)
    with pytest.raises(ValueError, match="samples"):
        sl.gain_difference_noise(0.5, 0.5, 0)


def test_the_sample_count_is_val_prompts_times_val_n(tmp_path: Path):
    path = sl.write_config(tmp_path, max_steps=40, minutes=7, arm="lora")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "val.jsonl").write_text('{"a": 1}\n{"a": 2}\n\n{"a": 3}\n')
    assert sl.validation_samples(path) == 3 * 4
