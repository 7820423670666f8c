"""The seconds a scenario's switches and weight syncs take (:class:`SwitchCosts`, the scenario's ``switch:``) and
what LoRA's adapter-only sync changes in them (:class:`LoraModel`, ``lora:``). Each field's rule is declared on the
field (:mod:`~lightning_hybrid_rollout.config.fields`); a bad value raises a one-line
:class:`~lightning_hybrid_rollout.errors.ScenarioError` naming ``section.field``.

Example::

    from lightning_hybrid_rollout.sim.switch_costs import LoraModel, SwitchCosts

    full = SwitchCosts(standalone_sync_s=20, hybrid_sync_s=10)
    lora = LoraModel(enabled=True, adapter_fraction=0.05, adapter_load_s=0.5).apply(full)
    assert (full.standalone_sync_s, lora.standalone_sync_s, lora.hybrid_sync_s) == (20.0, 1.5, 1.0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from lightning_hybrid_rollout.config.base import ConfigBase
from lightning_hybrid_rollout.config.fields import boolean, real
from lightning_hybrid_rollout.errors import ScenarioError

__all__ = ["LoraModel", "SwitchCosts"]

_SECONDS = "Give seconds, 0 or more (0: free)."


@dataclass
class SwitchCosts(ConfigBase):
    """Seconds each operation blocks the trainer (and, where it applies, the replicas concerned)."""

    SECTION: ClassVar[str] = "switch"
    ERROR = ScenarioError

    standalone_sync_s: float = real(15.0, at_least=0.0, fix=_SECONDS)
    """Weight sync trainer → standalone replicas (their generation is paused meanwhile)."""

    standalone_commit_s: float = real(4.0, at_least=0.0, fix=_SECONDS)
    """With a run's ``staged_standalone_sync`` only: the pause at the end of the standalone sync during which the
    replicas load the staged weights (at most ``standalone_sync_s``)."""

    hybrid_sync_s: float = real(6.0, at_least=0.0, fix=_SECONDS)
    """Weight sync trainer → hybrid replicas (``pool.sync_weights``)."""

    wake_s: float = real(8.0, at_least=0.0, fix=_SECONDS)
    """``wake_up_replicas`` (weights, then KV cache back on the devices; the trainer offloads first)."""

    sleep_s: float = real(6.0, at_least=0.0, fix=_SECONDS)
    """``sleep_replicas`` (release KV cache, offload weights; the trainer onloads after)."""

    add_s: float = real(0.2, at_least=0.0, fix=_SECONDS)
    """``add_replicas``."""

    resume_s: float = real(0.2, at_least=0.0, fix=_SECONDS)
    """``resume_generation_replicas``."""

    remove_s: float = real(0.2, at_least=0.0, fix=_SECONDS)
    """``remove_replicas``."""

    abort_s: float = real(0.5, at_least=0.0, fix=_SECONDS)
    """``abort_replicas``."""

    rebalance_s: float = real(0.5, at_least=0.0, fix=_SECONDS)
    """``rebalance_requests``."""

    resume_prefill_ratio: float = real(
        0.02, at_least=0.0, fix="Use 0 (a free re-prefill) or a ratio such as 0.02 decode tokens per prefix token."
    )
    """A request aborted with ``k`` tokens generated pays ``k × ratio`` extra decode-token equivalents when it
    resumes on another replica (re-prefill of prompt + prefix)."""

    @classmethod
    def zero(cls) -> SwitchCosts:
        """Every switch and sync free."""
        return cls(**{f.name: 0.0 for f in dataclasses.fields(cls)})


@dataclass
class LoraModel(ConfigBase):
    """LoRA training with adapter-only weight sync: what it changes in the switch and sync costs.

    The runtime's ``rollout.lora_sync: adapter`` and ``rollout.lora_keep_base`` (docs/lora.md). A sync moves only
    the adapter (``adapter_fraction`` of the full weights' bytes), so the standalone and hybrid syncs
    (``switch.standalone_sync_s``, ``standalone_commit_s``, ``hybrid_sync_s``) take ``adapter_fraction`` of their
    full-weight seconds, plus ``adapter_load_s`` (registering the adapter in the engine). With ``keep_base``, hybrid
    replicas keep their frozen base weights on the trainer's devices while asleep (LoRA training leaves them
    untouched): waking up costs only the KV-cache allocation (``kv_fraction`` of ``switch.wake_s``) and going to
    sleep only its release (``kv_fraction`` of ``switch.sleep_s``), and the base weights stay counted against the
    trainer's memory (the simulator does not model the memory itself).
    """

    SECTION: ClassVar[str] = "lora"
    ERROR = ScenarioError

    enabled: bool = boolean(False)
    """Whether the runs train a LoRA adapter (off = full-weight sync, the switch costs as given)."""

    adapter_fraction: float = real(
        0.02, at_least=0.0, at_most=1.0, fix="Use adapter bytes over full-weight bytes, e.g. 0.02 (rank 64, 7B model)."
    )
    """Adapter bytes over full-weight bytes (e.g. rank 64 on a 7B model: ~0.02)."""

    adapter_load_s: float = real(0.5, at_least=0.0, fix=_SECONDS)
    """Seconds to load a synced adapter into an engine, paid by every sync."""

    keep_base: bool = boolean(True)
    """Hybrid replicas keep their base weights while asleep (wake/sleep move no weights)."""

    kv_fraction: float = real(
        0.25, at_least=0.0, at_most=1.0, fix="Use the KV cache's share of wake_s / sleep_s, e.g. 0.25."
    )
    """The share of ``switch.wake_s`` / ``switch.sleep_s`` that is KV-cache allocation / release (what is left with
    ``keep_base``)."""

    def apply(self, switch: SwitchCosts) -> SwitchCosts:
        """The switch costs a LoRA run pays (``switch`` itself when disabled)."""
        if not self.enabled:
            return switch

        def sync(seconds: float) -> float:
            return seconds * self.adapter_fraction + self.adapter_load_s

        changes = {
            "standalone_sync_s": sync(switch.standalone_sync_s),
            "standalone_commit_s": sync(switch.standalone_commit_s),
            "hybrid_sync_s": sync(switch.hybrid_sync_s),
        }
        if self.keep_base:
            changes["wake_s"] = switch.wake_s * self.kv_fraction
            changes["sleep_s"] = switch.sleep_s * self.kv_fraction
        return dataclasses.replace(switch, **changes)
