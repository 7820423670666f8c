"""A rich progress bar for hybrid-rollout runs: step, reward, queue size and active hybrid replicas, short labels.

Example::

    trainer = Trainer(callbacks=[HybridRolloutProgressBar(), HybridRolloutCallback(...)])

or in an ``lhr`` YAML file::

    trainer:
      callbacks:
        - class_path: lightning_hybrid_rollout.lightning.progress.HybridRolloutProgressBar
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ProgressBar, RichProgressBar
from typing_extensions import override

from lightning_hybrid_rollout import metrics as M

REWARD_METRIC = "train/reward_mean"
"""What :class:`~lightning_hybrid_rollout.lightning.module.GRPOModule` logs as the batch's mean reward."""

SAMPLES_PER_S_METRIC = "train/samples_per_s"
"""What the callback logs: samples trained per second since the fit began."""

SHORT_NAMES: dict[str, str] = {
    REWARD_METRIC: "reward",
    SAMPLES_PER_S_METRIC: "samples/s",
    M.MQ_SIZE: "queue",
    M.HYBRID_ACTIVE: "hybrid",
}
"""Logged metric name -> progress-bar label (in display order, after ``step``)."""

INTEGER_LABELS = frozenset({"step", "queue", "hybrid"})
"""Labels shown as whole numbers (the bar's float format would print ``118.000``)."""


class HybridRolloutProgressBar(RichProgressBar):
    """:class:`~lightning.pytorch.callbacks.RichProgressBar` showing ``step``, ``reward``, ``queue``, ``hybrid``.

    ``step`` is ``trainer.global_step``; the others are the last logged values of ``train/reward_mean``,
    ``dynamic_resource/mq_size`` and ``dynamic_resource/hybrid_active`` (read from ``trainer.callback_metrics``, so
    they need no ``prog_bar=True``); a metric not logged yet is left out. The long names and ``v_num`` are removed;
    any other ``prog_bar=True`` metric stays.

    Args:
        short_names: Metric name -> label mapping replacing :data:`SHORT_NAMES` (e.g. add ``{"train/kl": "kl"}``).
        **kwargs: :class:`~lightning.pytorch.callbacks.RichProgressBar` arguments (``refresh_rate``, ``leave``,
            ``theme``, ``console_kwargs``).
    """

    def __init__(self, short_names: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.short_names = dict(SHORT_NAMES if short_names is None else short_names)

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        """``Training`` (a step-bounded run: ``max_steps`` ends it, so ``Epoch 0/-2`` would say nothing), or
        Lightning's ``Epoch i/n`` when the run is bounded by epochs."""
        trainer = getattr(self, "_trainer", None)
        max_epochs = getattr(trainer, "max_epochs", None) if trainer is not None else None
        if max_epochs is None or max_epochs < 0:
            return "Training"
        return super()._get_train_description(current_epoch)

    @override
    def get_metrics(
        self, trainer: Trainer, pl_module: LightningModule
    ) -> dict[str, int | str | float | dict[str, float]]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        for long_name in self.short_names:
            items.pop(long_name, None)
        logged = trainer.callback_metrics
        short: dict[str, Any] = {"step": trainer.global_step}
        for long_name, label in self.short_names.items():
            if long_name in logged:
                short[label] = float(logged[long_name])
        for label, value in short.items():
            short[label] = str(round(value)) if label in INTEGER_LABELS else value
        return {**short, **items}


def add_default_progress_bar(
    callbacks: Callback | Iterable[Callback] | None, enable_progress_bar: bool | None = True
) -> list[Callback]:
    """``callbacks`` plus a :class:`HybridRolloutProgressBar`, unless they hold a progress bar or it is disabled.

    For a CLI default: Lightning refuses two progress bars and a progress bar with ``enable_progress_bar=False``.

    Args:
        callbacks: The Trainer's ``callbacks`` argument.
        enable_progress_bar: The Trainer's ``enable_progress_bar`` argument (``None`` counts as ``True``).
    """
    if callbacks is None:
        out: list[Callback] = []
    elif isinstance(callbacks, Callback):
        out = [callbacks]
    else:
        out = list(callbacks)
    if enable_progress_bar is not False and not any(isinstance(c, ProgressBar) for c in out):
        out.append(HybridRolloutProgressBar())
    return out
