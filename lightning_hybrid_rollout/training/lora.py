"""LoRA for the policy model: PEFT's ``LoraConfig`` checked up front, the adapter injected in place, the merged view.

The adapter's layers go into the Hugging Face model itself (PEFT's ``inject_adapter_in_model``: the model keeps its
class and ``forward``), only the adapter trains, and the weight sync streams the merged weights
``W + (B @ A) * scaling`` under the base model's names, computed per tensor from copies (docs/lora.md).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lightning_hybrid_rollout.did_you_mean import did_you_mean
from lightning_hybrid_rollout.errors import ConfigError

if TYPE_CHECKING:
    from peft import LoraConfig

__all__ = [
    "VLLM_LORA_RANKS",
    "WeightGroup",
    "adapter_groups",
    "adapter_state_dict",
    "check_adapter_sync",
    "check_lora_targets",
    "engine_lora_config",
    "inject_lora",
    "is_lora_model",
    "lora_config_from",
    "merged_state_dict",
    "save_adapter",
    "weight_groups",
]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's allowed ``max_lora_rank`` values (``vllm.config.lora.MaxLoRARanks``): an adapter above the last one cannot
be served by vLLM's LoRA support, which the adapter-only weight sync will use."""

_ADAPTER = "default"
_LORA_SEGMENTS = (".lora_A.", ".lora_B.")
_UNSUPPORTED = (
    "use_dora",
    "lora_bias",
    "modules_to_save",
    "target_parameters",
    "trainable_token_indices",
    "alora_invocation_tokens",
    "use_qalora",
    "use_bdlora",
    "arrow_config",
    "layer_replication",
    "megatron_config",
    "velora_config",
    "monteclora_config",
    "kasa_config",
)
"""LoraConfig fields whose non-default values change what a merge is (the sync merges plain LoRA only)."""


def lora_config_from(options: Mapping[str, Any], key: str = "peft") -> LoraConfig:
    """PEFT's ``LoraConfig`` from the module's ``peft`` mapping, or one :class:`ConfigError` line per problem.

    Refused: unknown fields, a rank (``r`` or a ``rank_pattern`` value) above vLLM's largest LoRA rank, fields this
    library cannot merge yet (``use_dora``, ``modules_to_save``, ...), and whatever ``LoraConfig`` itself refuses.

    Args:
        options: ``LoraConfig`` field names to values (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``...).
        key: Key path of ``options`` in messages.
    """
    from peft import LoraConfig

    if not isinstance(options, Mapping):
        raise ConfigError(f"{key} must be a mapping of LoraConfig fields (r, lora_alpha, ...), got {options!r}.")
    fields = {f.name: f for f in dataclasses.fields(LoraConfig)}
    problems = []
    for name in options:
        if name not in fields:
            hint = did_you_mean(name, fields, otherwise=" See peft.LoraConfig for the field names.")
            problems.append(f"{key}.{name} is not a LoraConfig field.{hint}")
    for name in _UNSUPPORTED:
        if name in options and options[name] not in (None, False, [], {}):
            problems.append(
                f"{key}.{name}={options[name]!r} is not supported: the weight sync merges plain LoRA "
                "(W + B @ A * scaling) only; remove it."
            )
    ranks = {"r": options.get("r", fields["r"].default)}
    ranks.update({f"rank_pattern[{k!r}]": v for k, v in (options.get("rank_pattern") or {}).items()})
    for where, rank in ranks.items():
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            problems.append(f"{key}.{where}={rank!r} must be a positive integer (the adapter's rank).")
        elif rank > VLLM_LORA_RANKS[-1]:
            problems.append(
                f"{key}.{where}={rank} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]} (max_lora_rank is one "
                f"of {VLLM_LORA_RANKS}): use a rank <= {VLLM_LORA_RANKS[-1]}."
            )
    if problems:
        raise ConfigError(problems)
    try:
        return LoraConfig(**dict(options))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key}: LoraConfig refused it: {' '.join(str(err).split())}") from None


