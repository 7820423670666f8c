"""Which held-out validation a run gets: :func:`attach_validation` gives the data module an agentic run's
:class:`~.episode_validation.EpisodeValidationSet` (whole greedy episodes) or any other run's
:class:`~.validation.ValidationSet` (answers scored by the reward functions), as its ``val_*`` settings say.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lightning_hybrid_rollout.validation.answers import DEFAULT_VAL_SEED, ValidationSet
from lightning_hybrid_rollout.validation.episodes import EpisodeValidationSet

if TYPE_CHECKING:
    from lightning_hybrid_rollout.run.workload import Workload

__all__ = ["attach_validation"]

log = logging.getLogger(__name__)


def attach_validation(
    workload: Workload, datamodule: Any, *, max_new_tokens: int, during_fit: bool
) -> ValidationSet | None:
    """Attach the run's held-out prompts to ``datamodule``, answered and scored as its ``val_*`` settings say.

    An agentic run (``workload.episodes``: tools or an environment) gets an
    :class:`~.episode_validation.EpisodeValidationSet` (whole greedy episodes, seeds from ``val_seed``; a run scored
    by its environment alone included, whose held-out episodes are ``val_prompts`` resets of its environment); any
    other run a :class:`ValidationSet`.

    Nothing is attached to a data module without ``attach_validation``, a single-turn run without a reward
    function, one with its own ``val_task``, a source without held-out prompts, or, during a fit, a source whose
    held-out prompts the user did not ask for (only ``dataset.val_path`` / ``val_split`` validate during a fit;
    ``lhr validate`` always does).

    Args:
        workload: The run's workload.
        datamodule: The trainer's data module (a :class:`~lightning_hybrid_rollout.lightning.data.RolloutDataModule`).
        max_new_tokens: The run's ``rollout.response_length``.
        during_fit: Whether the stage is ``fit`` (else ``validate``).

    Returns:
        The attached set (the caller closes it), or ``None``.
    """
    episodes = getattr(workload, "episodes", None)
    if not hasattr(datamodule, "attach_validation") or (workload.runner is None and episodes is None):
        return None  # no data module to attach to, or nothing to score held-out answers with
    hp = getattr(datamodule, "hparams", {})
    if hp.get("val_task") is not None:
        return None  # the data module's own toy validation
    cfg = getattr(workload.source, "config", None)
    if during_fit and not (getattr(cfg, "val_path", None) or getattr(cfg, "val_split", None)):
        return None
    settings: dict[str, Any] = {
        "n": int(hp.get("val_n", 1)),
        "temperature": hp.get("val_temperature"),
        "pass_threshold": float(hp.get("val_pass_threshold", 1.0)),
        "batch_size": int(hp.get("val_batch_size", 64)),
        "limit": int(hp.get("val_prompts", 64)),
    }
    if episodes is not None:
        validation: ValidationSet = EpisodeValidationSet.from_workload(
            workload, seed=int(hp.get("val_seed", DEFAULT_VAL_SEED)), **settings
        )
    else:
        validation = ValidationSet.from_workload(workload, max_new_tokens=max_new_tokens, **settings)
    if not validation.records:
        validation.close()
        return None
    datamodule.attach_validation(validation)
    trainer = getattr(datamodule, "trainer", None)
    if not during_fit and getattr(trainer, "limit_val_batches", None) == 0:
        log.warning(
            "trainer.limit_val_batches is 0: none of the %d held-out prompts is validated; pass "
            "--trainer.limit_val_batches=1.0",
            len(validation.records),
        )
    return validation
