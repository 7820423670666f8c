"""The scenario's hardware: an inference replica's decode speed and concurrency (:class:`ReplicaModel`, the
scenario's ``replica:`` and ``hybrid_replica:``) and the trainer's compute (:class:`TrainerModel`, ``trainer:``).
Each field's rule is declared on the field (:mod:`~lightning_hybrid_rollout.config.fields`); a bad value raises a
one-line :class:`~lightning_hybrid_rollout.errors.ScenarioError` naming ``section.field``.

Example::

    from lightning_hybrid_rollout.sim.hardware_models import ReplicaModel

    replica = ReplicaModel(devices=1, tokens_per_s=10, batch_slowdown=0.0, kv_cache_tokens=1000)
    assert replica.throughput(4, limit=replica.run_limit(16, context_tokens=500)) == 20.0  # 2 fit the KV cache
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from lightning_hybrid_rollout.config.base import ConfigBase
from lightning_hybrid_rollout.config.fields import integer, real
from lightning_hybrid_rollout.errors import ScenarioError

__all__ = ["ReplicaModel", "TrainerModel"]


@dataclass
class ReplicaModel(ConfigBase):
    """One inference replica: devices, concurrency cap and decode speed.

    A replica with ``n`` samples in flight decodes ``X(min(n, limit))`` tokens/s in total, shared equally by the
    ``n`` samples, with ``X(m) = m × tokens_per_s / (1 + batch_slowdown × (m − 1))``: more samples in a batch give
    more throughput but each one decodes slower (decode is memory-bandwidth bound). ``limit`` is the concurrency
    cap, lowered by the KV cache when ``kv_cache_tokens`` is set: at most ``kv_cache_tokens / context`` samples run
    at once, where ``context = prompt_tokens + 0.7 × mean length`` approximates the average context of an in-flight
    sample (long samples stay in flight longer; on average they are half decoded). Samples beyond the limit (e.g.
    aborted requests retried onto the replica) wait their turn: the throughput stays ``X(limit)``.
    """

    SECTION: ClassVar[str] = "replica"
    ERROR = ScenarioError

    devices: int = integer(4, at_least=1, fix="Give the devices of one replica (its tensor parallel size), e.g. 4.")
    """Devices one replica occupies (tensor parallel size)."""

    tokens_per_s: float = real(60.0, above=0.0, fix="Give the decode speed of one sample alone in tokens/s, e.g. 60.")
    """Decode speed of a single sample alone on the replica."""

    batch_slowdown: float = real(
        0.02, at_least=0.0, fix="Use 0 (throughput linear in concurrency) or a small slowdown such as 0.02."
    )
    """``beta`` above (0 = ideal: throughput linear in concurrency)."""

    concurrency: int | None = integer(
        None, at_least=1, nullable=True, fix="Use null (the scenario's concurrent_samples_per_replica) or e.g. 16."
    )
    """``cap``; None = the scenario's ``concurrent_samples_per_replica``."""

    kv_cache_tokens: float | None = real(
        None, above=0.0, nullable=True, fix="Use null (unlimited) or the KV cache's capacity in tokens, e.g. 200000."
    )
    """KV-cache capacity in tokens of context (None = unlimited)."""

    speed_while_training: float = real(
        1.0, above=0.0, fix="Use 1 (unaffected, as on separate GPUs) or the measured share such as 0.9."
    )
    """The fraction of its speed the replica keeps while the trainer trains (1 = unaffected, as on separate GPUs; a
    CPU host where the training shares the memory and caches measures ~0.8-0.95). The simulator applies it for the
    whole step, ``trainer.step_overhead_s`` included (a real run's overhead lies outside its ``training`` spans: a
    few ms per step on the CPU miniature). ``lhr simulate --from-run`` fits it from the standalone replicas'
    ``generated_tokens`` counters."""

    @property
    def best_speed(self) -> float:
        """The largest share of ``tokens_per_s`` the replica decodes at: ``speed_while_training`` where the trainer's
        training speeds it up (a run measured above 1), else 1. The balance bound credits every replica with it."""
        return max(1.0, self.speed_while_training)

    def run_limit(self, cap: int, context_tokens: float) -> int:
        """Samples that decode at once: ``cap``, or fewer if their KV cache (``context_tokens`` each) does not fit."""
        if self.kv_cache_tokens is None:
            return cap
        return max(1, min(cap, int(self.kv_cache_tokens // max(1.0, context_tokens))))

    def throughput(self, n: int, limit: int) -> float:
        """Total decode tokens/s of the replica with ``n`` samples in flight, at most ``limit`` decoding at once."""
        m = min(n, limit)
        if m <= 0:
            return 0.0
        return m * self.tokens_per_s / (1.0 + self.batch_slowdown * (m - 1))


@dataclass
class TrainerModel(ConfigBase):
    """The trainer's compute: device-seconds per trained token (prompt + response), divided over its devices.

    Training a batch on ``d`` devices takes ``Σ (prompt_tokens + length) × device_s_per_token / d + step_overhead_s``.
    """

    SECTION: ClassVar[str] = "trainer"
    ERROR = ScenarioError

    device_s_per_token: float = real(
        0.004, above=0.0, fix="Give the device-seconds of training compute per token, e.g. 0.004."
    )
    """Device-seconds of training compute per token."""

    step_overhead_s: float = real(0.0, at_least=0.0, fix="Use 0 or the fixed seconds of one micro fit-step.")
    """Fixed seconds per micro fit-step (all devices busy; counted in the balance bound)."""
