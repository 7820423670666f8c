"""What lending k of the n hybrid replicas and delta weight syncs change in the simulator's sync costs.

The scenario's ``lending:`` section (:class:`LendingModel`): the share of the hybrid weight sync that is paid once per
lent replica (one sender pushing to each in turn) and the bytes a delta sync moves (from the share of the weights'
elements a step changes). Both default to the presets' model (a sync costs the same for any k; full weights), so a
scenario without the section simulates as before (docs/simulator.md, "Lending k of n").

Example::

    from lightning_hybrid_rollout.sim.lending import LendingModel

    lending = LendingModel(sync_per_replica_fraction=1.0, changed_fraction=0.01)
    seconds = lending.hybrid_sync_s(10.0, replicas=1, of=4, versions_behind=1)
    assert abs(seconds - 10.0 * 0.25 * 0.03) < 1e-9  # a quarter of the replicas, 3% of the bytes
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from lightning_hybrid_rollout.config.base import ConfigBase
from lightning_hybrid_rollout.config.fields import integer, real
from lightning_hybrid_rollout.errors import ScenarioError
from lightning_hybrid_rollout.sim.switch_costs import SwitchCosts

__all__ = ["LendingModel"]


@dataclass
class LendingModel(ConfigBase):
    """How the hybrid weight sync's seconds follow the replicas lent and the bytes each sync moves.

    For k of n replicas lent, a hybrid sync takes ``switch.hybrid_sync_s × bytes × ((1 − f) + f × k / n)`` with
    ``f = sync_per_replica_fraction``; ``bytes`` is 1 for full weights and, with ``changed_fraction`` ``c``, the
    delta of a replica ``m`` versions behind, ``(1 − (1 − c)^m) × (index_bytes + value_bytes) / value_bytes``
    (the elements changed since its version, each sent with its index), at most 1 (a bigger delta goes full, as the
    runtime's ``weight_encoding: delta`` does). With a delta, a sleeping hybrid replica keeps its weights in host
    memory and its version (delta sync needs a base); without one it drops them (a full sync after each wake). The
    standalone sync moves one version's delta (``standalone_sync_s × bytes(1)``; the commit, a local load, is
    unchanged).
    """

    SECTION: ClassVar[str] = "lending"
    ERROR = ScenarioError

    sync_per_replica_fraction: float = real(
        0.0,
        at_least=0.0,
        at_most=1.0,
        fix="Use 0 (every replica synced in parallel) up to 1 (the replicas synced one after another).",
    )
    """``f``: the share of ``hybrid_sync_s`` (with all n lent) that scales with the replicas synced; 0 (the default)
    = every replica in parallel, the same seconds for any k."""

    changed_fraction: float | None = real(
        None,
        at_least=0.0,
        at_most=1.0,
        nullable=True,
        fix="Use null (full-weight syncs) or the share of the elements a step changes, e.g. 0.02.",
    )
    """``c``: share of the weights' elements one training step changes (bf16 after a small RL step: a few percent;
    None, the default: full-weight syncs)."""

    index_bytes: int = integer(4, at_least=0, fix="Use 4 (an int32 index).")
    """Bytes of a changed element's index (int32: 4)."""

    value_bytes: int = integer(2, at_least=1, fix="Use 2 (bf16) or 4 (float32).")
    """Bytes of an element's value (bf16: 2)."""

    @property
    def delta(self) -> bool:
        """Whether syncs send deltas (``changed_fraction`` is set)."""
        return self.changed_fraction is not None

    def bytes_fraction(self, versions_behind: int | None) -> float:
        """A sync's bytes over the full weights' for a replica ``versions_behind`` old (None: it holds none)."""
        if self.changed_fraction is None or versions_behind is None:
            return 1.0
        if versions_behind <= 0:
            return 0.0
        changed = 1.0 - math.pow(1.0 - self.changed_fraction, versions_behind)
        return min(1.0, changed * (self.index_bytes + self.value_bytes) / self.value_bytes)

    def hybrid_sync_s(self, full_s: float, *, replicas: int, of: int, versions_behind: int | None = None) -> float:
        """Seconds to sync ``replicas`` of the ``of`` hybrid replicas, the oldest ``versions_behind`` behind.

        Args:
            full_s: ``switch.hybrid_sync_s``: all ``of`` replicas, full weights.
            replicas: ``k``, the replicas synced.
            of: ``n``, the hybrid replicas there are.
            versions_behind: The oldest synced replica's lag (None: one holds no weights; a full sync).
        """
        if replicas <= 0 or of <= 0:
            return 0.0
        f = self.sync_per_replica_fraction
        return full_s * self.bytes_fraction(versions_behind) * ((1.0 - f) + f * min(replicas, of) / of)

    def apply(self, switch: SwitchCosts) -> SwitchCosts:
        """``switch`` with the standalone sync moving one version's delta (they are synced at every version)."""
        if not self.delta:
            return switch
        return dataclasses.replace(switch, standalone_sync_s=switch.standalone_sync_s * self.bytes_fraction(1))
