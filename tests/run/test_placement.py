"""Role-aware placement (``run/placement.py``): what each replica's spec asks of Ray, checked against the cluster.

No Ray cluster here: the cluster is a list of ``ray.nodes()``-shaped dicts, and ``ReplicaHandle.launch`` runs
against a stand-in for ``ray.remote`` that records the actor options. The real thing on a two-node cluster is
``test_multinode.py`` (slow).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.config import RolloutConfig
from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.rollout.replica import ReplicaHandle, ReplicaSpec
from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
from lightning_hybrid_rollout.run import placement
from lightning_hybrid_rollout.run.placement import (
    check_placement,
    hybrid_cuda_devices,
    hybrid_node_ids,
    replica_specs,
)

HEAD, ROLLOUT, TRAINER1 = "a" * 56, "b" * 56, "c" * 56  # Ray node ids: 56 hex digits


def node(node_id: str, ip: str, cpus: float = 4, gpus: float = 0, alive: bool = True, **custom: float) -> dict:
    res = {"CPU": cpus, f"node:{ip}": 1.0, **custom}
    if gpus:
        res["GPU"] = gpus
    return {"NodeID": node_id, "NodeManagerAddress": ip, "Alive": alive, "Resources": res}


def cfg(**kw: Any) -> RolloutConfig:
    return RolloutConfig(model_path="/nonexistent/model", **{"standalone_replicas": 1, "hybrid_replicas": 1, **kw})


def specs_for(r: RolloutConfig, node_ids: list[str] | None = None) -> list[ReplicaSpec]:
    s = [[0]] * r.standalone_replicas
    h = [[0]] * r.hybrid_replicas
    return replica_specs(r, VLLMEngineConfig(model="m"), s, h, hybrid_node_ids=node_ids)


# ---------------------------------------------------------------------------------------------------- the specs


def test_standalone_replicas_ask_for_one_unit_of_the_resource_and_hybrid_ones_for_their_node():
    specs = specs_for(cfg(standalone_replicas=2, hybrid_replicas=2, standalone_resource="lhr_rollout"), [HEAD, HEAD])
    standalone = [s for s in specs if s.role == "standalone"]
    hybrid = [s for s in specs if s.role == "hybrid"]
    assert [s.resources for s in standalone] == [{"lhr_rollout": 1.0}] * 2
    assert all(s.node_id is None for s in standalone)
    assert [s.node_id for s in hybrid] == [HEAD, HEAD]
    assert all(s.resources == {} for s in hybrid)
    assert all(s.cuda_devices is None for s in specs)  # CPU: nothing to pick


def test_no_standalone_resource_means_no_constraint():
    specs = specs_for(cfg(), [HEAD])
    assert specs[0].resources == {} and specs[0].node_id is None


def test_hybrid_replicas_on_gpu_see_their_ranks_local_device():
    specs = specs_for(cfg(hybrid_replicas=4, gpus_per_replica=0.5), [HEAD, HEAD, TRAINER1, TRAINER1])
    hybrid = [s for s in specs if s.role == "hybrid"]
    assert [s.cuda_devices for s in hybrid] == [[0], [1], [0], [1]]
    env = hybrid[1].actor_env()
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in specs[0].actor_env()  # standalone: Ray picks its GPU
    assert hybrid_cuda_devices(["a", "a"], 2, 2.0) == [[0, 1], [2, 3]]
    assert hybrid_cuda_devices(None, 2, 0.0) == [None, None]


# ------------------------------------------------------------------------------------ the hybrid replicas' nodes


def test_hybrid_nodes_default_to_the_drivers_node():
    assert hybrid_node_ids(3, [node(HEAD, "10.0.0.1")], HEAD) == [HEAD, HEAD, HEAD]


def test_hybrid_nodes_follow_each_ranks_node_address():
    nodes = [node(HEAD, "10.0.0.1"), node(ROLLOUT, "10.0.0.2"), node(TRAINER1, "10.0.0.3")]
    assert hybrid_node_ids(3, nodes, HEAD, ["10.0.0.1", "10.0.0.3", "10.0.0.3"]) == [HEAD, TRAINER1, TRAINER1]


def test_an_address_several_raylets_share_resolves_to_the_drivers_node():
    nodes = [node(ROLLOUT, "127.0.0.1"), node(HEAD, "127.0.0.1")]
    assert hybrid_node_ids(1, nodes, HEAD, ["127.0.0.1"]) == [HEAD]


def test_a_ranks_node_missing_from_the_cluster_is_one_line_naming_it():
    nodes = [node(HEAD, "10.0.0.1"), node(TRAINER1, "10.0.0.3", alive=False)]
    with pytest.raises(ConfigError) as err:
        hybrid_node_ids(2, nodes, HEAD, ["10.0.0.1", "10.0.0.3"])
    msg = str(err.value)
    assert "\n" not in msg and "rank 1" in msg and "10.0.0.3" in msg and "ray start --address" in msg
    with pytest.raises(ConfigError, match="one per trainer rank"):
        hybrid_node_ids(2, nodes, HEAD, ["10.0.0.1"])


# ---------------------------------------------------------------------------------------------- the check


def test_too_few_units_of_the_standalone_resource_is_refused_in_one_line():
    specs = specs_for(cfg(standalone_replicas=2, standalone_resource="lhr_rollout"), [HEAD])
    nodes = [node(HEAD, "10.0.0.1"), node(ROLLOUT, "10.0.0.2", lhr_rollout=1)]
    with pytest.raises(ConfigError) as err:
        check_placement(specs, nodes)
    msg = str(err.value)
    assert "\n" not in msg
    assert "'lhr_rollout'" in msg and "need 2 units" in msg and "advertise 1" in msg
    assert """ray start --address=<head>:6379 --resources='{"lhr_rollout": 2}'""" in msg
    assert "standalone_resource: null" in msg


def test_a_resource_no_node_advertises_is_refused_and_dead_nodes_do_not_count():
    specs = specs_for(cfg(standalone_resource="lhr_rollout"), [HEAD])
    nodes = [node(HEAD, "10.0.0.1"), node(ROLLOUT, "10.0.0.2", alive=False, lhr_rollout=8)]
    with pytest.raises(ConfigError, match="advertise 0"):
        check_placement(specs, nodes)


def test_units_without_the_cpus_for_the_replicas_are_refused():
    specs = specs_for(cfg(standalone_replicas=2, cpus_per_replica=2, standalone_resource="lhr_rollout"), [HEAD])
    with pytest.raises(ConfigError, match="room for 1 of 2 standalone"):
        check_placement(specs, [node(HEAD, "10.0.0.1"), node(ROLLOUT, "10.0.0.2", cpus=3, lhr_rollout=8)])


def test_a_hybrid_replica_on_a_node_not_in_the_cluster_is_refused():
    specs = specs_for(cfg(hybrid_replicas=2), [HEAD, TRAINER1])
    with pytest.raises(ConfigError) as err:
        check_placement(specs, [node(HEAD, "10.0.0.1")])
    assert "hybrid-1" in str(err.value) and TRAINER1 in str(err.value) and "\n" not in str(err.value)


def test_more_hybrid_gpus_on_a_node_than_it_has_are_refused():
    specs = specs_for(cfg(standalone_replicas=0, hybrid_replicas=3, gpus_per_replica=1.0), [HEAD] * 3)
    with pytest.raises(ConfigError, match="2 GPU for 3 hybrid replicas"):
        check_placement(specs, [node(HEAD, "10.0.0.1", gpus=2)])
    check_placement(specs, [node(HEAD, "10.0.0.1", gpus=3)])


def test_a_cluster_that_fits_passes():
    r = cfg(standalone_replicas=2, hybrid_replicas=2, standalone_resource="lhr_rollout")
    specs = specs_for(r, [HEAD, HEAD])
    check_placement(specs, [node(HEAD, "10.0.0.1", cpus=2), node(ROLLOUT, "10.0.0.2", cpus=2, lhr_rollout=2)])
    check_placement(specs_for(cfg(), None), [])  # no constraint at all: nothing to check


def test_standalone_replicas_beside_the_hybrid_ones_on_too_few_cpus_are_refused_in_one_line():
    # 1 standalone + 2 hybrid replicas of 1 CPU each on a 2-CPU machine: Ray would keep the third pending until
    # the start timed out (~10 min); the hybrid ones are pinned here, so the standalone one is what has no room
    specs = specs_for(cfg(standalone_replicas=1, hybrid_replicas=2), [HEAD, HEAD])
    with pytest.raises(ConfigError) as err:
        check_placement(specs, [node(HEAD, "127.0.0.1", cpus=2)])
    msg = str(err.value)
    assert "\n" not in msg
    assert "2 CPU" in msg and "beside the 2 hybrid replicas" in msg and "room for 0 of 1 standalone" in msg
    assert "rollout.standalone_replicas" in msg and "rollout.cpus_per_replica" in msg
    check_placement(specs_for(cfg(standalone_replicas=1, hybrid_replicas=1), [HEAD]), [node(HEAD, "127.0.0.1", 2)])
    # a second node takes the standalone replica
    check_placement(specs, [node(HEAD, "127.0.0.1", cpus=2), node(ROLLOUT, "10.0.0.2", cpus=1)])


def test_hybrid_replicas_reserve_their_cpus_before_the_standalone_resource_is_counted():
    # one machine that both trains and advertises the rollout resource: its CPUs are shared by both roles
    specs = specs_for(cfg(standalone_replicas=2, hybrid_replicas=2, standalone_resource="lhr_rollout"), [HEAD, HEAD])
    with pytest.raises(ConfigError, match="room for 1 of 2 standalone"):
        check_placement(specs, [node(HEAD, "127.0.0.1", cpus=3, lhr_rollout=2)])
    check_placement(specs, [node(HEAD, "127.0.0.1", cpus=4, lhr_rollout=2)])


def test_a_local_run_with_more_replicas_than_cores_is_refused_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from lightning_hybrid_rollout.config import AsyncTrainingConfig
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime
    from lightning_hybrid_rollout.run.runtime import RolloutRuntime

    def no_ray(self: Any) -> Any:
        raise AssertionError("Ray was started for a run the machine cannot hold")

    monkeypatch.setattr(RayRuntime, "start", no_ray)
    cores = len(placement._cpu_cores())
    r = cfg(standalone_replicas=1, hybrid_replicas=cores, weight_encoding="full")
    rt = RolloutRuntime(r, AsyncTrainingConfig(mini_batch_size=8), workload=None, run_dir=tmp_path, trace=False)
    with pytest.raises(ConfigError) as err:
        rt.start()
    assert "\n" not in str(err.value) and "room for 0 of 1 standalone" in str(err.value)
    assert rt.ray is None
    # what fits, and a cluster joined by address or replicas on GPUs, is left to the check against the real cluster
    engine = VLLMEngineConfig(model="m")
    placement.check_local_placement(cfg(standalone_replicas=1, hybrid_replicas=1), engine, [[1]], [[0]], cpus=2)
    placement.check_local_placement(cfg(hybrid_replicas=2, ray_address="auto"), engine, [[1]], [[0], [1]], cpus=2)
    with pytest.raises(ConfigError, match="room for 0 of 1 standalone"):
        placement.check_local_placement(cfg(hybrid_replicas=2), engine, [[1]], [[0], [1]], cpus=2)


def test_the_real_local_cluster_refuses_more_replicas_than_its_cpus_before_launching(
    ray_runtime: Any, monkeypatch: pytest.MonkeyPatch
):
    import ray

    launched: list[Any] = []
    monkeypatch.setattr(ReplicaHandle, "launch", classmethod(lambda cls, spec: launched.append(spec)))
    cpus = int(sum(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]))
    r = cfg(standalone_replicas=1, hybrid_replicas=cpus)
    with pytest.raises(ConfigError, match="room for 0 of 1 standalone"):
        placement.place_replicas(r, VLLMEngineConfig(model="m"), [[0]], [[0]] * cpus)
    assert launched == []
    specs = placement.place_replicas(
        cfg(standalone_replicas=1, hybrid_replicas=cpus - 1), VLLMEngineConfig(model="m"), [[0]], [[0]] * (cpus - 1)
    )
    assert len(specs) == cpus


def test_place_replicas_reads_the_cluster_and_refuses_before_launching(monkeypatch: pytest.MonkeyPatch):
    import ray

    class Ctx:
        def get_node_id(self) -> str:
            return HEAD

    launched: list[Any] = []
    monkeypatch.setattr(ray, "nodes", lambda: [node(HEAD, "10.0.0.1"), node(ROLLOUT, "10.0.0.2", lhr_rollout=1)])
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Ctx())
    monkeypatch.setattr(ReplicaHandle, "launch", classmethod(lambda cls, spec: launched.append(spec)))
    engine = VLLMEngineConfig(model="m")
    specs = placement.place_replicas(cfg(standalone_resource="lhr_rollout"), engine, [[1]], [[0]])
    assert [(s.replica_id, s.resources, s.node_id) for s in specs] == [
        ("standalone-0", {"lhr_rollout": 1.0}, None),
        ("hybrid-0", {}, HEAD),
    ]
    with pytest.raises(ConfigError, match="need 2 units"):
        placement.place_replicas(
            cfg(standalone_replicas=2, standalone_resource="lhr_rollout"), engine, [[1], [1]], [[0]]
        )
    assert launched == []


# ------------------------------------------------------------------------------------------ what Ray is asked


class _Recorder:
    """Stands in for ``ray.remote(ReplicaActor)``: records ``.options(...)``."""

    def __init__(self) -> None:
        self.options_seen: list[dict[str, Any]] = []

    def options(self, **opts: Any) -> _Recorder:
        self.options_seen.append(opts)
        return self

    def remote(self, *args: Any) -> Any:
        class Actor:
            class start:
                @staticmethod
                def remote() -> None:
                    return None

        return Actor()


def test_launch_asks_ray_for_the_resource_and_the_hard_node_affinity(monkeypatch: pytest.MonkeyPatch):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    rec = _Recorder()
    monkeypatch.setattr(ray, "remote", lambda cls: rec)
    standalone, hybrid = specs_for(cfg(standalone_resource="lhr_rollout"), [HEAD])
    ReplicaHandle.launch(standalone)
    ReplicaHandle.launch(hybrid)
    s_opts, h_opts = rec.options_seen
    assert s_opts["resources"] == {"lhr_rollout": 1.0} and "scheduling_strategy" not in s_opts
    strategy = h_opts["scheduling_strategy"]
    assert isinstance(strategy, NodeAffinitySchedulingStrategy)
    assert strategy.node_id == HEAD and strategy.soft is False
    assert "resources" not in h_opts
    # a replacement launched from the same spec is placed the same way
    ReplicaHandle.launch(hybrid)
    assert rec.options_seen[-1]["scheduling_strategy"].node_id == HEAD


# ------------------------------------------------------------------------------- joining a cluster on loopback


def test_a_loopback_address_is_joined_on_loopback_only_when_the_cluster_listens_there_only():
    import socket

    from ray._private import services

    from lightning_hybrid_rollout.rollout.ray_runtime import _is_loopback

    assert not any(_is_loopback(a) for a in (None, "auto", "local", "10.0.0.1:6379", "ray://127.0.0.1:10001"))
    machine = services.resolve_ip_for_localhost("127.0.0.1")
    with socket.create_server(("127.0.0.1", 0)) as loopback_only:  # like ray.cluster_utils.Cluster's GCS
        assert _is_loopback(f"127.0.0.1:{loopback_only.getsockname()[1]}")
    with socket.create_server(("0.0.0.0", 0)) as everywhere:  # like `ray start --head`'s GCS
        # the machine's address answers too: joined the usual way (unless loopback is all this machine has)
        assert _is_loopback(f"localhost:{everywhere.getsockname()[1]}") == (machine == "127.0.0.1")


def test_rank_node_ips_is_none_on_one_host_and_each_ranks_address_across_hosts() -> None:
    from lightning_hybrid_rollout.run.placement import rank_node_ips

    def gather_from(values: list[tuple[str, str]]) -> Any:
        def all_gather_object(out: list[Any], mine: Any) -> None:
            assert isinstance(mine, tuple) and len(mine) == 2  # (hostname, node address) of this rank
            out[:] = values

        return all_gather_object

    assert rank_node_ips(1) is None  # one rank: no collective at all
    one_host = gather_from([("trainer-0", "10.0.0.5"), ("trainer-0", "10.0.0.5")])
    assert rank_node_ips(2, one_host) is None
    two_hosts = gather_from([("trainer-0", "10.0.0.5"), ("trainer-0", "10.0.0.5"), ("trainer-1", "10.0.0.6")])
    assert rank_node_ips(3, two_hosts) == ["10.0.0.5", "10.0.0.5", "10.0.0.6"]
