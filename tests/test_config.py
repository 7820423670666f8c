"""Config defaults (design/scheduling.md §2 / design/notes.md §3), derived sample counts, validation messages, dict and
YAML round trips."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from lightning_hybrid_rollout import config as C
from lightning_hybrid_rollout.config import (
    AsyncTrainingConfig,
    ConfigError,
    HybridRolloutConfig,
    RolloutConfig,
    TinyModelConfig,
    field_docs,
    validate_run_config,
)

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------------------
# defaults and derived values
# ---------------------------------------------------------------------------------------------------------------


def test_async_training_defaults_match_the_seed():
    a = AsyncTrainingConfig()
    assert a.use_dynamic_resource_scheduling is True
    assert a.dynamic_schedule_policy == "default"
    assert a.dynamic_schedule_deactivate_ratio == 0.3
    assert a.dynamic_schedule_enable_rebalance is True
    assert a.staleness_threshold == 0.1
    assert a.trigger_parameter_sync_step == 4
    assert a.require_batches == 1
    assert a.partial_rollout is True
    assert a.only_hybrid is False


def test_rollout_defaults():
    r = RolloutConfig()
    assert r.concurrent_samples_per_replica == 16
    assert (r.standalone_replicas, r.hybrid_replicas, r.n) == (1, 1, 8)
    assert (r.temperature, r.top_p, r.dtype) == (1.0, 1.0, "float32")
    assert r.kv_cache_memory_bytes == 256 * 1024 * 1024
    assert (r.cpus_per_replica, r.gpus_per_replica, r.ray_address, r.enforce_eager, r.seed) == (1, 0.0, None, True, 0)


def test_derived_sample_counts_by_hand():
    a = AsyncTrainingConfig(
        mini_batch_size=64, require_batches=2, trigger_parameter_sync_step=4, staleness_threshold=0.1
    )
    assert a.required_samples == 128  # 64 · 2
    assert a.step_required_samples == 512  # 128 · 4
    assert a.max_required_samples == 563  # int(128 · 1.1 · 4) = int(563.2)
    assert a.buffer_samples == 51  # int(512 · 0.1) = int(51.2)  (verl's code; its doc says expected · threshold)

    d = AsyncTrainingConfig()  # mini_batch_size 64, require_batches 1, trigger 4, staleness 0.1
    assert (d.required_samples, d.step_required_samples) == (64, 256)
    assert d.max_required_samples == 281  # int(64 · 1.1 · 4) = int(281.6)
    assert d.buffer_samples == 25  # int(256 · 0.1) = int(25.6)

    z = AsyncTrainingConfig(mini_batch_size=8, staleness_threshold=0.0, trigger_parameter_sync_step=1)
    assert (z.required_samples, z.step_required_samples, z.max_required_samples, z.buffer_samples) == (8, 8, 8, 0)


def test_max_required_samples_keeps_verls_float_rounding():
    # verl computes int(required * (staleness + 1) * trigger) in floats: 100 · 1.15 = 114.99999999999999 -> 114.
    # We keep the same expression so queue bounds match verl's runs exactly.
    a = AsyncTrainingConfig(mini_batch_size=100, staleness_threshold=0.15, trigger_parameter_sync_step=1)
    assert a.max_required_samples == 114


def test_derived_counts_is_the_one_formula_behind_the_properties():
    counts = C.derived_counts(
        mini_batch_size=64, require_batches=2, trigger_parameter_sync_step=4, staleness_threshold=0.1
    )
    assert counts == C.DerivedCounts(
        required_samples=128, step_required_samples=512, max_required_samples=563, buffer_samples=51
    )
    a = AsyncTrainingConfig(
        mini_batch_size=64, require_batches=2, trigger_parameter_sync_step=4, staleness_threshold=0.1
    )
    assert a.derived_counts == counts
    assert (a.required_samples, a.step_required_samples, a.max_required_samples, a.buffer_samples) == (
        dataclasses.astuple(counts)
    )
    with pytest.raises(TypeError):  # keyword-only: two ints and a float are too easy to swap
        C.derived_counts(64, 4, 0.1)  # type: ignore[misc]


def _staleness_arithmetic(path: Path) -> list[str]:
    """``file:line`` of each arithmetic expression with ``staleness_threshold`` as an operand in ``path``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.BinOp):
            for side in (node.left, node.right):
                names = {n.attr for n in ast.walk(side) if isinstance(n, ast.Attribute)}
                names |= {n.id for n in ast.walk(side) if isinstance(n, ast.Name)}
                if "staleness_threshold" in names:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return sorted(set(found))


