"""``build_model``: :class:`TinyModelConfig`, the tiny CPU model built where ``rollout.model_path`` holds none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_hybrid_rollout.config.base import (
    Checker,
    ConfigBase,
)
from lightning_hybrid_rollout.errors import ConfigError

# --------------------------------------------------------------------------------------------------------------
# rollout
# --------------------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------------------
# build_model (the CPU quickstart's tiny model)
# --------------------------------------------------------------------------------------------------------------


@dataclass
class TinyModelConfig(ConfigBase):
    """The tiny random model the callback builds at ``rollout.model_path`` when it holds none (``build_model:``).

    Built only when the directory holds no model, and only inside the run's directory (``docs/security.md``); a
    random float32 ``LlamaForCausalLM`` with a character-level tokenizer
    (:func:`~lightning_hybrid_rollout.models.tiny_model.build_tiny_model`). ``build_model: true`` means these
    defaults.
    """

    SECTION: ClassVar[str] = "build_model"

    hidden: int = 128
    """Hidden size of the random model."""

    layers: int = 2
    """Decoder layers of the random model."""

    seed: int = 0
    """Seed of the random initialisation (a model built twice with the same keys is the same model)."""

    heads: int | None = None
    """Attention heads (None: ``hidden // 32``, at least 1: head dim 32; vLLM's CPU attention needs a head dim in
    {32, 64, 80, 96, 112, 128, ...})."""

    kv_heads: int | None = None
    """Key/value heads for grouped-query attention (None: as many as ``heads``)."""

    intermediate: int | None = None
    """MLP width (None: ``4 * hidden``)."""

    vocab_size: int = 128
    """Vocabulary size of the character-level tokenizer (>= 81)."""

    max_position_embeddings: int = 512
    """Longest sequence the model accepts (prompt + response)."""

    tie_word_embeddings: bool = True
    """Share the input embedding and the output head."""

    init_scale: float = 1.0
    """Scale of the random initialisation."""

    add_bos: bool = True
    """The tokenizer prepends a begin-of-sequence token."""

    format_warmup_steps: int = 0
    """Supervised warm-up steps on the task's answer *shape* (random answers) right after the build, so a
    random-init model learns the format before RL (design/notes.md §7). 0 disables it."""

    def __post_init__(self) -> None:
        c = Checker(self.SECTION)
        for name in ("hidden", "layers", "max_position_embeddings"):
            c.integer(name, getattr(self, name), 1, "Use a small positive size, e.g. 128.")
        c.integer("vocab_size", self.vocab_size, 81, "The character-level tokenizer needs at least 81 ids: use 128.")
        c.integer("seed", self.seed, 0, "Use a non-negative integer.")
        for name in ("heads", "kv_heads", "intermediate"):
            if getattr(self, name) is not None:
                c.integer(name, getattr(self, name), 1, "Use a positive integer, or leave it out for the default.")
        c.boolean("tie_word_embeddings", self.tie_word_embeddings)
        c.boolean("add_bos", self.add_bos)
        c.real("init_scale", self.init_scale, "Use a positive scale such as 1.0.", low=0.0, low_open=True)
        c.integer("format_warmup_steps", self.format_warmup_steps, 0, "Use 0 to disable it, or e.g. 100.")
        c.raise_if_any()

    def build_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~lightning_hybrid_rollout.models.tiny_model.build_tiny_model`."""
        out = self.to_dict()
        out.pop("format_warmup_steps")
        return out

    @classmethod
    def resolve(cls, value: bool | TinyModelConfig | Mapping[str, Any] | None) -> TinyModelConfig | None:
        """``build_model:`` as given: True -> the defaults, False/None -> no build, a mapping -> its keys."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        raise ConfigError(
            f"build_model must be true, false or a mapping of TinyModelConfig keys, got {value!r}. Write "
            "`build_model: true` (the defaults) or e.g. `build_model: {hidden: 128, layers: 2, format_warmup_steps: "
            "100}`."
        )
