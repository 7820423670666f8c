"""The ``rollout`` section's engine fields: tensor_parallel_size, gpu_memory_utilization, max_model_len,
enable_prefix_caching and engine_kwargs (pure config; no vLLM)."""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.config import ConfigError, HybridRolloutConfig, RolloutConfig


def _problem(**kwargs: object) -> str:
    with pytest.raises(ConfigError) as err:
        RolloutConfig(**kwargs)  # type: ignore[arg-type]
    assert len(err.value.problems) == 1, err.value.problems
    assert "\n" not in err.value.problems[0]
    return err.value.problems[0]


def test_defaults_leave_the_engine_as_before() -> None:
    r = RolloutConfig()
    assert (r.tensor_parallel_size, r.gpu_memory_utilization, r.max_model_len) == (1, 0.4, None)
    assert r.enable_prefix_caching is None and r.engine_kwargs == {}


def test_default_gpu_memory_utilization_is_the_engine_configs() -> None:
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    assert RolloutConfig().gpu_memory_utilization == VLLMEngineConfig(model="m").gpu_memory_utilization


def test_max_model_len_defaults_to_prompt_plus_response_plus_8() -> None:
    assert RolloutConfig(prompt_length=100, response_length=50).engine_max_model_len() == 158
    assert RolloutConfig(prompt_length=100, response_length=50, max_model_len=150).engine_max_model_len() == 150


def test_max_model_len_shorter_than_prompt_plus_response_is_refused() -> None:
    msg = _problem(prompt_length=100, response_length=50, max_model_len=149)
    assert msg.startswith("rollout.max_model_len must be >= prompt_length + response_length = 150, got 149.")


def test_max_model_len_must_be_an_integer() -> None:
    assert _problem(max_model_len="4k").startswith("rollout.max_model_len must be null or an integer, got '4k'")


@pytest.mark.parametrize("value", [0.0, 1.5, -0.1, "0.5"])
def test_gpu_memory_utilization_outside_0_1_is_refused(value: object) -> None:
    msg = _problem(gpu_memory_utilization=value)
    assert msg.startswith("rollout.gpu_memory_utilization must be a number in (0, 1]")


def test_tensor_parallel_on_cpu_is_refused() -> None:
    msg = _problem(tensor_parallel_size=2)
    assert msg.startswith("rollout.tensor_parallel_size must be 1 on CPU (gpus_per_replica: 0), got 2")


def test_tensor_parallel_needs_as_many_gpus_per_replica() -> None:
    assert "set gpus_per_replica: 4" in _problem(tensor_parallel_size=4, gpus_per_replica=2.0)
    assert RolloutConfig(tensor_parallel_size=4, gpus_per_replica=4.0).tensor_parallel_size == 4
    assert _problem(tensor_parallel_size=0).startswith("rollout.tensor_parallel_size must be >= 1, got 0")


def test_enable_prefix_caching_must_be_null_or_bool() -> None:
    assert RolloutConfig(enable_prefix_caching=False).enable_prefix_caching is False
    assert _problem(enable_prefix_caching="yes").startswith("rollout.enable_prefix_caching must be null, true or false")


def test_engine_kwargs_key_owned_by_a_field_is_refused_naming_the_field() -> None:
    msg = _problem(engine_kwargs={"max_num_seqs": 8})
    assert msg.startswith("rollout.engine_kwargs.max_num_seqs is set by rollout.concurrent_samples_per_replica")
    assert "`concurrent_samples_per_replica: 8`" in msg


@pytest.mark.parametrize("key", sorted(RolloutConfig.ENGINE_ARG_FIELDS))
def test_every_typed_engine_argument_is_refused_in_engine_kwargs(key: str) -> None:
    assert f"is set by rollout.{RolloutConfig.ENGINE_ARG_FIELDS[key]}" in _problem(engine_kwargs={key: 1})


@pytest.mark.parametrize("key", sorted(RolloutConfig.RESERVED_ENGINE_ARGS))
def test_engine_arguments_the_package_sets_are_refused(key: str) -> None:
    assert "lightning_hybrid_rollout sets it itself" in _problem(engine_kwargs={key: "x"})


def test_engine_kwargs_must_be_a_mapping() -> None:
    assert _problem(engine_kwargs=["block_size", 16]).startswith("rollout.engine_kwargs must be a mapping")


def test_other_engine_kwargs_pass_and_round_trip_through_a_dict() -> None:
    cfg = HybridRolloutConfig.from_dict(
        {"rollout": {"engine_kwargs": {"max_num_batched_tokens": 2048}, "enable_prefix_caching": True}}
    )
    assert cfg.rollout.engine_kwargs == {"max_num_batched_tokens": 2048}
    assert HybridRolloutConfig.from_dict(cfg.to_dict()) == cfg


def test_typed_field_names_match_rollout_config_fields() -> None:
    import dataclasses

    names = {f.name for f in dataclasses.fields(RolloutConfig)}
    assert set(RolloutConfig.ENGINE_ARG_FIELDS.values()) <= names


def test_new_fields_have_attribute_docstrings() -> None:
    from lightning_hybrid_rollout.config import field_docs

    docs = field_docs(RolloutConfig)
    for name in ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "enable_prefix_caching"):
        assert len(docs[name]) > 40
    assert "refused" in docs["engine_kwargs"]