def test_only_derived_counts_computes_from_the_staleness_threshold():
    # the runtime (rollout/, lightning/) and the simulator (sim/) read the counts from the config; a second formula
    # elsewhere would let the queue bound or the policy's buffer drift apart between them
    package = REPO / "lightning_hybrid_rollout"
    offenders = [
        hit
        for path in sorted(package.rglob("*.py"))
        if path != package / "config" / "async_training.py"
        for hit in _staleness_arithmetic(path)
    ]
    assert offenders == [], f"compute the counts with config.derived_counts instead: {offenders}"
    assert _staleness_arithmetic(package / "config" / "async_training.py")  # the check sees the formula where it is


def test_rollout_capacity_from_the_whole_config():
    cfg = HybridRolloutConfig()  # s = 16, max_required_samples = 281
    assert cfg.rollout_capacity(1) == 16  # min(1 · 16, 281)
    assert cfg.rollout_capacity(2) == 32
    small = HybridRolloutConfig(AsyncTrainingConfig(mini_batch_size=8, trigger_parameter_sync_step=1), RolloutConfig())
    assert small.rollout_capacity(2) == 8  # min(32, int(8 · 1.1 · 1) = 8)


# ---------------------------------------------------------------------------------------------------------------
# validation: one message per bad value, naming the key and the value
# ---------------------------------------------------------------------------------------------------------------

BAD_SINGLE_VALUES = [
    (AsyncTrainingConfig, "use_dynamic_resource_scheduling", "yes"),
    (AsyncTrainingConfig, "dynamic_schedule_policy", "defualt"),
    (AsyncTrainingConfig, "dynamic_schedule_deactivate_ratio", 0.0),
    (AsyncTrainingConfig, "dynamic_schedule_deactivate_ratio", 1.5),
    (AsyncTrainingConfig, "dynamic_schedule_deactivate_ratio", "0.3"),
    (AsyncTrainingConfig, "dynamic_schedule_enable_rebalance", 1),
    (AsyncTrainingConfig, "staleness_threshold", -0.1),
    (AsyncTrainingConfig, "staleness_threshold", float("nan")),
    (AsyncTrainingConfig, "trigger_parameter_sync_step", 0),
    (AsyncTrainingConfig, "trigger_parameter_sync_step", 2.5),
    (AsyncTrainingConfig, "require_batches", 0),
    (AsyncTrainingConfig, "partial_rollout", None),
    (AsyncTrainingConfig, "mini_batch_size", 0),
    (AsyncTrainingConfig, "mini_batch_size", True),
    (AsyncTrainingConfig, "only_hybrid", "false"),
    (RolloutConfig, "model_path", 3),
    (RolloutConfig, "standalone_replicas", -1),
    (RolloutConfig, "hybrid_replicas", -1),
    (RolloutConfig, "concurrent_samples_per_replica", 0),
    (RolloutConfig, "n", 0),
    (RolloutConfig, "response_length", 0),
    (RolloutConfig, "prompt_length", 0),
    (RolloutConfig, "temperature", -1.0),
    (RolloutConfig, "top_p", 0.0),
    (RolloutConfig, "top_p", 1.5),
    (RolloutConfig, "dtype", "fp32"),
    (RolloutConfig, "kv_cache_memory_bytes", 0),
    (RolloutConfig, "cpus_per_replica", 0),
    (RolloutConfig, "gpus_per_replica", -1.0),
    (RolloutConfig, "ray_address", ""),
    (RolloutConfig, "enforce_eager", "true"),
    (RolloutConfig, "seed", -1),
    (RolloutConfig, "lora_sync", "full"),
    (RolloutConfig, "lora_keep_base", "yes"),
]