def inject_lora(model: nn.Module, config: LoraConfig, key: str = "peft.target_modules") -> nn.Module:
    """Inject the adapter's layers into ``model`` in place and freeze everything else.

    Args:
        model: The Hugging Face causal LM (on any device, ``meta`` included).
        config: The adapter (:func:`lora_config_from`).
        key: Key path of ``target_modules`` in messages.

    Returns:
        ``model`` itself, with LoRA layers; only their ``lora_A`` / ``lora_B`` (and the biases ``config.bias``
        names) require grad.
    """
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
    try:
        model = inject_adapter_in_model(dataclasses.replace(config), model, adapter_name=_ADAPTER)
    except ValueError as err:
        if "not found in the base model" not in str(err):
            raise ConfigError(f"peft: PEFT refused it: {' '.join(str(err).split())}") from None
        targets = config.target_modules
        targets = sorted(targets) if isinstance(targets, (set, frozenset)) else targets  # LoraConfig's set
        raise ConfigError(
            f"{key}={targets!r} matches no module of {type(model).__name__}: name some of its linear layers {linear}."
        ) from None
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and type(module) is not LoraLinear:
            raise ConfigError(
                f"{key} matched {name} ({type(module.get_base_layer()).__name__}), but only nn.Linear layers can "
                f"be merged for the weight sync: name linear layers only, e.g. {linear}."
            )
    bias_trains = {"all": ".bias", "lora_only": ".base_layer.bias"}.get(str(config.bias))
    for name, param in model.named_parameters():
        param.requires_grad_(_is_lora_name(name) or (bias_trains is not None and name.endswith(bias_trains)))
    return model


def check_lora_targets(config: LoraConfig, model_path: str | os.PathLike[str]) -> None:
    """Raise the one-line :class:`ConfigError` of :func:`inject_lora` for the model at ``model_path``, before any
    engine starts: the model is built from its ``config.json`` on the ``meta`` device (no weights are read).

    Args:
        config: The adapter.
        model_path: The Hugging Face model directory.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_path)))
    inject_lora(model, config)


def is_lora_model(model: nn.Module) -> bool:
    """Whether ``model`` holds LoRA layers (injected by :func:`inject_lora` or by PEFT)."""
    return any(_is_lora_name(name) for name, _ in model.named_parameters())


def _is_lora_name(name: str) -> bool:
    return any(segment in name for segment in _LORA_SEGMENTS)


@dataclass(frozen=True)
class _Merge:
    scaling: float
    fan_in_fan_out: bool


@dataclass
class WeightGroup:
    """One tensor of the merged model and the state-dict entries it is computed from.

    Attributes:
        name: The base model's name (``...q_proj.weight``).
        parts: ``(name, tensor)`` entries: the one tensor itself, or a LoRA layer's base weight, ``lora_A``,
            ``lora_B``.
        merge: How to merge the parts (None: the one part as it is).
    """

    name: str
    parts: list[tuple[str, Tensor]]
    merge: _Merge | None = None

    def combine(self, tensors: list[Tensor]) -> Tensor:
        """The merged tensor from the full values of :attr:`parts` (in order): ``W + transpose(B @ A) * scaling``,
        as PEFT's merge computes it (in float32 for half-precision weights on the CPU)."""
        if self.merge is None:
            return tensors[0]
        weight, lora_a, lora_b = tensors
        dtype = lora_b.dtype
        upcast = lora_b.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
        if upcast:
            lora_a, lora_b = lora_a.float(), lora_b.float()
        delta = lora_b @ lora_a
        if self.merge.fan_in_fan_out:
            delta = delta.T
        delta = delta * self.merge.scaling
        return weight + delta.to(weight.dtype)


