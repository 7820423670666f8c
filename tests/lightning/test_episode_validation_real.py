"""``lhr validate`` on ``examples/smollm2_agentic_cpu.yaml`` with the real SmolLM2-135M-Instruct: the command of
docs/agentic.md's "Validation" section, run as a user runs it (its own process, the example's own config with its
paths moved under a temp dir), plays whole greedy "guess the number" episodes and prints the episode reward."""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "smollm2_agentic_cpu.yaml"
DOC = REPO / "docs" / "agentic.md"
pytestmark = pytest.mark.slow


def documented_command() -> list[str]:
    """The ``lhr validate`` line of docs/agentic.md's "Validation" section, split into arguments."""
    section = DOC.read_text().split("## Validation\n", 1)[1].split("\n## ", 1)[0]
    (line,) = re.findall(r"^lhr validate .*$", section, re.MULTILINE)
    return shlex.split(line)


def test_lhr_validate_on_the_agentic_example_prints_the_episode_reward_of_whole_episodes(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    import yaml

    config = yaml.safe_load(EXAMPLE.read_text())
    t = config["trainer"]
    t["default_root_dir"] = str(tmp_path)
    t["logger"]["init_args"]["save_dir"] = str(tmp_path)
    t["callbacks"][1]["init_args"]["dirpath"] = str(tmp_path / "checkpoints")
    cb = t["callbacks"][0]["init_args"]
    cb["rollout"]["model_path"] = str(smollm2_dir)
    cb["agentic"]["environment"] = (
        str(REPO / cb["agentic"]["environment"].split(":")[0]) + ":" + cb["agentic"]["environment"].split(":")[1]
    )
    path = tmp_path / "smollm2_agentic_cpu.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))

    args = documented_command()
    assert args[:4] == ["lhr", "validate", "--config", "examples/smollm2_agentic_cpu.yaml"], args
    args[3] = str(path)
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_hybrid_rollout.lightning.cli", *args[1:]],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"},
    )
    (tmp_path / "output.txt").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"val/episode_reward\s*│\s*[0-9.]+", proc.stdout), proc.stdout[-3000:]  # the printed table
    with open(tmp_path / "validate" / "metrics.csv") as f:  # beside a fit's own logs, never over them
        (row,) = list(csv.DictReader(f))
    reward, turns = float(row["val/episode_reward"]), float(row["val/turns"])
    assert 0.0 <= reward <= 1.0 and 0.0 <= float(row["val/env_reward"]) <= 1.0
    # whole episodes: a wrong guess is answered by the environment and the model guesses again (max_turns: 3)
    assert 1.0 < turns <= cb["agentic"]["max_turns"], row
    assert float(row["val/tool_calls"]) >= 8, row  # 8 episodes (val_prompts=8), each stepped at least once
