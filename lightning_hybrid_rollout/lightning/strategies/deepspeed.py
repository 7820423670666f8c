"""``HybridDeepSpeedStrategy`` ("hybrid_deepspeed", "hybrid_deepspeed_stage_{1,2,3}"): ZeRO with offload / onload.

It also runs on the CPU, lifting exactly Lightning's three CUDA-only blockers (docs/strategies.md, "DeepSpeed on the
CPU").
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from lightning.pytorch.strategies.deepspeed import remove_module_hooks
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_hybrid_rollout.lightning.strategies.base import (
    HybridStrategyMixin,
    OptimizerSlot,
    WeightBucket,
    copy_tensor_to,
)

if TYPE_CHECKING:
    import deepspeed


class HybridDeepSpeedStrategy(HybridStrategyMixin, DeepSpeedStrategy):
    """DeepSpeed ZeRO 1-3 whose training state can be offloaded between steps; also runs on the CPU.

    Offload uses DeepSpeed's ``engine.offload_states()`` / ``reload_states()``, completed by the strategy where
    DeepSpeed leaves state behind (docs/strategies.md). On ZeRO-3 stream the weights before offloading.

    Args:
        *args: forwarded to :class:`~lightning.pytorch.strategies.DeepSpeedStrategy` (``stage``, ``config``, ...).
        pin_memory: offload into page-locked host memory (CUDA only).
        **kwargs: forwarded to :class:`~lightning.pytorch.strategies.DeepSpeedStrategy`.

    Example::

        >>> import lightning.pytorch as pl
        >>> import lightning_hybrid_rollout.lightning  # registers the hybrid strategies
        >>> # skipped as a doctest only because importing DeepSpeed prints its accelerator choice to stdout
        >>> trainer = pl.Trainer(strategy="hybrid_deepspeed_stage_3", accelerator="cpu", devices=1)  # doctest: +SKIP
        >>> trainer.strategy.config["zero_optimization"]["stage"]  # doctest: +SKIP
        3
    """

    strategy_name = "hybrid_deepspeed"

    def __init__(self, *args: Any, pin_memory: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pin_memory = pin_memory
        self._zero3_flat_homes: tuple[torch.device, ...] = ()
        self._host_state_slots: tuple[tuple[dict[str, Any], str], ...] = ()

    # ------------------------------------------------------------------ running on the CPU
    @override
    def setup_environment(self) -> None:
        if not isinstance(self.accelerator, CPUAccelerator):
            super().setup_environment()  # Lightning's own check: CUDA
            return
        from deepspeed.accelerator import get_accelerator

        ds_accelerator = get_accelerator().device_name()
        if ds_accelerator != "cpu":
            raise RuntimeError(
                f"{type(self).__name__} with accelerator='cpu' needs DeepSpeed's CPU accelerator, but DeepSpeed "
                f"selected {ds_accelerator!r}; set the environment variable DS_ACCELERATOR=cpu before importing it"
            )
        DDPStrategy.setup_environment(self)  # everything DeepSpeedStrategy does except the CUDA check

    @override
    def setup_distributed(self) -> None:
        if self.root_device.type != "cpu":
            super().setup_distributed()
            return
        # DeepSpeedStrategy.setup_distributed minus `_validate_device_index_selection` (CPU devices have no index)
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _device_rank(self) -> int:
        index = self.root_device.index
        return self.local_rank if index is None else index

    @override
    def _setup_model_and_optimizer(
        self, model: nn.Module, optimizer: Optimizer | None, lr_scheduler: Any = None
    ) -> tuple[deepspeed.DeepSpeedEngine, Optimizer]:
        import deepspeed

        model_parameters = filter(lambda p: p.requires_grad, model.parameters())
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self._device_rank()),
            config=self.config,
            model=model,
            model_parameters=model_parameters,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, ds_optimizer

    @override
    def _initialize_deepspeed_inference(self, model: nn.Module) -> None:
        import deepspeed

        assert isinstance(self.config, dict)
        inference_config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1}
        for key in ("fp16", "bf16"):
            if key in self.config:
                inference_config[key] = self.config[key]
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = self.config["zero_allow_untested_optimizer"]
            inference_config["zero_optimization"] = self.config["zero_optimization"]
        remove_module_hooks(model)
        engine, _, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self._device_rank()),
            config=inference_config,
            model=model,
            optimizer=None,
            lr_scheduler=None,
            model_parameters=[],
            dist_init_required=False,
        )
        self.model = engine

    @override
    def _auto_select_batch_size(self) -> int:
        # Lightning reads `dataloader.batch_sampler.batch_size`, which is None for `DataLoader(batch_size=None)`
        # (the queue-backed RL data path): fall back to 1, DeepSpeed only uses it for throughput logging.
        try:
            return super()._auto_select_batch_size()
        except AttributeError:
            return 1

    # ------------------------------------------------------------------ offload / onload
    def _engine(self) -> deepspeed.DeepSpeedEngine:
        from deepspeed import DeepSpeedEngine

        if not isinstance(self.model, DeepSpeedEngine):
            raise RuntimeError(f"{type(self).__name__}: the DeepSpeed engine exists only once `trainer.fit` set it up")
        return self.model

    @override
    def _offload(self) -> None:
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

        engine = self._engine()
        stage = engine.zero_optimization_stage()
        if stage not in (1, 2, 3):
            raise RuntimeError(f"{type(self).__name__} offloads ZeRO stages 1-3 only, got stage {stage}")
        # DeepSpeed's reload sends *every* optimizer state tensor to the device, including those that lived on the
        # host (torch Adam's `step`): remember them, to put them back where they were after the reload
        self._host_state_slots = tuple(
            (state, key)
            for state in engine.optimizer.optimizer.state.values()
            for key, value in state.items()
            if isinstance(value, Tensor) and value.device.type == "cpu"
        )
        if stage == 3 and not _is_deepspeed_fused_adam(engine.optimizer.optimizer):
            managed = [
                OffloadStateTypeEnum.lp_params,
                OffloadStateTypeEnum.lp_grads,
                OffloadStateTypeEnum.contiguous_grad_buffer,
            ]
            engine.offload_states(include=managed, pin_memory=self.pin_memory, non_blocking=False)
            self._offload_zero3_master_and_optimizer(engine)
        else:
            # blocking: DeepSpeed frees the device copies and empties the cache right after
            engine.offload_states(pin_memory=self.pin_memory, non_blocking=False)

    @override
    def _onload(self) -> None:
        engine = self._engine()
        engine.reload_states(non_blocking=True)
        for state, key in self._host_state_slots:
            if state[key].device.type != "cpu":
                state[key] = state[key].to("cpu")
        self._host_state_slots = ()
        if self._zero3_flat_homes:
            for flat, home in zip(engine.optimizer.fp32_partitioned_groups_flat, self._zero3_flat_homes):
                flat.data = copy_tensor_to(flat.data, home)
            for slot in self._hybrid_optimizer_slots:
                slot.state[slot.key] = copy_tensor_to(slot.state[slot.key], slot.home)
            self._zero3_flat_homes = ()
            self._hybrid_optimizer_slots = ()

    def _offload_zero3_master_and_optimizer(self, engine: deepspeed.DeepSpeedEngine) -> None:
        """ZeRO-3 with a non-DeepSpeed optimizer: move the fp32 master partitions and the optimizer state."""
        root = self.root_device
        host = torch.device("cpu")
        pin = self.pin_memory and root.type == "cuda"
        zero_optimizer = engine.optimizer
        homes = []
        for flat in zero_optimizer.fp32_partitioned_groups_flat:
            homes.append(flat.device)
            # `.data` swap keeps the Parameter object the inner optimizer is keyed by
            flat.data = copy_tensor_to(flat.data, host if flat.device == root else flat.device, pin)
        self._zero3_flat_homes = tuple(homes)
        slots = []
        for state in zero_optimizer.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, Tensor):
                    slots.append(OptimizerSlot(state, key, value.device))
                    on_root = value.device == root
                    state[key] = copy_tensor_to(value, host if on_root else value.device, pin and on_root)
        self._hybrid_optimizer_slots = tuple(slots)

    # ------------------------------------------------------------------ full weights
    @override
    def _gather_bucket(self, bucket: list[tuple[str, Tensor]], materialize: bool) -> WeightBucket:
        partitioned = [t for _, t in bucket if hasattr(t, "ds_id")]
        if not partitioned:
            return super()._gather_bucket(bucket, materialize)
        if self.is_offloaded:
            raise RuntimeError(
                f"{type(self).__name__}: ZeRO-3 cannot gather full weights while the training state is offloaded; "
                "call iter_full_weights() before offload_training_state() (or after onload_training_state())"
            )
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        unique = list({id(t): t for t in partitioned}.values())
        with GatheredParameters(unique, modifier_rank=None):
            if not materialize:
                return []
            out = [(name, copy_tensor_to(t.detach(), torch.device("cpu"))) for name, t in bucket]
            self._synchronize_device(empty_cache=False)  # copies done before the gathered weights are released
        return out

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="DeepSpeed ZeRO-2, training state offloadable for hybrid rollout"
        )
        for stage in (1, 2, 3):
            strategy_registry.register(
                f"{cls.strategy_name}_stage_{stage}",
                cls,
                description=f"DeepSpeed ZeRO-{stage}, training state offloadable for hybrid rollout",
                stage=stage,
            )


def _is_deepspeed_fused_adam(optimizer: Any) -> bool:
    try:
        from deepspeed.ops.adam.fused_adam import FusedAdam
    except ImportError:  # pragma: no cover - depends on the DeepSpeed build
        return False
    return type(optimizer) is FusedAdam
