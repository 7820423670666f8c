"""A fit from hub ids alone: ``lhr fit`` (its own process, ``HF_HUB_OFFLINE=1``) trains the tiny model named
``lhr-test/tiny-llama`` on the hub data set ``lhr-test/sums``, both read from a Hugging Face cache in the hub's own
layout; a missing id stops the run in one line before anything starts."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.hub_cache import add_to_hub_cache

REPO = Path(__file__).resolve().parents[2]
MODEL_ID, DATA_ID = "lhr-test/tiny-llama", "lhr-test/sums"


@pytest.fixture(scope="module")
def hf_home(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import datasets

    root = tmp_path_factory.mktemp("hf_home")
    src = root / "src" / "data"
    src.mkdir(parents=True)
    for split, n in (("train", 24), ("test", 4)):
        rows = [{"prompt": f"{i % 5}+{i % 3}=", "answer": str(i % 5 + i % 3)} for i in range(n)]
        datasets.Dataset.from_list(rows).to_parquet(str(src / f"{split}-00000-of-00001.parquet"))
    add_to_hub_cache(root / "hf" / "hub", MODEL_ID, tiny_model_dir)
    add_to_hub_cache(root / "hf" / "hub", DATA_ID, root / "src", repo_type="dataset")
    return root / "hf"


def _config(run_dir: Path, model_id: str) -> dict[str, Any]:
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "strategy": "hybrid_single_device",
            "max_steps": 2,
            "log_every_n_steps": 1,
            "default_root_dir": str(run_dir),
            "num_sanity_val_steps": 0,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(run_dir), "name": "", "version": ""},
            },
            "callbacks": [
                {
                    "class_path": "lightning_hybrid_rollout.HybridRolloutCallback",
                    "init_args": {
                        "dataset": {"path": DATA_ID, "val_path": DATA_ID},
                        "rewards": {"reward_funcs": [f"{REPO / 'examples' / 'smollm2' / 'rewards.py'}:sum_correct"]},
                        "rollout": {
                            "model_path": model_id,
                            "model_revision": "main",
                            "n": 4,
                            "response_length": 4,
                            "prompt_length": 16,
                            "concurrent_samples_per_replica": 16,
                            "kv_cache_memory_bytes": 67108864,
                        },
                        "async_training": {"mini_batch_size": 16, "trigger_parameter_sync_step": 1},
                    },
                }
            ],
        },
        "model": {"class_path": "lightning_hybrid_rollout.GRPOModule", "init_args": {"lr": 5.0e-4}},
        "data": {"class_path": "lightning_hybrid_rollout.RolloutDataModule"},
    }


def _lhr_fit(
    tmp_path: Path, hf_home: Path, model_id: str, timeout: int, data: str = DATA_ID
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    config = _config(tmp_path / "run", model_id)
    config["trainer"]["callbacks"][0]["init_args"]["dataset"] = {"path": data, "val_path": data}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run(
        [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli", "fit", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(tmp_path),
        env=env,
    )


@pytest.mark.slow
def test_a_fit_from_a_hub_model_id_and_a_hub_dataset_id_runs_offline_from_the_cache(
    hf_home: Path, tmp_path: Path
) -> None:
    proc = _lhr_fit(tmp_path, hf_home, MODEL_ID, timeout=600)
    (tmp_path / "output.txt").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "fit done: 2 steps" in proc.stderr
    assert "prompt source lhr-test/sums: 24 training rows, 4 held out" in proc.stderr
    assert f"models--{MODEL_ID.replace('/', '--')}" in proc.stderr  # the module loaded the cached snapshot
    with open(tmp_path / "run" / "metrics.csv") as f:
        steps = {row["step"] for row in csv.DictReader(f) if row.get("train/rewards/sum_correct_mean")}
    assert len(steps) == 2


def test_a_missing_hub_id_stops_the_fit_in_one_line_before_anything_starts(hf_home: Path, tmp_path: Path) -> None:
    proc = _lhr_fit(tmp_path, hf_home, "lhr-test/absent", timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if "'lhr-test/absent'" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "is no local path" in lines[0] and "hf download lhr-test/absent" in lines[0]
    assert "Traceback" not in proc.stderr and "Started a local Ray instance" not in proc.stderr
    assert not (tmp_path / "run" / "trace.json").exists()


def test_a_missing_data_file_stops_the_fit_in_one_line_not_a_traceback(hf_home: Path, tmp_path: Path) -> None:
    proc = _lhr_fit(tmp_path, hf_home, MODEL_ID, timeout=300, data="data/absent.jsonl")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "absent.jsonl" in ln]
    assert line.startswith("lhr: dataset.path: ") and "not found" in line
