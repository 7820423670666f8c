"""``benchmarks/shared_prompt.py``: its batch shares each group's prompt, and a short run prints the ratio last."""

from __future__ import annotations

import re
import subprocess
import sys

import torch

from lightning_hybrid_rollout.training.shared_prompt import prompt_buckets
from tests.benchmarks import ROOT, load_benchmark

bench = load_benchmark("shared_prompt", "bench_shared_prompt")


def test_benchmark_batch_repeats_each_prompt_for_its_group_and_pads_responses_right() -> None:
    batch = bench.make_batch(groups=3, n=4, prompt_tokens=5, response_tokens=12, vocab=64, seed=0)
    assert batch.input_ids.shape == (12, 17)
    buckets = prompt_buckets(batch)
    assert [b.prompt_len for b in buckets] == [5] and len(buckets[0].prompts) == 3
    assert buckets[0].prompt_of_row.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    lengths = batch.response_mask.sum(dim=1)
    assert torch.all((lengths >= 10) & (lengths <= 12))
    assert torch.equal(batch.attention_mask[:, 5:].float(), batch.response_mask[:, 5:])  # right padding only


def test_benchmark_prints_each_mode_and_the_ratio_last() -> None:
    script = str(ROOT / "benchmarks" / "shared_prompt.py")
    small = ["--groups", "2", "--n", "4", "--steps", "2", "--warmup", "1", "--micro-batch-size", "4", "--core", "-1"]
    run = subprocess.run([sys.executable, script, *small], capture_output=True, text=True, timeout=300, check=True)
    out = run.stdout.strip().splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("step of"))  # libraries may log above it
    assert [line.split()[0] for line in out[head + 1 : head + 3]] == ["plain", "shared"]
    assert re.fullmatch(r"shared / plain step time: \d+\.\d\d", out[-1]), out[-1]
