"""``async_training``: :class:`AsyncTrainingConfig` with verl's names, and :func:`derived_counts`, the one formula
for the sample counts the queue bound, the staleness budget and the policies share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from lightning_hybrid_rollout.config.base import ConfigBase, available_policy_names, policy_kwargs_problems
from lightning_hybrid_rollout.config.fields import boolean, choice, custom, integer, real

# --------------------------------------------------------------------------------------------------------------
# async_training
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DerivedCounts:
    """The sample counts that follow from the ``async_training`` parameters (made by :func:`derived_counts` only).

    Args:
        required_samples: Samples per optimizer step: ``mini_batch_size * require_batches``.
        step_required_samples: Samples per sync cycle: ``required_samples * trigger_parameter_sync_step``.
        max_required_samples: The staleness budget per param version and the MessageQueue bound:
            ``int(required_samples * (staleness_threshold + 1) * trigger_parameter_sync_step)``.
        buffer_samples: Extra samples the policy may want buffered beyond the expected ones:
            ``int(step_required_samples * staleness_threshold)``.
    """

    required_samples: int
    step_required_samples: int
    max_required_samples: int
    buffer_samples: int


def derived_counts(
    *, mini_batch_size: int, trigger_parameter_sync_step: int, staleness_threshold: float, require_batches: int = 1
) -> DerivedCounts:
    """The derived sample counts of a run: the one formula the config, the runtime and the simulator share.

    ``max_required_samples`` is verl's expression in verl's order, so the float rounding matches its runs;
    ``buffer_samples`` follows verl's code (``step_required_samples * threshold``), not its doc.

    Args:
        mini_batch_size: Samples per mini-batch (``async_training.mini_batch_size``).
        trigger_parameter_sync_step: Optimizer steps per parameter version.
        staleness_threshold: Fraction of extra samples the rollouter may generate ahead of the trainer.
        require_batches: Mini-batches per optimizer step.

    Example::

        >>> derived_counts(mini_batch_size=128, trigger_parameter_sync_step=4, staleness_threshold=0.5)
        DerivedCounts(required_samples=128, step_required_samples=512, max_required_samples=768, buffer_samples=256)
    """
    required = mini_batch_size * require_batches
    step_required = required * trigger_parameter_sync_step
    return DerivedCounts(
        required_samples=required,
        step_required_samples=step_required,
        max_required_samples=int(required * (staleness_threshold + 1) * trigger_parameter_sync_step),
        buffer_samples=int(step_required * staleness_threshold),
    )


@dataclass
class AsyncTrainingConfig(ConfigBase):
    """The ``async_training`` section (design/scheduling.md §2): dynamic resource scheduling and fully-async staleness.

    Derived sample counts (read these, never recompute them elsewhere): :attr:`required_samples`,
    :attr:`step_required_samples`, :attr:`max_required_samples`, :attr:`buffer_samples`, all from
    :func:`derived_counts` (:attr:`derived_counts` gives them together).
    """

    SECTION: ClassVar[str] = "async_training"

    # --- Parameters that control dynamic resource scheduling (design/scheduling.md §2, "Core Parameters")

    use_dynamic_resource_scheduling: bool = boolean(True)
    """Lend hybrid replicas (on the trainer's devices) to rollout while the trainer waits. False = plain
    fully-async: standalone replicas only (then ``rollout.hybrid_replicas`` must be 0)."""

    dynamic_schedule_policy: str = choice(
        "default",
        available_policy_names,
        fix="Use a built-in policy or import the module that registers yours with @register_policy first.",
    )
    """Registered name of the policy deciding when hybrid replicas activate/deactivate: ``default``,
    ``static_fully_async`` (never lend), ``fixed_ratio``, ``rate_matched``, ``hysteresis_ratio`` or your own
    (docs/policies.md)."""

    dynamic_schedule_deactivate_ratio: float = real(
        0.3,
        above=0.0,
        at_most=1.0,
        fix="Use a fraction such as 0.3 (verl's default); 1.0 waits for the whole cycle's samples.",
    )
    """Initial deactivate ratio, in (0, 1]: hybrid replicas are deactivated once
    ``int(ratio * step_required_samples)`` samples are buffered. The ``default`` policy adapts it each step;
    ``only_hybrid`` forces 1.0."""

    dynamic_schedule_policy_kwargs: dict[str, Any] = custom(
        default_factory=dict,
        requirement="a mapping of the policy's constructor arguments",
        check=lambda cfg, key, kwargs: [
            f"{key} {p}" for p in policy_kwargs_problems(cfg.dynamic_schedule_policy, kwargs)
        ],
    )
    """Extra constructor arguments of the policy, e.g. ``{gate_margin_fraction: 0.2}`` for ``rate_matched``; checked
    against its signature. ``deactivate_ratio`` and ``only_hybrid`` have their own keys."""

    dynamic_schedule_enable_rebalance: bool = boolean(True)
    """After activating hybrid replicas, clear the load balancer's sticky cache and abort + resume in-flight requests
    so least-loaded routing moves load onto the newly active (empty) replicas."""

    overlap_sync: bool = boolean(False)
    """Decide the activation *before* the standalone weight sync and, if it will activate, wake and sync the hybrid
    replicas concurrently with it. False = verl's order: standalone sync, then decide."""

    early_first_sync: bool = boolean(False)
    """Also sync weights after the *first* optimizer step (a one-step first cycle), so the policy's first decision
    comes after one measured step instead of a whole cycle."""

    staged_standalone_sync: bool = boolean(False)
    """Standalone weight sync in two phases: the buckets reach the replicas while they keep generating (stage), then
    each pauses once to load them (commit), so generation stops for the commit only. Costs one staged copy of the
    weights per node (CPU) or per engine (GPU) during the sync."""

    standalone_sync_mode: Literal["abort", "keep"] = choice("abort", ("abort", "keep"), fix="Use abort or keep.")
    """What a standalone weight sync does with in-flight requests: ``abort`` (verl's: they continue from their
    prefix, re-prefilled) or ``keep`` (frozen, and continued after the load in the same engine request, their KV
    recomputed by the new weights; the tokens after it are a new segment of the new version)."""

    # --- Parameters of fully-async training used by dynamic scheduling (design/scheduling.md §2)

    staleness_threshold: float = real(
        0.1, at_least=0.0, fix="Use 0 for no off-policy samples, or a small fraction such as 0.1 (verl's default)."
    )
    """Fraction of extra samples the rollouter may generate ahead of the trainer, under older weights. Sets
    ``max_required_samples`` (the queue bound) and ``buffer_samples``. 0 = no sample outlives one param version."""

    trigger_parameter_sync_step: int = integer(
        4, at_least=1, fix="Sync weights every N >= 1 optimizer steps (verl's default: 4)."
    )
    """Optimizer steps per parameter version: weights are synced to the rollout replicas every this many steps
    (one sync cycle)."""

    require_batches: int = integer(1, at_least=1, fix="Use 1 (verl's default) or more mini-batches per step.")
    """Mini-batches gathered from the queue per optimizer step (``required_samples = mini_batch_size *
    require_batches``)."""

    partial_rollout: bool = boolean(True)
    """Resume aborted requests (deactivation, rebalance, weight sync) from the tokens already generated instead of
    restarting them; the sample records the min/max weight version it was generated under."""

    mini_batch_size: int = integer(
        64, at_least=1, fix="Set it to prompts per step × rollout.n (e.g. 8 prompts × n=8 = 64)."
    )
    """Samples per optimizer step (prompts × ``rollout.n``); must be a multiple of ``rollout.n``."""

    only_hybrid: bool = boolean(False)
    """Colocated mode (verl: rollout nnodes = 0): every replica is hybrid, no standalone replicas; the trainer's
    devices alternate between rollout and training every cycle."""

    wait_timeout_s: float = real(
        600.0, above=0.0, fix="Give seconds, e.g. 600 (a slow first batch on a big model may need more)."
    )
    """Longest the trainer waits for a batch (or for the deactivate threshold) before the fit fails with a clear
    error naming the queue size and the replica logs: the rollout side has stalled or produces far too slowly."""

    @property
    def derived_counts(self) -> DerivedCounts:
        """All derived sample counts at once (:func:`derived_counts` of this section's values)."""
        return derived_counts(
            mini_batch_size=self.mini_batch_size,
            trigger_parameter_sync_step=self.trigger_parameter_sync_step,
            staleness_threshold=self.staleness_threshold,
            require_batches=self.require_batches,
        )

    @property
    def required_samples(self) -> int:
        """Samples per optimizer step: ``mini_batch_size * require_batches``."""
        return self.derived_counts.required_samples

    @property
    def step_required_samples(self) -> int:
        """Samples per sync cycle: ``required_samples * trigger_parameter_sync_step``."""
        return self.derived_counts.step_required_samples

    @property
    def max_required_samples(self) -> int:
        """Staleness budget and MessageQueue bound:
        ``int(required_samples * (staleness_threshold + 1) * trigger_parameter_sync_step)`` (verl's expression, in
        verl's order, so the float rounding matches)."""
        return self.derived_counts.max_required_samples

    @property
    def buffer_samples(self) -> int:
        """Extra samples the policy may want buffered beyond the expected ones:
        ``int(step_required_samples * staleness_threshold)``. verl's doc says ``expected_samples * threshold``,
        its code ``step_required_samples * threshold``; we follow the code (a per-cycle constant)."""
        return self.derived_counts.buffer_samples
