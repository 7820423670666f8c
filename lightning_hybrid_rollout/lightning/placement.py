"""CPU placement of one run (DESIGN §6): which cores the replicas and the trainer get.

Hybrid replica ``i`` is pinned to core ``i`` (the trainer's cores: the trainer is idle while a hybrid replica
generates, and the replica is parked while the trainer trains); standalone replicas are pinned to the remaining
cores, from the last one down.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

log = logging.getLogger(__name__)

__all__ = ["pin_trainer_process", "plan_cpu_placement", "replica_specs"]


def _cpu_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return list(range(os.cpu_count() or 1))


def plan_cpu_placement(
    standalone: int, hybrid: int, cpus_per_replica: int, cores: Sequence[int] | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """Cores for each standalone and each hybrid replica on a CPU machine.

    Hybrid replicas take the trainer's cores from the front, standalone replicas the others from the back; when
    there are too few cores they wrap around (and share).

    Args:
        standalone: Number of standalone replicas.
        hybrid: Number of hybrid replicas.
        cpus_per_replica: Cores per replica.
        cores: Available cores (default: this process's affinity).

    Returns:
        ``(standalone_cores, hybrid_cores)``.

    Example::

        >>> plan_cpu_placement(1, 1, 1, cores=[0, 1])
        ([[1]], [[0]])
    """
    avail = list(cores) if cores is not None else _cpu_cores()
    n = len(avail)
    hybrid_cores = [[avail[(i * cpus_per_replica + k) % n] for k in range(cpus_per_replica)] for i in range(hybrid)]
    standalone_cores = [
        [avail[(n - 1 - (j * cpus_per_replica + k)) % n] for k in range(cpus_per_replica)] for j in range(standalone)
    ]
    return standalone_cores, hybrid_cores


def replica_specs(
    rollout: RolloutConfig, engine: VLLMEngineConfig, s_cores: list[list[int]], h_cores: list[list[int]]
) -> list[ReplicaSpec]:
    """How to start each replica of the run: the standalone ones, then the hybrid ones.

    Args:
        rollout: The rollout section (counts, CPUs/GPUs per replica).
        engine: The engines' settings.
        s_cores: Cores of each standalone replica (:func:`plan_cpu_placement`).
        h_cores: Cores of each hybrid replica.
    """
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec

    r = rollout
    return [
        ReplicaSpec(
            replica_id=f"standalone-{j}",
            role="standalone",
            engine=engine,
            cpus=r.cpus_per_replica,
            cpu_ids=s_cores[j],
            index=j,
            gpus=r.gpus_per_replica,
        )
        for j in range(r.standalone_replicas)
    ] + [
        ReplicaSpec(
            replica_id=f"hybrid-{i}",
            role="hybrid",
            engine=engine,
            cpus=r.cpus_per_replica,
            cpu_ids=h_cores[i],
            index=i,
            gpus=r.gpus_per_replica,
        )
        for i in range(r.hybrid_replicas)
    ]


def pin_trainer_process(cores: Sequence[int]) -> list[int] | None:
    """Pin every thread of the trainer process to ``cores`` (CPU placement, ``RolloutConfig.pin_trainer``).

    Every thread, not only the calling one: Ray's driver threads (io, gRPC polling), started by ``ray.init`` before
    the replicas are placed, would otherwise float onto the standalone replicas' cores and slow them down exactly
    when the hybrid replicas are lent (measured in ``benchmarks/cpu_miniature.py``: the standalone replica decoded
    ~17% fewer tokens per second while the hybrid one generated). Torch's intra-op threads follow the core count.

    Args:
        cores: The hybrid replicas' cores (empty: nothing is pinned).

    Returns:
        The process's affinity afterwards, or None when nothing was pinned.
    """
    if not cores or not hasattr(os, "sched_setaffinity"):
        return None
    from lightning_hybrid_rollout.rollout.replica import pin_process

    pinned = pin_process(cores)
    import torch

    torch.set_num_threads(len(pinned))
    log.info("trainer pinned to cores %s (shared with the hybrid replicas)", pinned)
    return pinned