@pytest.mark.parametrize(("cls", "key", "value"), BAD_SINGLE_VALUES, ids=lambda v: repr(v)[:40])
def test_each_bad_value_raises_config_error_naming_key_and_value(cls, key, value):
    with pytest.raises(ConfigError) as err:
        cls(**{key: value})
    assert len(err.value.problems) == 1, err.value.problems  # exactly one message for one bad value
    message = err.value.problems[0]
    assert message.startswith(f"{cls.SECTION}.{key} must be "), message
    assert f"got {value!r}" in message
    assert isinstance(err.value, ValueError)


def test_bad_choice_suggests_a_close_match():
    with pytest.raises(ConfigError, match=r"Did you mean 'default'\?"):
        AsyncTrainingConfig(dynamic_schedule_policy="defualt")
    with pytest.raises(ConfigError, match=r"Did you mean 'bfloat16'\?"):
        RolloutConfig(dtype="bfloat61")


def test_several_bad_values_are_reported_together_one_line_each():
    with pytest.raises(ConfigError) as err:
        AsyncTrainingConfig(dynamic_schedule_deactivate_ratio=1.5, trigger_parameter_sync_step=0)
    assert len(err.value.problems) == 2
    assert str(err.value).startswith("2 invalid config values:\n  - async_training.dynamic_schedule_deactivate_ratio")
    assert "must be a number in (0, 1], got 1.5" in str(err.value)


def _rollout(**kw):
    return RolloutConfig(**kw)


BAD_COMBINATIONS = [
    (
        "only_hybrid_without_hybrid_replicas",
        dict(only_hybrid=True),
        dict(standalone_replicas=0, hybrid_replicas=0),
        "rollout.hybrid_replicas must be >= 1 when async_training.only_hybrid is true, got 0.",
    ),
    (
        "only_hybrid_with_standalone_replicas",
        dict(only_hybrid=True),
        dict(standalone_replicas=2, hybrid_replicas=1),
        "rollout.standalone_replicas must be 0 when async_training.only_hybrid is true, got 2.",
    ),
    (
        "only_hybrid_without_scheduling",
        dict(only_hybrid=True, use_dynamic_resource_scheduling=False),
        dict(standalone_replicas=0, hybrid_replicas=1),
        "async_training.use_dynamic_resource_scheduling must be true when async_training.only_hybrid is true",
    ),
    (
        "hybrid_replicas_without_scheduling",
        dict(use_dynamic_resource_scheduling=False),
        dict(standalone_replicas=1, hybrid_replicas=2),
        "rollout.hybrid_replicas must be 0 when async_training.use_dynamic_resource_scheduling is false, got 2.",
    ),
    (
        "no_replicas_at_all",
        dict(),
        dict(standalone_replicas=0, hybrid_replicas=0),
        "rollout.standalone_replicas + rollout.hybrid_replicas must be >= 1, got 0 + 0.",
    ),
    (
        "mini_batch_not_a_multiple_of_n",
        dict(mini_batch_size=30),
        dict(n=8),
        "async_training.mini_batch_size must be a multiple of rollout.n=8, got 30. A step trains whole groups: use "
        "e.g. 32 (4 prompts × n=8).",
    ),
]


