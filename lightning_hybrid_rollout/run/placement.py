"""Placement of one run: which Ray node each replica goes to, by role, and on CPU which cores (design/notes.md §6).

Nodes (:func:`place_replicas`): standalone replicas go only to the nodes advertising the Ray resource
``RolloutConfig.standalone_resource`` (one unit each, e.g. ``ray start --resources='{"lhr_rollout": 8}'``; ``None``:
anywhere); hybrid replica ``i`` belongs to trainer rank ``i`` and is pinned to that rank's node by hard node
affinity (the driver's node unless each rank's node address is given), on GPU to the rank's own device. A replica
the cluster can never place that way is refused before anything is launched (:func:`check_placement`).

Cores (:func:`plan_cpu_placement`): hybrid replica ``i`` is pinned to core ``i`` (the trainer's cores: the trainer
is idle while a hybrid replica generates, and the replica is parked while the trainer trains); standalone replicas
are pinned to the remaining cores, from the last one down.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

log = logging.getLogger(__name__)

__all__ = [
    "check_local_placement",
    "check_placement",
    "hybrid_cuda_devices",
    "hybrid_node_ids",
    "pin_trainer_process",
    "place_replicas",
    "plan_cpu_placement",
    "replica_specs",
]


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
    rollout: RolloutConfig,
    engine: VLLMEngineConfig,
    s_cores: list[list[int]],
    h_cores: list[list[int]],
    hybrid_node_ids: Sequence[str] | None = None,
) -> list[ReplicaSpec]:
    """How to start each replica of the run: the standalone ones, then the hybrid ones.

    Where each may run is part of its spec, so a replacement launched from the same spec lands under the same
    constraints: a standalone replica asks for one unit of ``rollout.standalone_resource`` (when set), hybrid
    replica ``i`` (trainer rank ``i``'s) is pinned to ``hybrid_node_ids[i]`` by hard node affinity and, on GPU,
    sees the rank's node-local device (:func:`hybrid_cuda_devices`).

    Args:
        rollout: The rollout section (counts, CPUs/GPUs per replica, ``standalone_resource``).
        engine: The engines' settings.
        s_cores: Cores of each standalone replica (:func:`plan_cpu_placement`).
        h_cores: Cores of each hybrid replica.
        hybrid_node_ids: Ray node id of each hybrid replica (:func:`hybrid_node_ids`); ``None``: no node affinity.
    """
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec

    r = rollout
    if hybrid_node_ids is not None and len(hybrid_node_ids) < r.hybrid_replicas:
        raise ValueError(f"replica_specs: {len(hybrid_node_ids)} node ids for {r.hybrid_replicas} hybrid replicas")
    resources = {r.standalone_resource: 1.0} if r.standalone_resource else {}
    devices = hybrid_cuda_devices(hybrid_node_ids, r.hybrid_replicas, r.gpus_per_replica)
    return [
        ReplicaSpec(
            replica_id=f"standalone-{j}",
            role="standalone",
            engine=engine,
            cpus=r.cpus_per_replica,
            cpu_ids=s_cores[j],
            index=j,
            gpus=r.gpus_per_replica,
            resources=dict(resources),
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
            node_id=hybrid_node_ids[i] if hybrid_node_ids is not None else None,
            cuda_devices=devices[i],
        )
        for i in range(r.hybrid_replicas)
    ]


def hybrid_cuda_devices(node_ids: Sequence[str] | None, count: int, gpus_per_replica: float) -> list[list[int] | None]:
    """GPU only: the node-local devices of each hybrid replica, its trainer rank's own.

    Hybrid replica ``i`` belongs to trainer rank ``i``; its local index is the number of earlier ranks on the same
    node (Lightning's ``LOCAL_RANK`` when ranks are numbered node by node), and it sees devices
    ``local * g .. local * g + g - 1`` with ``g = ceil(gpus_per_replica)`` (a fraction shares the rank's device).
    On CPU (``gpus_per_replica == 0``) every entry is ``None`` (Ray's choice; nothing to pick).

    Example::

        >>> hybrid_cuda_devices(["a", "a", "b"], 3, 0.5)
        [[0], [1], [0]]
    """
    if gpus_per_replica <= 0:
        return [None] * count
    g = max(1, math.ceil(gpus_per_replica))
    seen: dict[str, int] = {}
    out: list[list[int] | None] = []
    for i in range(count):
        node = node_ids[i] if node_ids is not None else ""
        local = seen.get(node, 0)
        seen[node] = local + 1
        out.append(list(range(local * g, local * g + g)))
    return out


def rank_node_ips(
    world_size: int, all_gather_object: Callable[[list[Any], Any], None] | None = None
) -> list[str] | None:
    """Each trainer rank's node address, rank by rank, when the ranks span several hosts (collective: every rank
    calls it); ``None`` on one host (every hybrid replica then goes to the driver's node).

    Args:
        world_size: The trainer's world size.
        all_gather_object: ``torch.distributed.all_gather_object`` (the default) or a stand-in.
    """
    if world_size <= 1:
        return None
    import socket

    from ray.util import get_node_ip_address

    if all_gather_object is None:
        import torch.distributed as dist

        all_gather_object = dist.all_gather_object
    everyone: list[Any] = [None] * world_size
    all_gather_object(everyone, (socket.gethostname(), get_node_ip_address()))
    if len({host for host, _ in everyone}) == 1:
        return None
    return [ip for _, ip in everyone]


def hybrid_node_ids(
    count: int, nodes: Sequence[Mapping[str, Any]], driver_node_id: str, hybrid_node_ips: Sequence[str] | None = None
) -> list[str]:
    """The Ray node of each hybrid replica: its trainer rank's node.

    Args:
        count: Hybrid replicas (replica ``i`` belongs to trainer rank ``i``).
        nodes: The cluster's nodes as ``ray.nodes()`` returns them (``NodeID``, ``NodeManagerAddress``,
            ``Alive``).
        driver_node_id: The node this process (trainer rank 0, the Ray driver) runs on.
        hybrid_node_ips: The address of each trainer rank's node, rank by rank; ``None``: every hybrid replica on
            the driver's node (a single-node trainer). An address several alive nodes share (several raylets on one
            machine) resolves to the driver's node if it is one of them, else to the first by node id.

    Raises:
        ConfigError: Fewer addresses than hybrid replicas, or an address no alive node of the cluster has.
    """
    from lightning_hybrid_rollout.errors import ConfigError

    if hybrid_node_ips is None:
        return [driver_node_id] * count
    if len(hybrid_node_ips) < count:
        raise ConfigError(
            f"hybrid placement: {len(hybrid_node_ips)} trainer node addresses for {count} hybrid replicas "
            "(one per trainer rank)"
        )
    by_ip: dict[str, list[str]] = {}
    for n in nodes:
        if n.get("Alive"):
            by_ip.setdefault(str(n.get("NodeManagerAddress")), []).append(str(n.get("NodeID")))
    out = []
    for rank, ip in enumerate(hybrid_node_ips[:count]):
        ids = sorted(by_ip.get(ip, []))
        if not ids:
            raise ConfigError(
                f"hybrid placement: trainer rank {rank}'s node {ip} is not in the Ray cluster (alive nodes: "
                f"{', '.join(sorted(by_ip)) or 'none'}); join it with `ray start --address=<head>:6379` on that node"
            )
        out.append(driver_node_id if driver_node_id in ids else ids[0])
    return out


def check_placement(specs: Sequence[ReplicaSpec], nodes: Sequence[Mapping[str, Any]]) -> None:
    """Refuse, before anything is launched, replicas the cluster can never place as asked.

    Ray would otherwise keep such an actor pending (an infeasible request) until the start times out. Checked
    against each alive node's total resources (``ray.nodes()``), reserving as Ray would have to: first the hybrid
    replicas pinned to their trainer ranks' nodes (the node alive, with the CPUs/GPUs for them), then the standalone
    replicas asking for a custom resource (its units, and the CPUs/GPUs left on the nodes advertising it), then the
    standalone replicas free to go anywhere (the CPUs/GPUs left on any node). An empty node list (no cluster read)
    checks nothing.

    Args:
        specs: The run's replicas (:func:`replica_specs`).
        nodes: The cluster's nodes as ``ray.nodes()`` returns them.

    Raises:
        ConfigError: One line per problem: what is missing and how to fix it.
    """
    from lightning_hybrid_rollout.errors import ConfigError

    if not nodes:
        return
    alive = {str(n.get("NodeID")): dict(n.get("Resources") or {}) for n in nodes if n.get("Alive")}
    left = {node_id: dict(res) for node_id, res in alive.items()}  # what is still free after each reservation
    problems: list[str] = []
    per_node: dict[str, list[ReplicaSpec]] = {}
    for s in specs:
        if s.node_id is not None and s.placement_group is None:
            per_node.setdefault(s.node_id, []).append(s)
    for node_id, group in per_node.items():
        ids = ", ".join(s.replica_id for s in group)
        if node_id not in alive:
            problems.append(
                f"hybrid placement: {ids} must run on Ray node {node_id}, which is not an alive node of the cluster; "
                "every trainer node must join it (`ray start --address=<head>:6379`)"
            )
            continue
        fit = _fits(alive[node_id], group[0], len(group))
        _reserve(left[node_id], group[0], fit)
        if fit < len(group):
            res = alive[node_id]
            problems.append(
                f"hybrid placement: node {node_id} has {res.get('CPU', 0.0):g} CPU and {res.get('GPU', 0.0):g} GPU for "
                f"{len(group)} hybrid replicas of {group[0].cpus} CPU and {group[0].gpus:g} GPU each ({ids}); "
                "advertise more with `ray start --num-cpus/--num-gpus` or pass each trainer rank's node"
            )
    asked: dict[str, list[ReplicaSpec]] = {}
    free: list[ReplicaSpec] = []
    for s in specs:
        if s.node_id is not None or s.placement_group is not None:
            continue
        for name in s.resources:
            asked.setdefault(name, []).append(s)
        if not s.resources:
            free.append(s)
    for name, group in asked.items():
        need = sum(s.resources[name] for s in group)
        have = sum(res.get(name, 0.0) for res in alive.values())
        hint = (
            f'start the rollout nodes with `ray start --address=<head>:6379 --resources=\'{{"{name}": '
            f"{math.ceil(need)}}}'` or set rollout.standalone_resource: null"
        )
        if have < need:
            problems.append(
                f"standalone placement: {len(group)} standalone replicas need {need:g} units of the Ray resource "
                f"{name!r} (rollout.standalone_resource) but the alive nodes advertise {have:g}; {hint}"
            )
            continue
        fit = 0
        for res in left.values():
            units = res.get(name, 0.0)
            if units > 0 and fit < len(group):
                here = _fits(res, group[0], min(len(group) - fit, int(units // group[0].resources[name])))
                _reserve(res, group[0], here)
                fit += here
        if fit < len(group):
            problems.append(
                f"standalone placement: the nodes advertising {name!r} have room for {fit} of {len(group)} standalone "
                f"replicas ({group[0].cpus} CPU, {group[0].gpus:g} GPU each); give them more CPUs/GPUs in `ray start`"
            )
    if free:
        fit = 0
        for res in left.values():
            here = _fits(res, free[0], len(free) - fit)
            _reserve(res, free[0], here)
            fit += here
        if fit < len(free):
            cpus = sum(res.get("CPU", 0.0) for res in alive.values())
            gpus = sum(res.get("GPU", 0.0) for res in alive.values())
            hybrid = sum(len(g) for g in per_node.values())
            problems.append(
                f"standalone placement: the cluster has {cpus:g} CPU and {gpus:g} GPU; beside the {hybrid} hybrid "
                f"replica{'s' if hybrid != 1 else ''} there is room for {fit} of {len(free)} standalone replicas "
                f"({free[0].cpus} CPU, {free[0].gpus:g} GPU each); lower rollout.standalone_replicas, "
                "rollout.hybrid_replicas or rollout.cpus_per_replica, or join a node with more "
                "(`ray start --address=<head>:6379`)"
            )
    if problems:
        raise ConfigError(problems)


def check_local_placement(
    rollout: RolloutConfig,
    engine: VLLMEngineConfig,
    s_cores: list[list[int]],
    h_cores: list[list[int]],
    cpus: int | None = None,
) -> None:
    """:func:`check_placement` against the one-node cluster a run without ``rollout.ray_address`` starts, before
    it is started: ``cpus`` CPUs (default: this process's cores, what :class:`RayRuntime` advertises). On GPU Ray
    counts the devices itself, so only CPU runs are checked here (:func:`place_replicas` checks them all).

    Raises:
        ConfigError: More replicas than the machine's CPUs hold (one line, with the fix).
    """
    if rollout.ray_address is not None or rollout.gpus_per_replica > 0:
        return
    local = "this machine"
    specs = replica_specs(rollout, engine, s_cores, h_cores, hybrid_node_ids=[local] * rollout.hybrid_replicas)
    total = float(cpus if cpus is not None else len(_cpu_cores()))
    check_placement(
        specs, [{"NodeID": local, "NodeManagerAddress": "127.0.0.1", "Alive": True, "Resources": {"CPU": total}}]
    )


def _reserve(resources: dict[str, float], spec: ReplicaSpec, count: int) -> None:
    """Take what ``count`` replicas like ``spec`` ask for out of a node's free ``resources``."""
    resources["CPU"] = resources.get("CPU", 0.0) - count * spec.cpus
    if spec.gpus > 0:
        resources["GPU"] = resources.get("GPU", 0.0) - count * spec.gpus
    for name, units in spec.resources.items():
        resources[name] = resources.get(name, 0.0) - count * units


def _fits(resources: Mapping[str, float], spec: ReplicaSpec, most: int) -> int:
    """How many replicas like ``spec`` (up to ``most``) a node with these total resources can hold."""
    fit = most
    if spec.cpus > 0:
        fit = min(fit, int(resources.get("CPU", 0.0) // spec.cpus))
    if spec.gpus > 0:
        fit = min(fit, int(resources.get("GPU", 0.0) / spec.gpus + 1e-9))
    return max(fit, 0)


def place_replicas(
    rollout: RolloutConfig,
    engine: VLLMEngineConfig,
    s_cores: list[list[int]],
    h_cores: list[list[int]],
    hybrid_node_ips: Sequence[str] | None = None,
) -> list[ReplicaSpec]:
    """Role-aware specs of the run's replicas for the Ray cluster this process is connected to, checked.

    Reads the cluster (``ray.nodes()``, this driver's node id), builds the specs (:func:`replica_specs`: standalone
    replicas on the nodes advertising ``rollout.standalone_resource``, hybrid ones on their trainer ranks' nodes)
    and refuses what can never be placed (:func:`check_placement`). Launches nothing.

    Args:
        rollout: The rollout section.
        engine: The engines' settings.
        s_cores: Cores of each standalone replica.
        h_cores: Cores of each hybrid replica.
        hybrid_node_ips: Each trainer rank's node address (see :func:`hybrid_node_ids`); ``None``: this node.

    Raises:
        ConfigError: A replica the cluster cannot place as asked (one line per problem, with the fix).
    """
    import ray

    nodes = ray.nodes()
    here = ray.get_runtime_context().get_node_id()
    ids = hybrid_node_ids(rollout.hybrid_replicas, nodes, here, hybrid_node_ips)
    specs = replica_specs(rollout, engine, s_cores, h_cores, hybrid_node_ids=ids)
    check_placement(specs, nodes)
    log.info(
        "placement: standalone replicas on nodes advertising %s, hybrid replicas on nodes %s",
        rollout.standalone_resource or "(any)",
        sorted(set(ids)),
    )
    return specs


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
