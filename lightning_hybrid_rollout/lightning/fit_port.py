"""LightningFit: the run's :class:`~lightning_hybrid_rollout.run.hybrid_run.FitPort` over Lightning's ``Trainer``
(world size, SIGTERM, checkpoints, onload, the rank protocol, the cycle's weights, rank-zero console lines)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_hybrid_rollout.lightning.trainer_side import TrainerSide
from lightning_hybrid_rollout.run.rank_protocol import BoundaryProtocol

log = logging.getLogger(__name__)

__all__ = ["LightningFit"]


class LightningFit:
    """The run's ``FitPort`` over one fit's ``Trainer`` and this rank's :class:`TrainerSide`."""

    def __init__(self, trainer: Trainer, side: TrainerSide) -> None:
        self._trainer, self._side = trainer, side

    @property
    def world_size(self) -> int:
        return self._trainer.world_size

    @property
    def protocol(self) -> BoundaryProtocol:
        return self._side.protocol

    @property
    def weights(self) -> list[tuple[str, Any]] | None:
        return self._side.weights

    def check_interrupted(self) -> None:
        if self._trainer.received_sigterm:
            raise SIGTERMException()  # Lightning checks only between steps

    def onload(self) -> None:
        self._side.onload(self._trainer)

    def info(self, message: str) -> None:
        rank_zero_info(message)

    def warn(self, message: str) -> None:
        rank_zero_warn(message)

    def save_checkpoint(self, reason: str) -> None:
        """A checkpoint now, when the fit checkpoints (a ``ModelCheckpoint``), next to its others; the rollouter's
        unfinished groups and buffered samples go in it like at any checkpoint, so a resume loses nothing."""
        trainer = self._trainer
        ckpt = trainer.checkpoint_callback
        if ckpt is None or trainer.world_size > 1:  # several ranks: they are not all here to save together
            if ckpt is not None:
                log.warning(
                    "[lhr] %s: no checkpoint saved (%d ranks); resume from the last one", reason, trainer.world_size
                )
            return
        dirpath = getattr(ckpt, "dirpath", None) or str(Path(trainer.default_root_dir) / "checkpoints")
        path = Path(dirpath) / f"{reason}-step={trainer.global_step}.ckpt"
        try:
            trainer.save_checkpoint(path)
        except Exception as err:  # the fit is ending anyway: say so, do not hide the original error
            log.error("[lhr] %s: saving %s failed: %r", reason, path, err)
            return
        rank_zero_info(f"[lhr] {reason}: checkpoint saved to {path} (resume with ckpt_path)")
