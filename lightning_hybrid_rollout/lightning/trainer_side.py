"""The trainer ranks' side of a hybrid run: what every rank does at a sync boundary.

:class:`TrainerSide` owns the strategy's offload/onload (with their last durations), the
full-weight gather into the cycle's weights, the broadcast from rank 0 and the fit's
:class:`~lightning_hybrid_rollout.run.rank_protocol.BoundaryProtocol`; it is the hybrid pool's
:class:`~lightning_hybrid_rollout.run.hybrid_pool.TrainerLink` (a wake asks it for the devices, a hybrid
sync for the weights and their version). :class:`~lightning_hybrid_rollout.lightning.callback.HybridRolloutCallback`
calls it from its hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from lightning_hybrid_rollout.run.rank_protocol import BoundaryProtocol
from lightning_hybrid_rollout.training.lora import adapter_groups, merged_state_dict

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

__all__ = ["TrainerSide"]


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
                items = list(merged_state_dict(model).items())  # a LoRA policy's merged weights (training/lora.py)
        self.weights = items if trainer.is_global_zero else None

    # ------------------------------------------------------------------------- TrainerLink (the hybrid pool's)

    def need_devices(self) -> None:
        """Right before the hybrid engines wake (rank 0): every rank offloads first."""
        self.protocol.need_devices()

    def cycle_weights(self) -> list[tuple[str, torch.Tensor]]:
        return self.weights or []

    def weight_version(self) -> int:
        return self._weight_version()
