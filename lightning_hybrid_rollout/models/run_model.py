"""The run's model on disk before the fit: used as it is, or (``build_model``) the tiny CPU model built there.

Called on global rank 0 in the callback's ``setup``, after :mod:`.model_path` has checked the directory; the other
ranks wait at a barrier, then every rank loads the same directory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.config import ConfigError, RolloutConfig, TinyModelConfig

__all__ = ["ensure_run_model"]

log = logging.getLogger(__name__)


def ensure_run_model(
    rollout: RolloutConfig,
    build_model: TinyModelConfig | None,
    task: Callable[[], Any],
    announce: Callable[[str], None] = log.info,
) -> None:
    """Leave a model that is there as it is; build the tiny one where none is (if ``build_model`` allows it).

    Args:
        rollout: The rollout config (``model_path``, ``seed``).
        build_model: The tiny model to build, or None (a missing model is an error).
        task: Builds the task whose answer shape the format warm-up teaches (called only for a warm-up).
        announce: Where the build's and the warm-up's console lines go (the fit's rank-zero lines).

    Raises:
        ConfigError: No model at ``rollout.model_path`` and ``build_model`` is off.
    """
    path = Path(rollout.model_path)
    if (path / "config.json").exists():
        return
    if build_model is None:
        raise ConfigError(
            [
                f"rollout.model_path {str(path)!r} holds no model (no config.json): point it at a Hugging Face "
                "causal LM directory, or set build_model: true to build the tiny CPU model there"
            ]
        )
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    announce(f"[lhr] building a tiny model at {path}")
    build_tiny_model(path, **build_model.build_kwargs())
    if build_model.format_warmup_steps > 0:
        _format_warmup(path, task(), build_model.format_warmup_steps, rollout.seed, announce)


def _format_warmup(path: Path, task: Any, steps: int, seed: int, announce: Callable[[str], None]) -> None:
    """Supervised warm-up on the answer *shape* (random answers), saved back to ``path`` (design/notes.md §7)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_hybrid_rollout.models.format_warmup import format_warmup

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = [p.prompt for p in task.sample_prompts(512, seed=seed + 12345)]
    t0 = time.monotonic()
    losses = format_warmup(model, tokenizer, prompts, steps=steps, seed=seed)
    model.save_pretrained(path, safe_serialization=True)
    announce(
        f"[lhr] format warm-up: {steps} steps in {time.monotonic() - t0:.1f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    )