@pytest.mark.parametrize(
    ("async_kw", "rollout_kw", "message"), [c[1:] for c in BAD_COMBINATIONS], ids=[c[0] for c in BAD_COMBINATIONS]
)
def test_cross_field_rules(async_kw, rollout_kw, message):
    a, r = AsyncTrainingConfig(**async_kw), RolloutConfig(**rollout_kw)
    with pytest.raises(ConfigError) as err:
        HybridRolloutConfig(a, r)
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems
    with pytest.raises(ConfigError):
        validate_run_config(a, r)


def test_valid_topologies_pass():
    HybridRolloutConfig()  # 1 standalone + 1 hybrid, dynamic scheduling on
    HybridRolloutConfig(AsyncTrainingConfig(only_hybrid=True), RolloutConfig(standalone_replicas=0, hybrid_replicas=2))
    HybridRolloutConfig(AsyncTrainingConfig(use_dynamic_resource_scheduling=False), RolloutConfig(hybrid_replicas=0))
    HybridRolloutConfig(AsyncTrainingConfig(mini_batch_size=12), RolloutConfig(n=4))


def test_sections_must_be_config_objects():
    with pytest.raises(ConfigError, match="async_training must be an AsyncTrainingConfig"):
        HybridRolloutConfig(async_training={"mini_batch_size": 8})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------------
# policy names come from the schedule registry
# ---------------------------------------------------------------------------------------------------------------


def test_builtin_policies_are_accepted():
    assert set(C.BUILTIN_POLICIES) <= set(C.available_policy_names())
    for name in ("default", "static_fully_async", "fixed_ratio"):
        assert AsyncTrainingConfig(dynamic_schedule_policy=name).dynamic_schedule_policy == name


