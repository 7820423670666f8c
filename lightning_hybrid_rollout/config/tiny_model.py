"""``build_model``: :class:`TinyModelConfig`, the tiny CPU model built where ``rollout.model_path`` holds none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_hybrid_rollout.config.base import ConfigBase
from lightning_hybrid_rollout.config.fields import boolean, integer, real
from lightning_hybrid_rollout.errors import ConfigError

# --------------------------------------------------------------------------------------------------------------
# build_model (the CPU quickstart's tiny model)
# --------------------------------------------------------------------------------------------------------------

_OPTIONAL = "Use a positive integer, or leave it out for the default."


@dataclass
class TinyModelConfig(ConfigBase):
    """The tiny random model the callback builds at ``rollout.model_path`` when it holds none (``build_model:``).

    Built only when the directory holds no model, and only inside the run's directory (``docs/security.md``); a
    random float32 ``LlamaForCausalLM`` with a character-level tokenizer
    (:func:`~lightning_hybrid_rollout.models.tiny_model.build_tiny_model`). ``build_model: true`` means these
    defaults.
    """

    SECTION: ClassVar[str] = "build_model"

    hidden: int = integer(128, at_least=1, fix="Use a small positive size, e.g. 128.")
    """Hidden size of the random model."""

    layers: int = integer(2, at_least=1, fix="Use a small positive size, e.g. 128.")
    """Decoder layers of the random model."""

    seed: int = integer(0, at_least=0, fix="Use a non-negative integer.")
    """Seed of the random initialisation (a model built twice with the same keys is the same model)."""

    heads: int | None = integer(None, at_least=1, nullable=True, fix=_OPTIONAL)
    """Attention heads (None: ``hidden // 32``, at least 1: head dim 32; vLLM's CPU attention needs a head dim in
    {32, 64, 80, 96, 112, 128, ...})."""

    kv_heads: int | None = integer(None, at_least=1, nullable=True, fix=_OPTIONAL)
    """Key/value heads for grouped-query attention (None: as many as ``heads``)."""

    intermediate: int | None = integer(None, at_least=1, nullable=True, fix=_OPTIONAL)
    """MLP width (None: ``4 * hidden``)."""

    vocab_size: int = integer(128, at_least=81, fix="The character-level tokenizer needs at least 81 ids: use 128.")
    """Vocabulary size of the character-level tokenizer (>= 81)."""

    max_position_embeddings: int = integer(512, at_least=1, fix="Use a small positive size, e.g. 128.")
    """Longest sequence the model accepts (prompt + response)."""

    tie_word_embeddings: bool = boolean(True)
    """Share the input embedding and the output head."""

    init_scale: float = real(1.0, above=0.0, fix="Use a positive scale such as 1.0.")
    """Scale of the random initialisation."""

    add_bos: bool = boolean(True)
    """The tokenizer prepends a begin-of-sequence token."""

    format_warmup_steps: int = integer(0, at_least=0, fix="Use 0 to disable it, or e.g. 100.")
    """Supervised warm-up steps on the task's answer *shape* (random answers) right after the build, so a
    random-init model learns the format before RL (design/notes.md §7). 0 disables it."""

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
