"""The trainer ranks' side of a hybrid run: each step's wall times, and what every rank does at a sync boundary.

:class:`StepTimes` measures one optimizer step on the trainer's clock (``docs/metrics.md``: ``alloc_i`` and the
step's whole time). :class:`TrainerSide` owns the strategy's offload/onload (with their last durations), the
full-weight gather into the cycle's weights, the broadcast from rank 0 and the fit's
:class:`~lightning_hybrid_rollout.lightning.rank_protocol.BoundaryProtocol`; it is the hybrid pool's
:class:`~lightning_hybrid_rollout.lightning.hybrid_pool.TrainerLink` (a wake asks it for the devices, a hybrid
sync for the weights and their version). :class:`~lightning_hybrid_rollout.lightning.callback.HybridRolloutCallback`
calls both from its hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from lightning_hybrid_rollout.lightning.lora import adapter_groups, merged_state_dict
from lightning_hybrid_rollout.lightning.rank_protocol import BoundaryProtocol

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

__all__ = ["StepTimes", "TrainerSide"]


class StepTimes:
    """One optimizer step's wall times on the trainer (``docs/metrics.md``).

    A step's times run from the previous step's end inside a cycle (what happens between two steps, e.g. a
    checkpoint or validation, is the trainer's turn too), from the step's hook at a cycle's start (and at the first
    step of a fit, resumed mid-cycle or not). At a cycle's first step, ``allocated_s`` runs from asking for the batch
    and ``step_s`` from the hook, the deactivation included.

    Args:
        clock: The clock every reading comes from (the callback's).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._begin = self._alloc_start = self._last_end = 0.0
        self._fresh = True
        #: When the step's training began (after the deactivation and the onload).
        self.start = 0.0
        #: Seconds the step waited for its batch (set by the batch source).
        self.fetch_s = 0.0

    def begin(self, cycle_start: bool) -> None:
        """At the step's hook, before the deactivation of a cycle's start."""
        self._fresh = cycle_start or not self._last_end
        self._begin = self._clock() if self._fresh else self._last_end

    def start_training(self) -> None:
        """At the end of the step's hook: the batch is asked for from now on."""
        self.start = self._clock()
        self._alloc_start = self.start if self._fresh else self._last_end
        self.fetch_s = 0.0

    def end(self) -> tuple[float, float]:
        """At the step's very end (a cycle's last step: after the sync): ``(allocated_s, step_s)``."""
        now = self._clock()
        self._last_end = now
        return now - self._alloc_start, now - self._begin


class TrainerSide:
    """This rank's part in every sync boundary; the hybrid pool's ``TrainerLink``.

    Args:
        call_log: Where ``"offload"`` and ``"onload"`` are appended (the callback's ``call_log``).
        weight_version: The current parameter version (the callback's).
    """

    def __init__(self, call_log: list[str], weight_version: Callable[[], int]) -> None:
        self._call_log = call_log
        self._weight_version = weight_version
        self._protocol: BoundaryProtocol | None = None
        #: The cycle's full weights on rank 0 (gathered at the cycle end, kept until the next gather: a replacement
        #: replica takes them mid-cycle; None on other ranks).
        self.weights: list[tuple[str, torch.Tensor]] | None = None
        #: Seconds of the last offload and the last onload of this rank's training state.
        self.last_offload_s = self.last_onload_s = 0.0
        #: Gather only the LoRA adapter's tensors (``rollout.lora_sync: adapter``; set by the callback's setup).
        self.adapter_only = False

    def start_fit(self, trainer: Trainer) -> BoundaryProtocol:
        """At ``on_train_start`` (every rank): the fit's rank protocol, over this trainer's strategy."""
        self._protocol = BoundaryProtocol(
            broadcast=lambda message: self.broadcast(trainer, message),
            offload=lambda: self.offload(trainer),
            barrier=lambda: trainer.strategy.barrier("lhr_offloaded"),
        )
        return self._protocol

    @property
    def protocol(self) -> BoundaryProtocol:
        """The fit's rank protocol (built by :meth:`start_fit`)."""
        if self._protocol is None:
            raise RuntimeError("the rank protocol is built in on_train_start; a sync boundary came before it")
        return self._protocol

    @staticmethod
    def broadcast(trainer: Trainer, msg: str) -> str:
        """``msg`` from rank 0 to every rank (on one rank, ``msg`` itself)."""
        if trainer.world_size <= 1:
            return msg
        return trainer.strategy.broadcast(msg, src=0)

    def offload(self, trainer: Trainer) -> None:
        """Offload this rank's training state (a no-op if the strategy cannot or already did)."""
        strategy = trainer.strategy
        if hasattr(strategy, "offload_training_state") and not getattr(strategy, "is_offloaded", False):
            self.last_offload_s = strategy.offload_training_state()
            self._call_log.append("offload")

    def onload(self, trainer: Trainer) -> None:
        """Bring this rank's training state back (a no-op unless it is offloaded)."""
        strategy = trainer.strategy
        if hasattr(strategy, "onload_training_state") and getattr(strategy, "is_offloaded", False):
            self.last_onload_s = strategy.onload_training_state()
            self._call_log.append("onload")

    def gather_weights(self, trainer: Trainer) -> None:
        """Full, unsharded weights of the policy model (a LoRA policy's adapter alone with :attr:`adapter_only`) into
        :attr:`weights` on rank 0 (collective: every rank)."""
        strategy = trainer.strategy
        self.weights = None  # the previous cycle's (kept for a replacement replica): released before the gather
        items: list[tuple[str, torch.Tensor]] = []
        if hasattr(strategy, "iter_full_weights"):
            # weights.format.DEFAULT_BUCKET_BYTES; the adapter alone with rollout.lora_sync: adapter
            for bucket in strategy.iter_full_weights(rank_zero_only=True, adapter_only=self.adapter_only):
                items.extend(bucket)
        else:
            model = getattr(trainer.lightning_module, "policy_model", trainer.lightning_module)
            if self.adapter_only:
                items = [
                    (g.name, t.detach().to("cpu").clone())
                    for g in adapter_groups(model, model.state_dict().items())
                    for _, t in g.parts
                ]
            else:
                items = list(merged_state_dict(model).items())  # a LoRA policy's merged weights (lightning/lora.py)
        self.weights = items if trainer.is_global_zero else None

    # ------------------------------------------------------------------------- TrainerLink (the hybrid pool's)

    def need_devices(self) -> None:
        """Right before the hybrid engines wake (rank 0): every rank offloads first."""
        self.protocol.need_devices()

    def cycle_weights(self) -> list[tuple[str, torch.Tensor]]:
        return self.weights or []

    def weight_version(self) -> int:
        return self._weight_version()
