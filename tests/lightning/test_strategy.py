"""Tests of the hybrid strategies: registry names, bit-exact offload / onload, full-weight streaming, the docs example.

Multi-process cases (DDP, FSDP2, DeepSpeed on 2 CPU ranks) run ``_strategy_worker.py`` as a subprocess: Lightning
relaunches that script once per extra rank, which it cannot do for a pytest process. Rank 0 writes a JSON verdict
that the tests assert on. CUDA variants of the same checks are marked ``gpu``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from _strategy_common import TinyLMModule, gather_full, token_loader  # noqa: E402

import lightning_hybrid_rollout.lightning  # noqa: E402, F401  (registers the hybrid strategies)
from lightning_hybrid_rollout.lightning.strategies import (  # noqa: E402
    HybridDDPStrategy,
    HybridDeepSpeedStrategy,
    HybridFSDP2Strategy,
    HybridSingleDeviceStrategy,
    HybridStrategyMixin,
    clean_param_name,
    find_decoder_layers,
    register_hybrid_strategies,
)

EXTENSIONS_DIR = Path.home() / ".cache" / "lhr_torch_extensions"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _trainer(**kwargs: Any) -> pl.Trainer:
    defaults: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return pl.Trainer(**(defaults | kwargs))


def run_worker(
    strategies: str, devices: int, tmp_path: Path, accelerator: str = "cpu", timeout: int = 240, **extra: Any
) -> dict[str, Any]:
    """Run ``_strategy_worker.py`` for comma-separated ``strategies``; return rank 0's JSON verdict."""
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=str(EXTENSIONS_DIR), PYTHONWARNINGS="ignore")
    env.pop("LOCAL_RANK", None)
    if accelerator == "cuda":
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS, for the bit-exact comparison
    cmd = [sys.executable, str(HERE / "_strategy_worker.py"), "--strategy", strategies, "--devices", str(devices)]
    cmd += ["--accelerator", accelerator, "--out", str(out)]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and out.exists(), f"worker failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def assert_hybrid_checks(name: str, r: dict[str, Any], may_stay: tuple[str, ...] = ()) -> None:
    """The verdict of one worker run: gather == un-sharded model, bit-exact round trip and continuation.

    ``may_stay``: substrings of state-tensor names that the strategy documents as not copied by offload.
    """
    assert r["gather_initial"]["equal"], (name, r["gather_initial"])
    assert r["gather_all_cpu"] and r["gather_buckets"] > 1
    assert r["is_offloaded_after_offload"] and not r["is_offloaded_after_onload"]
    assert r["second_offload_s"] == 0.0  # idempotent
    assert r["training_step_guard"], "training_step must refuse to run while offloaded"
    left = [k for k in r["on_device_while_offloaded"] if not any(part in k for part in may_stay)]
    assert not left, (name, "still on the device while offloaded", left)
    # every tensor of the training state got a new storage (a real copy), except what the strategy documents
    stayed = [k for k in r["not_moved"] if not any(part in k for part in may_stay)]
    assert not stayed, (name, r["not_moved"])
    assert r["storage_moved"] >= r["storage_checked"] - len(r["not_moved"])
    assert r["roundtrip_mismatches"] == [], (name, r["roundtrip_mismatches"])
    assert r["offload_s"] > 0 and r["onload_s"] > 0
    assert r["last_offload_s"] == r["offload_s"] and r["last_onload_s"] == r["onload_s"]
    if "gather_while_offloaded" in r:
        assert r["gather_while_offloaded"]["equal"], r["gather_while_offloaded"]
    # training after the offload cycle is bit-identical to training without it
    assert r["losses_a"] == r["losses_b"] and len(r["losses_a"]) == 3
    assert r["final_equal"]["equal"], r["final_equal"]
    assert r["final_changed"], "the fit did not change the weights: the continuation check would be vacuous"


# ---------------------------------------------------------------------------------------------- registry
@pytest.mark.parametrize(
    ("name", "cls", "devices"),
    [
        ("hybrid_single_device", HybridSingleDeviceStrategy, 1),
        ("hybrid_ddp", HybridDDPStrategy, 2),
        ("hybrid_fsdp2", HybridFSDP2Strategy, 2),
        ("hybrid_deepspeed", HybridDeepSpeedStrategy, 1),
        ("hybrid_deepspeed_stage_1", HybridDeepSpeedStrategy, 1),
        ("hybrid_deepspeed_stage_2", HybridDeepSpeedStrategy, 2),
        ("hybrid_deepspeed_stage_3", HybridDeepSpeedStrategy, 2),
    ],
)
def test_registry_short_names_resolve(name: str, cls: type, devices: int) -> None:
    trainer = _trainer(strategy=name, devices=devices)
    assert type(trainer.strategy) is cls
    assert isinstance(trainer.strategy, HybridStrategyMixin)
    if "stage" in name:
        assert trainer.strategy.config["zero_optimization"]["stage"] == int(name[-1])


