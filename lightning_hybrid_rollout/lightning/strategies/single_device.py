"""``HybridSingleDeviceStrategy`` ("hybrid_single_device"): one device, offload / onload and full-weight streaming."""

from __future__ import annotations

import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.strategies import SingleDeviceStrategy
from typing_extensions import override

from lightning_hybrid_rollout.lightning.strategies.base import HybridStrategyMixin


class HybridSingleDeviceStrategy(HybridStrategyMixin, SingleDeviceStrategy):
    """Single-device training whose state can be lent out to a hybrid rollout replica between steps.

    Args:
        device: the training device. ``None`` (the default, and what ``strategy="hybrid_single_device"`` gives)
            takes the first device the Trainer selected (``Trainer(accelerator=..., devices=...)``).
        pin_memory: offload into page-locked host memory (CUDA only).
        **kwargs: forwarded to :class:`~lightning.pytorch.strategies.SingleDeviceStrategy`.

    Example::

        >>> import lightning.pytorch as pl
        >>> import lightning_hybrid_rollout.lightning  # registers the hybrid strategies
        >>> trainer = pl.Trainer(strategy="hybrid_single_device", accelerator="cpu", devices=1, logger=False)
        >>> type(trainer.strategy).__name__
        'HybridSingleDeviceStrategy'
    """

    strategy_name = "hybrid_single_device"

    def __init__(self, device: _DEVICE | None = None, pin_memory: bool = True, **kwargs: object) -> None:
        super().__init__(device=device if device is not None else "cpu", **kwargs)  # type: ignore[arg-type]
        self._device_from_trainer = device is None
        self.pin_memory = pin_memory

    @override
    def setup_environment(self) -> None:
        if self._device_from_trainer:
            self._root_device = self._trainer_device()
        super().setup_environment()

    def _trainer_device(self) -> torch.device:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        connector = getattr(trainer, "_accelerator_connector", None)
        devices = getattr(connector, "_parallel_devices", None)
        if devices:
            return torch.device(devices[0])
        if self.accelerator is not None and type(self.accelerator).__name__ == "CUDAAccelerator":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="Single device, training state offloadable for hybrid rollout"
        )
