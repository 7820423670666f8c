"""A test-only Lightning callback for ``lhr fit`` runs: records every context the policy's
``should_activate_after_step`` saw, its ``forecast`` when it has one, and its state after each update.

Named in a fit's YAML (``class_path: _context_recorder.ContextRecorder``, with ``tests/lightning`` on
``PYTHONPATH``); on rank 0 it writes the records as JSON to ``out`` when the fit ends.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback


class ContextRecorder(Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self.seen: list[dict[str, Any]] = []
        self._wrapped = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # before the callback's own on_fit_start, which takes the start decision (step 0)
        if trainer.is_global_zero and not self._wrapped:
            cb = next(c for c in trainer.callbacks if isinstance(c, HybridRolloutCallback))
            self._wrap(cb)
            self._wrapped = True

    def _wrap(self, cb: HybridRolloutCallback) -> None:
        """Wrap the policy (rank 0's object, the controller's too) to record what it was given."""
        policy, seen = cb.policy, self.seen
        decide, update = policy.should_activate_after_step, policy.update_after_step

        def should_activate_after_step(global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
            forecast = policy.forecast(ctx) if hasattr(policy, "forecast") else None
            seen.append(
                {
                    "step": global_steps,
                    "type": type(ctx).__name__,
                    "ctx": dataclasses.asdict(ctx),
                    "forecast": dataclasses.asdict(forecast) if forecast is not None else None,
                }
            )
            return decide(global_steps, is_hybrid_active, ctx)

        def update_after_step(global_steps: int, ctx: Any) -> None:
            update(global_steps, ctx)
            seen[-1]["state_after"] = policy.state_dict()

        policy.should_activate_after_step = should_activate_after_step
        policy.update_after_step = update_after_step

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            Path(self.out).write_text(json.dumps(self.seen, default=str))
