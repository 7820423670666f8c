"""LoRA (``GRPOModule(peft=...)``): only the adapter trains, the synced weights are PEFT's merge, the checks before
anything starts, adapter-only checkpoints that resume exactly, the exports, and real fits whose replicas serve the
merged model under every hybrid strategy."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.lightning.strategies import HybridSingleDeviceStrategy
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.rollout.weights.format import checksum_state
from lightning_hybrid_rollout.training.lora import (
    VLLM_LORA_RANKS,
    adapter_state_dict,
    check_adapter_sync,
    check_lora_targets,
    engine_lora_config,
    inject_lora,
    lora_config_from,
    merged_state_dict,
)

HERE = Path(__file__).resolve().parent
VOCAB = 64


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    return LlamaForCausalLM(cfg)


def synthetic_samples(step: int, groups: int = 2, group_size: int = 4) -> list[Sample]:
    """Random prompts and responses of one step (the same for the same step), rewards that differ in each group."""
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for k in range(groups):
        prompt = torch.randint(3, VOCAB, (3 + k,), generator=g).tolist()
        for i in range(group_size):
            n = 1 + (i + k) % 4
            out.append(
                Sample(
                    uid=f"{step}-{k}-{i}",
                    group_id=f"{step}-{k}",
                    prompt="",
                    prompt_token_ids=prompt,
                    response_token_ids=torch.randint(3, VOCAB, (n,), generator=g).tolist(),
                    response_logprobs=(-math.log(VOCAB) + 0.3 * torch.randn(n, generator=g)).tolist(),
                    reward=float((i + k) % 2),
                    min_weight_version=0,
                    max_weight_version=0,
                )
            )
    return out


PEFT = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _lora_module(seed: int = 0, **kw: Any) -> GRPOModule:
    module = GRPOModule(model=tiny_llama(seed), lr=1e-2, peft=kw.pop("peft", PEFT), **kw)
    module.configure_model()
    return module


def _randomize_adapter(model: torch.nn.Module, seed: int = 1) -> None:
    """lora_B starts at zero (the merge would be the base weight): random values make the merge check real."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _peft_merge(base: torch.nn.Module, trained: torch.nn.Module) -> dict[str, torch.Tensor]:
    """PEFT's own ``merge_and_unload`` of ``base`` with ``trained``'s adapter."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    peft_model = get_peft_model(base, LoraConfig(**PEFT))
    result = set_peft_model_state_dict(peft_model, adapter_state_dict(trained))
    assert not result.unexpected_keys
    return peft_model.merge_and_unload().state_dict()


# ---------------------------------------------------------------------------------------------- training
def test_only_the_adapter_trains_and_the_optimizer_holds_only_it() -> None:
    module = _lora_module()
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable), trainable
    assert len(trainable) == 2 * 3 * 2  # lora_A + lora_B x 3 targets x 2 layers
    opt = module.configure_optimizers()
    in_opt = {id(p) for group in opt.param_groups for p in group["params"]}
    assert in_opt == {id(p) for p in module.parameters() if p.requires_grad}
    assert not module.strict_loading
    assert type(module.policy_model).__name__ == "LlamaForCausalLM"  # the HF class and forward are kept


# ---------------------------------------------------------------------------------------------- merge
def test_merged_weights_equal_peft_merge_and_unload_and_leave_the_model_unchanged() -> None:
    module = _lora_module()
    policy = module.policy_model
    _randomize_adapter(policy)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    merged = merged_state_dict(policy)
    expected = _peft_merge(tiny_llama(0), policy)
    assert list(merged) == list(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        tiny_llama(0).state_dict()["model.layers.0.self_attn.q_proj.weight"],
    ), "the adapter changed nothing: the comparison would be vacuous"
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the merge mutated the training model"


def test_the_strategy_streams_the_merged_weights_in_buckets() -> None:
    module = _lora_module()
    _randomize_adapter(module.policy_model)
    strategy = HybridSingleDeviceStrategy()
    strategy._lightning_module = module
    buckets = list(strategy.iter_full_weights(bucket_bytes=20_000))
    streamed = [item for bucket in buckets for item in bucket]
    assert len(buckets) > 1
    merged = merged_state_dict(module.policy_model)
    assert [n for n, _ in streamed] == list(merged)
    assert checksum_state(streamed) == checksum_state(merged)


def test_an_adapter_only_sync_streams_the_adapter_under_peft_s_names() -> None:
    """``rollout.lora_sync: adapter``: what the strategy streams is exactly what PEFT saves (names and values)."""
    module = _lora_module()
    _randomize_adapter(module.policy_model)
    strategy = HybridSingleDeviceStrategy()
    strategy._lightning_module = module
    streamed = [item for bucket in strategy.iter_full_weights(bucket_bytes=2_000, adapter_only=True) for item in bucket]
    saved = adapter_state_dict(module.policy_model)
    assert [n for n, _ in streamed] == list(saved) and len(saved) == 2 * 3 * 2  # A and B, 3 targets, 2 layers
    assert checksum_state(streamed) == checksum_state(saved)
    assert sum(t.numel() * t.element_size() for _, t in streamed) < _nbytes(merged_state_dict(module.policy_model)) / 10
    with pytest.raises(RuntimeError, match="needs a LoRA policy"):
        strategy._lightning_module = GRPOModule(model=tiny_llama(), lr=1e-2)
        next(strategy.iter_full_weights(adapter_only=True))


def _nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_the_engines_lora_settings_come_from_the_peft_config() -> None:
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig, engine_kwargs_for

    lora = engine_lora_config(lora_config_from({"r": 12, "lora_alpha": 24, "target_modules": ["v_proj", "q_proj"]}))
    assert lora["max_lora_rank"] == 16 and lora["r"] == 12 and lora["target_modules"] == ["q_proj", "v_proj"]
    assert engine_lora_config(lora_config_from({"r": 8, "rank_pattern": {"q_proj": 40}}))["max_lora_rank"] == 64
    kwargs = engine_kwargs_for(VLLMEngineConfig(model="m", lora=lora), on_cuda=False)
    assert (kwargs["enable_lora"], kwargs["max_lora_rank"], kwargs["max_loras"]) == (True, 16, 1)
    assert "enable_lora" not in engine_kwargs_for(VLLMEngineConfig(model="m"), on_cuda=False)


def test_adapter_sync_refuses_trained_biases_and_sharded_engines_in_one_line() -> None:
    check_adapter_sync(lora_config_from({"r": 4}))
    with pytest.raises(ConfigError) as info:
        check_adapter_sync(lora_config_from({"r": 4, "bias": "lora_only"}))
    assert str(info.value).startswith("rollout.lora_sync='adapter' cannot send trained biases (peft.bias='lora_only')")
    assert "rollout.lora_sync: merged" in str(info.value)
    with pytest.raises(ConfigError, match=r"for rollout.tensor_parallel_size 1 only \(got 2\)"):
        check_adapter_sync(lora_config_from({"r": 4}), tensor_parallel_size=2)


# ---------------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize(
    ("options", "line"),
    [
        ({"r": 4, "lora_alpah": 8}, "peft.lora_alpah is not a LoraConfig field. Did you mean 'lora_alpha'?"),
        ({"r": 1024}, "peft.r=1024 is above vLLM's largest LoRA rank 512"),
        ({"r": 8, "rank_pattern": {"q_proj": 600}}, "peft.rank_pattern['q_proj']=600 is above vLLM's largest"),
        ({"r": 8, "use_dora": True}, "peft.use_dora=True is not supported: the weight sync merges plain LoRA"),
        ({"r": 8, "modules_to_save": ["lm_head"]}, "peft.modules_to_save=['lm_head'] is not supported"),
        ({"r": 0}, "peft.r=0 must be a positive integer (the adapter's rank)."),
        ({"r": 8, "layers_pattern": "layers"}, "peft: LoraConfig refused it: When `layers_pattern` is specified"),
    ],
)
def test_each_bad_peft_option_is_one_line_at_construction(options: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        GRPOModule(model=tiny_llama(), peft=options)
    assert "\n" not in str(info.value) and str(info.value).startswith(line), str(info.value)


def test_target_modules_that_match_nothing_are_refused_before_anything_starts(tmp_path: Path) -> None:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    config = lora_config_from({"r": 4, "target_modules": ["qproj"]})
    model_dir = build_tiny_model(tmp_path / "tiny", hidden=32, layers=1)
    with pytest.raises(ConfigError) as info:
        check_lora_targets(config, model_dir)  # what the callback's setup runs, before Ray
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("peft.target_modules=['qproj'] matches no module of LlamaForCausalLM"), message
    assert "'q_proj'" in message  # names the model's linear layers
    check_lora_targets(lora_config_from({"r": 4, "target_modules": ["q_proj"]}), model_dir)  # a good one passes
    with pytest.raises(ConfigError, match="matches no module"):
        inject_lora(tiny_llama(), config)  # and configure_model refuses it the same way


def test_the_rank_limit_is_vllms() -> None:
    from vllm.config.lora import MaxLoRARanks

    assert typing.get_args(MaxLoRARanks) == VLLM_LORA_RANKS


# ---------------------------------------------------------------------------------------------- checkpoints
class _StepSource:
    """Each step's batch from the trainer's global step (a resumed fit gets the same batches)."""

    def __init__(self) -> None:
        self.module: GRPOModule | None = None

    def __call__(self) -> list:
        assert self.module is not None
        return synthetic_samples(self.module.trainer.global_step)


def _fit(module: GRPOModule, tmp_path: Path, steps: int, ckpt_path: str | None = None) -> Trainer:
    source = _StepSource()
    source.module = module
    dm = RolloutDataModule(pad_token_id=0)
    dm.attach_source(source)
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        strategy="hybrid_single_device",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return trainer


def _adapter(module: GRPOModule) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def test_checkpoint_holds_the_adapter_and_resumes_exactly(tmp_path: Path) -> None:
    straight = GRPOModule(model=tiny_llama(0), lr=1e-2, peft=PEFT)
    _fit(straight, tmp_path / "a", 3)

    first = GRPOModule(model=tiny_llama(0), lr=1e-2, peft=PEFT)
    trainer = _fit(first, tmp_path / "b", 2)
    ckpt = tmp_path / "lora.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)
    assert set(saved["state_dict"]) == set(_adapter(first)), "the checkpoint must hold the adapter only"
    opt_state = saved["optimizer_states"][0]["state"]
    assert len(opt_state) == len(saved["state_dict"])  # AdamW moments of the adapter only

    full = GRPOModule(model=tiny_llama(0), lr=1e-2)
    full_trainer = _fit(full, tmp_path / "c", 2)
    full_ckpt = tmp_path / "full.ckpt"
    full_trainer.save_checkpoint(full_ckpt)
    lora_bytes, full_bytes = ckpt.stat().st_size, full_ckpt.stat().st_size
    print(f"checkpoint bytes: lora {lora_bytes}, full {full_bytes}")
    assert lora_bytes * 5 < full_bytes, (lora_bytes, full_bytes)

    resumed = GRPOModule(model=tiny_llama(0), lr=1e-2, peft=PEFT)
    trainer2 = _fit(resumed, tmp_path / "d", 2, ckpt_path=str(ckpt))  # restore only: already at step 2
    for name, tensor in _adapter(first).items():
        assert torch.equal(tensor, _adapter(resumed)[name]), name
    restored = trainer2.optimizers[0].state_dict()["state"]
    for key, state in trainer.optimizers[0].state_dict()["state"].items():
        assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(restored[key][k])) for k, v in state.items())

    resumed = GRPOModule(model=tiny_llama(0), lr=1e-2, peft=PEFT)
    _fit(resumed, tmp_path / "e", 3, ckpt_path=str(ckpt))  # one more step after the resume
    for name, tensor in _adapter(straight).items():
        assert torch.equal(tensor, _adapter(resumed)[name]), name
    base = {n: p for n, p in resumed.named_parameters() if not p.requires_grad}
    assert all(
        torch.equal(p, tiny_llama(0).state_dict()[n.removeprefix("model.").replace(".base_layer", "")])
        for n, p in base.items()
        if "lora" not in n
    )


def test_a_checkpoint_without_the_adapter_is_refused(tmp_path: Path) -> None:
    full = GRPOModule(model=tiny_llama(0), lr=1e-2)
    trainer = _fit(full, tmp_path / "a", 1)
    trainer.save_checkpoint(tmp_path / "full.ckpt")
    with pytest.raises(ValueError, match="the checkpoint lacks 12 of the adapter's tensors"):
        _fit(GRPOModule(model=tiny_llama(0), lr=1e-2, peft=PEFT), tmp_path / "b", 1, str(tmp_path / "full.ckpt"))


# ---------------------------------------------------------------------------------------------- export
def test_export_adapter_loads_in_peft_and_export_merged_is_the_merged_model(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    module = _lora_module()
    _randomize_adapter(module.policy_model)
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = module.policy_model(input_ids=ids).logits

    adapter_dir = module.export_adapter(tmp_path / "adapter")
    assert {p.name for p in adapter_dir.iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    loaded = PeftModel.from_pretrained(tiny_llama(0), str(adapter_dir))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, rtol=0, atol=1e-5)

    merged_dir = module.export_merged(tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(str(merged_dir))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, want, rtol=0, atol=1e-5)
    assert not any("lora" in k or "base_layer" in k for k in plain.state_dict())


# ---------------------------------------------------------------------------------------------- real fits
def _run_fit(tmp_path: Path, model_dir: Path, strategy: str, devices: int, lora_sync: str) -> dict[str, Any]:
    spec = {
        "out": str(tmp_path / "report.json"),
        "root": str(tmp_path / "run"),
        "model_dir": str(model_dir),
        "strategy": strategy,
        "devices": devices,
        "max_steps": 4,
        "peft": PEFT | {"target_modules": ["q_proj", "v_proj", "up_proj"]},
        "lora_sync": lora_sync,
    }
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "_lora_fit.py"), str(spec_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads((tmp_path / "report.json").read_text())


@pytest.fixture(scope="module")
def lora_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("lora_model") / "tiny", hidden=128, layers=2, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "devices"),
    [("hybrid_single_device", 1), ("hybrid_fsdp2", 2), ("hybrid_deepspeed_stage_2", 1)],
)
def test_a_lora_fit_syncs_the_merged_model_to_every_replica(
    strategy: str, devices: int, lora_model_dir: Path, tmp_path: Path
) -> None:
    rep = _run_fit(tmp_path, lora_model_dir, strategy, devices, "merged")
    pushes = rep["pushes"]
    assert len(pushes) >= 3, pushes  # several syncs, each verified by every replica's checksum
    assert all(p["replica_checksums"] and set(p["replica_checksums"].values()) == {p["checksum"]} for p in pushes)
    assert rep["trainable_only_lora"] and rep["adapter_changed"]
    # the replicas' weights after the last sync are PEFT's merge of the trainer's adapter into the base model
    assert pushes[-1]["checksum"] == rep["peft_merged_checksum"], (pushes[-1], rep["peft_merged_checksum"])
    assert rep["peft_merged_checksum"] != rep["base_checksum"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "devices"),
    [("hybrid_single_device", 1), ("hybrid_fsdp2", 2), ("hybrid_deepspeed_stage_2", 1)],
)
def test_a_lora_fit_with_adapter_sync_sends_only_the_adapter_to_every_replica(
    strategy: str, devices: int, lora_model_dir: Path, tmp_path: Path
) -> None:
    rep = _run_fit(tmp_path, lora_model_dir, strategy, devices, "adapter")
    pushes = rep["pushes"]
    assert len(pushes) >= 3, pushes  # several syncs, each verified by every replica's checksum
    assert all(p["replica_checksums"] and set(p["replica_checksums"].values()) == {p["checksum"]} for p in pushes)
    assert rep["trainable_only_lora"] and rep["adapter_changed"]
    # the replicas hold exactly the trainer's adapter after the last sync, and no push carried the base
    assert pushes[-1]["checksum"] == rep["adapter_checksum"], (pushes[-1], rep["adapter_checksum"])
    assert max(p["bytes"] for p in pushes) < 100_000  # the tiny model's full weights are ~2 MB
    assert ["hybrid"] in rep["push_roles"]  # a hybrid activation took the adapter alone too