def test_policy_names_are_read_from_schedule_available_policies(monkeypatch):
    fake = types.ModuleType("lightning_hybrid_rollout.schedule")
    fake.available_policies = lambda: ["default", "my_policy"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning_hybrid_rollout.schedule", fake)
    assert AsyncTrainingConfig(dynamic_schedule_policy="my_policy").dynamic_schedule_policy == "my_policy"
    with pytest.raises(ConfigError, match=r"one of \['default', 'my_policy'\], got 'fixed_ratio'"):
        AsyncTrainingConfig(dynamic_schedule_policy="fixed_ratio")


# ---------------------------------------------------------------------------------------------------------------
# dict / YAML round trips
# ---------------------------------------------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip():
    cfg = HybridRolloutConfig(
        AsyncTrainingConfig(staleness_threshold=0.5, mini_batch_size=16),
        RolloutConfig(model_path="/models/tiny", n=4, ray_address="127.0.0.1:6379"),
    )
    d = cfg.to_dict()
    assert d["async_training"]["staleness_threshold"] == 0.5
    assert d["rollout"]["model_path"] == "/models/tiny"
    assert HybridRolloutConfig.from_dict(d) == cfg
    assert AsyncTrainingConfig.from_dict(cfg.async_training.to_dict()) == cfg.async_training
    assert HybridRolloutConfig.from_dict({}) == HybridRolloutConfig()


def test_unknown_keys_are_rejected_with_a_suggestion_and_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        HybridRolloutConfig.from_dict({"async_training": {"staleness_treshold": 0.2}})
    msg = str(err.value)
    assert "async_training has no key 'staleness_treshold'. Did you mean 'staleness_threshold'?" in msg
    assert "Valid keys: use_dynamic_resource_scheduling, dynamic_schedule_policy" in msg
    with pytest.raises(ConfigError, match=r"HybridRolloutConfig has no key 'rolout'\. Did you mean 'rollout'"):
        HybridRolloutConfig.from_dict({"rolout": {}})
    with pytest.raises(ConfigError, match="rollout must be a mapping"):
        RolloutConfig.from_dict(["n", 8])  # type: ignore[arg-type]


def test_from_dict_validates_values():
    with pytest.raises(ConfigError, match=r"rollout\.top_p must be a number in \(0, 1\], got 2"):
        HybridRolloutConfig.from_dict({"rollout": {"top_p": 2}})


# ---------------------------------------------------------------------------------------------------------------
# documentation
# ---------------------------------------------------------------------------------------------------------------

CONFIG_CLASSES = (AsyncTrainingConfig, RolloutConfig, HybridRolloutConfig, TinyModelConfig)


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: c.__name__)
def test_every_field_has_an_attribute_docstring(cls):
    docs = field_docs(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    assert sorted(docs) == sorted(names)
    assert all(len(docs[n]) > 20 for n in names)


def test_docs_configuration_lists_every_field_with_its_default():
    text = (REPO / "docs" / "configuration.md").read_text()
    for cls in (AsyncTrainingConfig, RolloutConfig, TinyModelConfig):
        for f in dataclasses.fields(cls):
            assert re.search(rf"^\| `{f.name}` \|", text, re.M), f"docs/configuration.md misses {cls.SECTION}.{f.name}"


def test_docs_configuration_yaml_example_is_a_valid_config():
    text = (REPO / "docs" / "configuration.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    assert blocks
    for block in blocks:
        data = yaml.safe_load(block)
        if set(data) == {"build_model"}:  # the callback's build_model: example
            assert isinstance(TinyModelConfig.resolve(data["build_model"]), TinyModelConfig)
            continue
        cfg = HybridRolloutConfig.from_dict(data)
        assert isinstance(cfg, HybridRolloutConfig)


def test_jsonargparse_shows_the_attribute_docstrings_in_help():
    jsonargparse = pytest.importorskip("jsonargparse")
    jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(HybridRolloutConfig, "cfg")
    assert "Lend hybrid replicas" in " ".join(parser.format_help().split())
    cfg = parser.instantiate(parser.parse_args(["--cfg.async_training.staleness_threshold=0.2"])).cfg
    assert cfg.async_training.staleness_threshold == 0.2


def test_importing_config_does_not_import_torch():
    code = (
        "import sys, lightning_hybrid_rollout.config as c; c.HybridRolloutConfig(); assert 'torch' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_build_model_is_off_the_defaults_or_a_typed_mapping_and_a_bad_value_says_how_to_write_it():
    assert TinyModelConfig.resolve(False) is None and TinyModelConfig.resolve(None) is None
    assert TinyModelConfig.resolve(True) == TinyModelConfig()
    cfg = TinyModelConfig.resolve({"hidden": 64, "format_warmup_steps": 5})
    assert cfg is not None and (cfg.hidden, cfg.format_warmup_steps) == (64, 5)
    assert "format_warmup_steps" not in cfg.build_kwargs() and cfg.build_kwargs()["hidden"] == 64
    with pytest.raises(ConfigError, match="`build_model: true`"):
        TinyModelConfig.resolve("maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape("build_model has no key 'hiden'. Did you mean 'hidden'")):
        TinyModelConfig.resolve({"hiden": 64})
    with pytest.raises(ConfigError, match=re.escape("build_model.format_warmup_steps")):
        TinyModelConfig(format_warmup_steps=-1)


def test_the_wait_timeout_is_an_async_training_key():
    assert AsyncTrainingConfig().wait_timeout_s == 600.0
    with pytest.raises(ConfigError, match=re.escape("async_training.wait_timeout_s")):
        AsyncTrainingConfig(wait_timeout_s=0)


def test_the_deactivation_drain_budget_is_a_non_negative_rollout_key():
    assert RolloutConfig().deactivation_drain_s == 0.0  # the seed's deactivation: abort everything
    assert RolloutConfig(deactivation_drain_s=0.15).deactivation_drain_s == 0.15
    for bad in (-0.1, "0.1", float("nan")):
        with pytest.raises(ConfigError, match=re.escape("rollout.deactivation_drain_s must be a number >= 0")) as err:
            RolloutConfig(deactivation_drain_s=bad)  # type: ignore[arg-type]
        assert len(err.value.problems) == 1
