"""The policy's LoRA adapter inside a vLLM worker started with LoRA on (``rollout.lora_sync: adapter``): an
adapter-only weight update builds vLLM's ``LoRAModel`` from the received tensors in memory (no file), replaces the
engine's one adapter in place under a fixed id, and reads its LoRA slot back against what the trainer sent.

One id for every version, replaced in place (what vLLM's own ``LoRARequest(load_inplace=True)`` does), rather than a
new id per version: a keep-mode sync freezes requests that already carry their ``LoRARequest``, and their tokens
after the sync must come from the new adapter (``version_splits``); with a new id they would keep the old one. Each
sync's cache salt already keeps prefix-cache blocks of different versions apart (:mod:`.weight_updates`).
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_hybrid_rollout.rollout.weights.format import tensor_digest

__all__ = ["ADAPTER_ID", "ADAPTER_NAME", "ADAPTER_PATH", "WorkerAdapter", "adapter_request"]

ADAPTER_ID = 1
"""The adapter's ``lora_int_id`` in the engine (vLLM ids start at 1)."""
ADAPTER_NAME = "lhr-policy"
"""The adapter's ``lora_name``."""
ADAPTER_PATH = "lhr://in-memory"
"""``LoRARequest.lora_path`` must not be empty; vLLM never reads it here, because the adapter is registered in the
worker before any request names it (vLLM loads from the path only an id it does not hold)."""


def adapter_request() -> Any:
    """The ``LoRARequest`` every generation of an adapter-synced engine carries."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=ADAPTER_NAME, lora_int_id=ADAPTER_ID, lora_path=ADAPTER_PATH)


class WorkerAdapter:
    """The engine's adapter, in the worker: :meth:`install` a new version, :meth:`fingerprint` its slot.

    Args:
        config: The adapter's PEFT fields (:func:`~lightning_hybrid_rollout.training.lora.engine_lora_config`).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.installed = False

    @staticmethod
    def _managers(runner: Any) -> tuple[Any, Any]:
        worker_manager = getattr(runner, "lora_manager", None)
        if worker_manager is None:
            raise RuntimeError("the engine has no LoRA manager: it was not started with enable_lora")
        return worker_manager, worker_manager._adapter_manager

    def install(self, runner: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Build the adapter from ``tensors`` (PEFT names, CPU copies this call may keep), put it in the engine's
        one LoRA slot in place of the previous one, and read the slot back.

        Returns:
            ``{"readback_verified": n, "bad": [...], "unplaced": [...]}``: tensors whose slot equals what was sent,
            those that differ, and those vLLM put nowhere (a module it has no LoRA layer for).
        """
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        wm, am = self._managers(runner)
        fields = {k: v for k, v in self.config.items() if k != "max_lora_rank"}
        helper = PEFTHelper.from_dict({**fields, "vllm_max_position_embeddings": wm.max_position_embeddings})
        helper.validate_legal(wm.lora_config)
        model = am.model
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        mapper = mapper.get_rename_mapper() if mapper is not None else None
        # built before the old adapter goes: a tensor vLLM refuses leaves the engine serving the previous version
        lora = LoRAModel.from_lora_tensors(
            ADAPTER_ID,
            {name: t.clone() for name, t in tensors.items()},  # vLLM scales lora_B in place (optimize)
            helper,
            device="cpu",
            dtype=wm.lora_config.lora_dtype,
            model_vocab_size=wm.vocab_size,
            weights_mapper=mapper,
            skip_prefixes=getattr(model, "lora_skip_prefixes", None),
        )
        am.remove_adapter(ADAPTER_ID)
        am.add_adapter(lora)
        am.activate_adapter(ADAPTER_ID)
        self.installed = True
        return self._readback(am, tensors, helper, mapper, wm.lora_config.lora_dtype)

    def _readback(
        self, am: Any, tensors: dict[str, torch.Tensor], helper: Any, mapper: Any, dtype: torch.dtype
    ) -> dict[str, Any]:
        """Each received tensor against the engine's slot: ``lora_A`` as sent, ``lora_B`` times its scaling."""
        from vllm.lora.utils import parse_fine_tuned_lora_name

        expected: dict[tuple[str, bool], tuple[str, torch.Tensor]] = {}
        for name, t in tensors.items():
            module, is_a = parse_fine_tuned_lora_name(name, mapper)
            if is_a:
                expected[(module, True)] = (name, t.to(dtype))
            else:
                _, scaling = helper.get_rank_and_scaling(parse_fine_tuned_lora_name(name)[0])
                expected[(module, False)] = (name, t.to(dtype) * scaling)  # what LoRALayerWeights.optimize holds
        index = am.lora_index_to_id.index(ADAPTER_ID)
        verified, bad, seen = 0, [], set()
        for module_name, layer, i, sub in _slots(am):
            for is_a, stacked in ((True, layer.lora_a_stacked), (False, layer.lora_b_stacked)):
                want = expected.get((sub, is_a))
                if want is None:
                    continue
                name, exp = want
                seen.add((sub, is_a))
                got = stacked[i][index, 0, : exp.shape[0], : exp.shape[1]].detach().cpu()
                if got.shape != exp.shape or not torch.equal(got, exp):
                    bad.append(f"{name} (slot of {module_name})")
                else:
                    verified += 1
        unplaced = sorted(name for key, (name, _) in expected.items() if key not in seen)
        return {"readback_verified": verified, "bad": bad, "unplaced": unplaced}

    def fingerprint(self, runner: Any) -> dict[str, str]:
        """Digests of the adapter's slot in every LoRA layer (empty before the first :meth:`install`)."""
        if not self.installed:
            return {}
        _, am = self._managers(runner)
        if ADAPTER_ID not in am.lora_index_to_id:
            return {"lora_slot": "missing"}
        index = am.lora_index_to_id.index(ADAPTER_ID)
        out = {}
        for module_name, layer, i, _ in _slots(am):
            for which, stacked in (("lora_a", layer.lora_a_stacked), ("lora_b", layer.lora_b_stacked)):
                key = f"{module_name}.{which}.{i}"
                out[key] = tensor_digest(key, stacked[i][index].detach().cpu())
        return out


def _slots(am: Any) -> list[tuple[str, Any, int, str]]:
    """``(module name, LoRA layer, slice index, the sub-module the slice holds)`` of every LoRA linear layer (a
    packed ``qkv_proj`` has one slice per ``q_proj`` / ``k_proj`` / ``v_proj``)."""
    packed = dict(getattr(am, "packed_modules_mapping", {}) or {})
    out = []
    for module_name, layer in am.modules.items():
        if not hasattr(layer, "lora_a_stacked"):
            continue
        prefix, _, leaf = module_name.rpartition(".")
        parts = packed.get(leaf, [leaf])
        if len(parts) != len(layer.lora_a_stacked):
            continue  # a layout this read-back does not know: its tensors are reported unplaced
        for i, part in enumerate(parts):
            out.append((module_name, layer, i, f"{prefix}.{part}" if prefix else part))
    return out