def weight_groups(
    model: nn.Module, entries: Iterable[tuple[str, Tensor]], clean: Callable[[str], str] = str
) -> list[WeightGroup]:
    """The merged model's tensors, in ``entries`` order, each with the entries it is computed from.

    Args:
        model: The policy model (its LoRA layers give the scaling); a model without LoRA gives one group per entry.
        entries: Its state dict's ``(name, tensor)`` pairs, their names passed through ``clean``.
        clean: What was done to the entries' names (e.g. wrapper segments removed); done to the layers' names too.

    Returns:
        One :class:`WeightGroup` per tensor of the base model, named as the base model names it.
    """
    entries = list(entries)
    layers = _lora_layers(model, clean)
    if not layers:
        return [WeightGroup(name, [(name, tensor)]) for name, tensor in entries]
    by_name = dict(entries)
    groups = []
    for name, tensor in entries:
        if _is_lora_name(name):
            continue  # part of its layer's merged weight
        prefix, _, leaf = name.rpartition(".base_layer.")
        layer = layers.get(prefix) if prefix else None
        if layer is None:
            groups.append(WeightGroup(name, [(name, tensor)]))
            continue
        out = f"{prefix}.{leaf}"
        if leaf != "weight":
            groups.append(WeightGroup(out, [(name, tensor)]))  # the base bias: not changed by the adapter
            continue
        parts = [(name, tensor)]
        for which in ("lora_A", "lora_B"):
            part = f"{prefix}.{which}.{_ADAPTER}.weight"
            if part not in by_name:
                raise RuntimeError(f"LoRA layer {prefix} has no {part} in the state dict; cannot merge it")
            parts.append((part, by_name[part]))
        scaling, fan = layer
        groups.append(WeightGroup(out, parts, _Merge(scaling, fan)))
    return groups


def _lora_layers(model: nn.Module, clean: Callable[[str], str]) -> dict[str, tuple[float, bool]]:
    """Each LoRA layer's module name (through ``clean``) -> ``(scaling, fan_in_fan_out)``."""
    if not is_lora_model(model):
        return {}
    from peft.tuners.lora import LoraLayer

    return {
        clean(name + ".")[:-1]: (float(module.scaling[_ADAPTER]), bool(getattr(module, "fan_in_fan_out", False)))
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and _ADAPTER in module.lora_A
    }


def adapter_groups(
    model: nn.Module, entries: Iterable[tuple[str, Tensor]], clean: Callable[[str], str] = str
) -> list[WeightGroup]:
    """The adapter's tensors only, in ``entries`` order, each under PEFT's saved name
    (``base_model.model.<module>.lora_A.weight``: what vLLM's ``LoRAModel.from_lora_tensors`` parses).

    Args:
        model: The policy model with its LoRA layers.
        entries: Its state dict's ``(name, tensor)`` pairs, their names passed through ``clean``.
        clean: What was done to the entries' names (kept for the signature of :func:`weight_groups`).

    Raises:
        RuntimeError: ``model`` has no LoRA layers (an adapter-only sync has nothing to send).
    """
    if not is_lora_model(model):
        raise RuntimeError("an adapter-only weight sync needs a LoRA policy (GRPOModule(peft=...)); this one has none")
    groups = []
    for name, tensor in entries:
        if _is_lora_name(name):
            peft_name = name.replace(f".lora_A.{_ADAPTER}.", ".lora_A.").replace(f".lora_B.{_ADAPTER}.", ".lora_B.")
            groups.append(WeightGroup(f"base_model.model.{peft_name}", [(name, tensor)]))
    return groups


