"""Every hybrid strategy on one CUDA device: offload frees the device, and the step after the onload is the step
without the cycle (same seed, a twin fit).

Each case runs ``_offload_worker.py`` in a fresh process (a clean device to measure, its own process group of one
rank: NCCL). What it checks, per strategy:

- while offloaded, ``torch.cuda.memory_allocated`` is near zero: at most ``max(16 MiB, 5 %)`` of what the training
  state held before, over the process's baseline; DDP may also keep its reducer's gradient buckets (one copy of the
  trainable parameters: no public API frees them, docs/strategies.md);
- after the onload the state is back on the device (at least 90 % of the memory before);
- the losses of every step, the one right after the onload included, equal the twin fit's bit for bit, and so do the
  final full weights (which differ from the initial ones: the comparison is not vacuous).

The memory figures go to the per-test record that ``scripts/gpu_checks.sh`` prints (``gpu_record``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MIB = 2**20
TOLERANCE_BYTES = 16 * MIB
TOLERANCE_SHARE = 0.05
CYCLE_AT = 1  # the cycle runs after step 1 (0-based) of 4; step 2 is the one after the onload

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

STRATEGIES = [
    "hybrid_single_device",
    "hybrid_ddp",
    "hybrid_fsdp2",
    "hybrid_deepspeed_stage_2",
    "hybrid_deepspeed_stage_3",
]


def run_offload_worker(
    strategy: str, tmp_path: Path, accelerator: str = "cuda", timeout: int = 300, **extra: Any
) -> dict[str, Any]:
    """Run ``_offload_worker.py`` for ``strategy`` (on CUDA unless told); return its JSON verdict."""
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env.pop("LOCAL_RANK", None)
    env.update(
        CUBLAS_WORKSPACE_CONFIG=":4096:8",  # deterministic cuBLAS, for the bit-exact comparison
        PYTHONWARNINGS="ignore",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    )
    cmd = [sys.executable, str(HERE / "_offload_worker.py"), "--strategy", strategy, "--accelerator", accelerator]
    cmd += ["--cycle-at", str(CYCLE_AT), "--out", str(out)]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and out.exists(), f"worker failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def _mib(n: float) -> float:
    return round(n / MIB, 1)


def record_figures(strategy: str, r: dict[str, Any], record: dict[str, Any]) -> tuple[float, float, float, str]:
    """Put the worker's figures into ``record`` (MiB, seconds); return (before, residual, allowed bytes, note)."""
    base = r["baseline"]
    before = r["alloc_before"] - base
    residual = r["alloc_offloaded"] - base
    tolerance = max(TOLERANCE_BYTES, TOLERANCE_SHARE * before)
    allowance = 1.05 * r["trainable_param_bytes"] if strategy == "hybrid_ddp" else 0.0
    note = f"allowed {_mib(tolerance)} MiB"
    if allowance:
        note += f" + {_mib(allowance)} MiB DDP reducer buckets"
    record.update(
        strategy=strategy,
        device=r["device"],
        state_mib=_mib(r["state_bytes_on_device"]),
        peak_before_mib=_mib(r["peak_before"]),
        alloc_before_mib=_mib(r["alloc_before"]),
        during_mib=_mib(r["alloc_offloaded"]),
        alloc_offloaded_mib=_mib(r["alloc_offloaded"]),
        reserved_offloaded_mib=_mib(r["reserved_offloaded"]),
        alloc_onloaded_mib=_mib(r["alloc_onloaded"]),
        peak_after_mib=_mib(r.get("peak_after", 0)),
        offload_s=round(r["offload_s"], 4),
        onload_s=round(r["onload_s"], 4),
        losses_equal=r["losses_a"] == r["losses_b"],
        note=note,
    )
    return before, residual, tolerance + allowance, note


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_offload_frees_cuda_memory_and_the_next_step_matches_the_twin_fit(
    strategy: str, tmp_path: Path, gpu_record: dict[str, Any]
) -> None:
    if "deepspeed" in strategy and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed on this machine")
    r = run_offload_worker(strategy, tmp_path)
    before, residual, allowed, note = record_figures(strategy, r, gpu_record)
    assert r["is_offloaded"] and not r["is_offloaded_after_onload"], r
    assert r["state_bytes_on_device"] > 100 * MIB, "the model is too small for the memory check to mean anything"
    assert before >= 0.9 * r["state_bytes_on_device"], r  # the state was measured where it lives
    assert residual <= allowed, (
        f"{strategy}: {_mib(residual)} MiB still allocated while offloaded (of {_mib(before)} MiB; allowed "
        f"{note}); largest training-state tensors left on the device: {r['left_on_device']}"
    )
    assert r["alloc_onloaded"] - r["baseline"] >= 0.9 * before, r
    step = CYCLE_AT + 1
    assert r["losses_a"][step] == r["losses_b"][step], (
        f"{strategy}: the step after the onload lost {r['losses_a'][step]!r}, the twin fit {r['losses_b'][step]!r}"
    )
    assert r["losses_a"] == r["losses_b"] and len(r["losses_a"]) == 4, (r["losses_a"], r["losses_b"])
    assert r["final_names_equal"] and not r["final_mismatched"], r["final_mismatched"]
    assert r["final_changed"], "the fit did not change the weights: the comparison would be vacuous"