def test_registration_is_idempotent_and_lightning_names_untouched() -> None:
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

    assert register_hybrid_strategies() == []  # already registered on import
    assert StrategyRegistry["ddp"]["strategy"] is DDPStrategy  # our subclasses do not re-register Lightning's names


# ---------------------------------------------------------------------------------------------- single device
def test_single_device_offload_onload_bit_exact_and_continuation(tmp_path: Path) -> None:
    """In process: the worker's run A (offload cycle after step 1) and run B (none) on one CPU device."""
    import _strategy_worker as worker

    args = worker.argparse.Namespace(accelerator="cpu", devices=1, steps=3, hidden=64, layers=2, vocab=64)
    result_a, losses_a, final_a = worker.run(args, "hybrid_single_device", cycle_at=1)
    _, losses_b, final_b = worker.run(args, "hybrid_single_device", cycle_at=None)
    initial = TinyLMModule(seed=0).policy_model.state_dict()
    verdict = {
        **result_a,
        "losses_a": losses_a,
        "losses_b": losses_b,
        "final_equal": worker.compare_state_dicts(final_a, final_b),
        "final_changed": not worker.compare_state_dicts(final_a, initial)["equal"],
    }
    assert verdict["n_state_tensors"] > 100  # params, grads, buffers and AdamW state of a 2-layer Llama
    assert_hybrid_checks("hybrid_single_device", verdict)


@pytest.fixture(scope="module")
def fitted_single() -> pl.Trainer:
    pl.seed_everything(0, verbose=False)
    trainer = _trainer(strategy="hybrid_single_device", max_steps=1)
    trainer.fit(TinyLMModule(seed=0), token_loader(n=4))
    return trainer


def test_offload_onload_cycles_repeat(fitted_single: pl.Trainer) -> None:
    strategy = fitted_single.strategy
    module = strategy.lightning_module
    before = {k: v.clone() for k, v in module.state_dict().items()}
    for _ in range(3):
        assert strategy.offload_training_state() > 0
        assert strategy.onload_training_state() > 0
    assert strategy.onload_training_state() == 0.0  # not offloaded: nothing to do
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert module.policy_model.lm_head.weight.device.type == "cpu"


def test_iter_full_weights_buckets(fitted_single: pl.Trainer) -> None:
    strategy = fitted_single.strategy
    policy = strategy.lightning_module.policy_model
    want = policy.state_dict()

    one_each = list(strategy.iter_full_weights(bucket_bytes=1))
    assert [len(b) for b in one_each] == [1] * len(want)
    assert [name for b in one_each for name, _ in b] == list(want)

    (single,) = list(strategy.iter_full_weights(bucket_bytes=1 << 40))
    assert [name for name, _ in single] == list(want)
    for name, tensor in single:
        assert torch.equal(tensor, want[name])
        assert tensor.data_ptr() != want[name].data_ptr(), "buckets hold copies, never the live parameters"

    bucket_bytes = 100_000
    for bucket in strategy.iter_full_weights(bucket_bytes):
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert sum(sizes[:-1]) < bucket_bytes  # a bucket closes as soon as it reaches the target

    full, _ = gather_full(strategy, bucket_bytes)
    assert list(full) == list(want)
    assert next(strategy.iter_full_weights(1 << 40, rank_zero_only=True))[0][0] == next(iter(want))
    with pytest.raises(ValueError, match="bucket_bytes must be > 0, got 0"):
        next(strategy.iter_full_weights(0))


def test_policy_module_lookup() -> None:
    class WithModel(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Linear(2, 2)

    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

    strategy = HybridSingleDeviceStrategy()
    for module, want in [(TinyLMModule(), "policy_model"), (WithModel(), "model"), (Plain(), None)]:
        strategy._lightning_module = module
        assert strategy.policy_module is (getattr(module, want) if want else module)


def test_offload_before_setup_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="no LightningModule attached yet"):
        HybridSingleDeviceStrategy().offload_training_state()