def engine_lora_config(config: LoraConfig) -> dict[str, Any]:
    """What a vLLM engine needs of the adapter to build it from tensors (vLLM's ``PEFTHelper`` fields), plain
    JSON-able values: ``r``, ``lora_alpha``, ``target_modules``, ``use_rslora``, ``rank_pattern``,
    ``alpha_pattern``, ``bias``; and ``max_lora_rank``: the smallest of :data:`VLLM_LORA_RANKS` that holds it."""
    targets = config.target_modules
    targets = sorted(targets) if isinstance(targets, (set, frozenset, list, tuple)) else (targets or [])
    rank = max([int(config.r), *(int(v) for v in (config.rank_pattern or {}).values())])
    return {
        "r": int(config.r),
        "lora_alpha": float(config.lora_alpha),
        "target_modules": targets,
        "use_rslora": bool(config.use_rslora),
        "rank_pattern": dict(config.rank_pattern or {}),
        "alpha_pattern": dict(config.alpha_pattern or {}),
        "bias": str(config.bias),
        "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= rank),
    }


def check_adapter_sync(config: LoraConfig, tensor_parallel_size: int = 1, key: str = "rollout.lora_sync") -> None:
    """One :class:`ConfigError` line if the adapter cannot be sent alone to vLLM (``rollout.lora_sync: adapter``):
    vLLM's LoRA has no adapter biases, so an adapter that trains biases (``bias: all`` / ``lora_only``) must be
    merged; and each engine's LoRA slots are read back whole, which holds for unsharded engines only."""
    if tensor_parallel_size != 1:
        raise ConfigError(
            f"{key}='adapter' reads every engine's LoRA slots back whole, which this version does for "
            f"rollout.tensor_parallel_size 1 only (got {tensor_parallel_size}). Use rollout.lora_sync: merged."
        )
    if str(config.bias) != "none":
        raise ConfigError(
            f"{key}='adapter' cannot send trained biases (peft.bias={config.bias!r}): vLLM's LoRA has no adapter "
            "bias. Use peft.bias: none, or rollout.lora_sync: merged."
        )


def check_lora_sync(
    config: LoraConfig | None, model_path: str | os.PathLike[str], lora_sync: str, tensor_parallel_size: int = 1
) -> dict[str, Any] | None:
    """A LoRA policy's checks before anything starts: its ``target_modules`` against the model and, for adapter-only
    syncs (``rollout.lora_sync: adapter``), what the engines need; returns the engines' LoRA settings (None: no LoRA,
    or merged syncs).

    Args:
        config: The policy's LoRA config (None: full fine-tuning).
        model_path: The model's directory.
        lora_sync: ``rollout.lora_sync`` (``adapter`` or ``merged``).
        tensor_parallel_size: The engines' tensor-parallel size.
    """
    if config is None:
        return None
    check_lora_targets(config, model_path)
    if lora_sync != "adapter":
        return None
    check_adapter_sync(config, tensor_parallel_size)
    return engine_lora_config(config)


def merged_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The merged model's state dict (detached CPU copies, base names); the model is not changed.

    Args:
        model: The policy model, un-sharded (a model without LoRA gives its own state dict).
    """
    out = {}
    for group in weight_groups(model, model.state_dict().items()):
        out[group.name] = group.combine([t.detach().to("cpu") for _, t in group.parts]).clone()
    return out


def adapter_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The adapter's tensors as PEFT saves them (``base_model.model.<name>.lora_A.weight``: what
    ``PeftModel.from_pretrained`` loads), detached CPU copies."""
    from peft import get_peft_model_state_dict

    return {
        f"base_model.model.{k}": v.detach().to("cpu").contiguous()
        for k, v in get_peft_model_state_dict(model, adapter_name=_ADAPTER).items()
    }


def save_adapter(model: nn.Module, config: LoraConfig, out_dir: str | os.PathLike[str]) -> Path:
    """Write a PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``) of ``model``.

    Args:
        model: The policy model with its LoRA layers, un-sharded.
        config: The adapter's config.
        out_dir: The directory (created).
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = dataclasses.replace(config, inference_mode=True)
    config.base_model_name_or_path = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    config.save_pretrained(str(out))
    save_file(adapter_state_dict(model), str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out