def test_helpers() -> None:
    assert clean_param_name("model._orig_mod.layers.0._checkpoint_wrapped_module.w") == "model.layers.0.w"
    layers = find_decoder_layers(TinyLMModule().policy_model)
    assert [type(m).__name__ for m in layers] == ["LlamaDecoderLayer"] * 2
    assert find_decoder_layers(torch.nn.Linear(2, 2)) == []


# ---------------------------------------------------------------------------------------------- multi-process, CPU
@pytest.mark.slow
def test_ddp_two_ranks_bit_exact_and_gather(tmp_path: Path) -> None:
    result = run_worker("hybrid_ddp", 2, tmp_path)["hybrid_ddp"]
    assert_hybrid_checks("hybrid_ddp", result)


@pytest.mark.slow
def test_fsdp2_two_ranks_bit_exact_and_gather(tmp_path: Path) -> None:
    # vocab 67: embedding and lm_head shard unevenly (34 / 33 rows), so FSDP2 pads its shards and the offload
    # path goes through its re-padding (`reset_sharded_param`)
    result = run_worker("hybrid_fsdp2", 2, tmp_path, vocab=67)["hybrid_fsdp2"]
    assert_hybrid_checks("hybrid_fsdp2", result)
    assert result["gather_vs_get_model_state_dict"]["equal"]  # agrees with torch's own full state dict


@pytest.mark.slow
def test_deepspeed_zero_1_2_3_two_ranks_on_cpu(tmp_path: Path) -> None:
    """Lightning + DeepSpeed on DeepSpeed's CPU accelerator, 2 gloo ranks, torch AdamW (no compiled optimizer)."""
    names = [f"hybrid_deepspeed_stage_{stage}" for stage in (1, 2, 3)]
    results = run_worker(",".join(names), 2, tmp_path, timeout=400)
    for name in names:
        r = results[name]
        # DeepSpeed leaves module buffers where they are; on ZeRO 1/2 its Adam-moment offload is `.to("cpu")`,
        # a no-op for a CPU tensor (on CUDA it moves them); the fp32 masters and weights really move.
        may_stay = ("buffer/",) if name.endswith("3") else ("buffer/", "opt0/")
        assert_hybrid_checks(name, r, may_stay=may_stay)
        assert any(k.startswith("master/") for k in r) or r["n_state_tensors"] > 0
        if name.endswith("3"):
            assert r["gather_while_offloaded_raises"], "ZeRO-3 must refuse to gather while offloaded"


# ---------------------------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    "name",
    ["hybrid_single_device", "hybrid_ddp", "hybrid_fsdp2", "hybrid_deepspeed_stage_2", "hybrid_deepspeed_stage_3"],
)
def test_cuda_offload_frees_device_memory_and_is_bit_exact(name: str, tmp_path: Path) -> None:
    devices = 1 if name == "hybrid_single_device" else min(2, torch.cuda.device_count())
    result = run_worker(name, devices, tmp_path, accelerator="cuda", timeout=500, hidden=256, layers=4)[name]
    # DeepSpeed leaves module buffers on the device and host-resident optimizer state (Adam's `step`) in place
    may_stay = ("buffer/", "/step") if "deepspeed" in name else ()
    assert_hybrid_checks(name, result, may_stay=may_stay)
    freed = result["cuda_mem_before"] - result["cuda_mem_offloaded"]
    # DDP keeps its reducer's gradient buckets (one fp32 copy of the grads out of params+grads+2 Adam moments)
    share = 0.6 if name == "hybrid_ddp" else 0.9
    assert freed >= share * result["state_bytes_on_device"], result
    assert result["cuda_mem_onloaded"] >= result["cuda_mem_before"] - 0.1 * result["state_bytes_on_device"]
    if "deepspeed" not in name:
        assert result["pinned_share"] == 1.0, "offloaded tensors must sit in page-locked memory"


# ---------------------------------------------------------------------------------------------- docs
def test_docs_example_runs() -> None:
    text = (REPO / "docs" / "strategies.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/strategies.md has no python example"
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    exec(compile(blocks[0], "docs/strategies.md", "exec"), namespace)
    strategy = namespace["trainer"].strategy
    assert isinstance(strategy, HybridSingleDeviceStrategy)
    assert strategy.last_offload_s > 0 and strategy.last_onload_s > 0 and not strategy.is_offloaded
