"""Ray for the rollout side: start (or join) a cluster, own the replica actors, and leave nothing behind.

``RayRuntime()`` starts a private local Ray (``address="local"``: never silently joins another user's cluster on
the same machine) bound to 127.0.0.1, without dashboard, with a small object store and quiet logs, in its own
short temp dir. ``RayRuntime(address="ray://head:10001")`` (or ``"auto"``) joins an existing cluster instead, so
standalone replicas can live on other nodes; then ``shutdown()`` only kills the actors it started.

``shutdown()`` stops every replica it launched (engine first, then the actor), shuts Ray down, and waits until no
process of this runtime remains: Ray's own processes (their command lines name the session dir) and every replica's
actor and engine-core pid it recorded. Stragglers after the wait are killed by pid (only those).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

from lightning_hybrid_rollout.rollout.replica import ReplicaHandle, ReplicaSpec

logger = logging.getLogger(__name__)


class RayRuntime:
    """Context manager owning a Ray connection and the replicas started through it.

    Args:
        address: Ray address to join (``None``: start a private local cluster).
        num_cpus: CPUs the local cluster advertises (default: this process's cores).
        num_gpus: GPUs the local cluster advertises (default: Ray detects).
        object_store_memory: Object store size of the local cluster (bytes).
        temp_dir: Root for Ray's session files (default: a fresh short dir under /tmp; Unix socket paths must stay
            short).
        env_vars: Environment for every Ray worker (``runtime_env``).
        log_to_driver: Forward actor stdout/stderr to this process.
        ray_log_level: Level of Ray's and vLLM's Python loggers in this process.
    """

    def __init__(
        self,
        address: str | None = None,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        object_store_memory: int = 512 * 2**20,
        temp_dir: str | None = None,
        env_vars: dict[str, str] | None = None,
        log_to_driver: bool = False,
        ray_log_level: int = logging.WARNING,
    ) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.object_store_memory = object_store_memory
        self.env_vars = dict(env_vars or {})
        self.log_to_driver = log_to_driver
        self.ray_log_level = ray_log_level
        self._own_temp = temp_dir is None
        self.temp_dir = temp_dir or os.path.join(tempfile.gettempdir(), f"lhr-ray-{uuid.uuid4().hex[:8]}")
        self.started_local = False
        self.session_dir: str | None = None
        self.replicas: list[ReplicaHandle] = []
        self._pids: set[int] = set()
        self.init_seconds = 0.0

    # ---- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> RayRuntime:
        """Connect to / start Ray. Idempotent."""
        import ray

        if self.session_dir is not None:
            return self
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        for name in ("ray", "vllm"):
            logging.getLogger(name).setLevel(self.ray_log_level)
        if ray.is_initialized():
            raise RuntimeError(
                "Ray is already initialized in this process; RayRuntime owns the connection. Use the existing "
                "RayRuntime or call ray.shutdown() first."
            )
        env = {"RAY_AUTH_MODE": "disabled", **self.env_vars}
        t = time.perf_counter()
        kwargs: dict[str, Any] = {
            "runtime_env": {"env_vars": env},
            "log_to_driver": self.log_to_driver,
            "logging_level": self.ray_log_level,
            "configure_logging": True,
        }
        if self.address is None:
            os.makedirs(self.temp_dir, exist_ok=True)
            kwargs.update(
                address="local",
                num_cpus=self.num_cpus if self.num_cpus is not None else len(os.sched_getaffinity(0)),
                num_gpus=self.num_gpus,
                object_store_memory=self.object_store_memory,
                include_dashboard=False,
                _temp_dir=self.temp_dir,
                _node_ip_address="127.0.0.1",
                _system_config={"kill_child_processes_on_worker_exit_with_raylet_subreaper": True},
            )
            self.started_local = True
        else:
            kwargs["address"] = self.address
        try:
            ctx = ray.init(**kwargs)
        except Exception as e:
            self.started_local = False
            where = "a local Ray" if self.address is None else f"Ray at {self.address!r}"
            raise RuntimeError(f"could not start {where}: {type(e).__name__}: {e}") from e
        self.init_seconds = time.perf_counter() - t
        del ctx
        self.session_dir = _session_dir(ray) or self.temp_dir
        logger.info(
            "Ray %s in %.1f s (session %s)",
            "started" if self.started_local else "joined",
            self.init_seconds,
            self.session_dir,
        )
        return self

    def __enter__(self) -> RayRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- replicas -------------------------------------------------------------------------------------------------
    async def start_replicas_async(self, specs: Sequence[ReplicaSpec], timeout: float = 600.0) -> list[ReplicaHandle]:
        """Launch replicas in parallel, wait until all engines are up, and track them for :meth:`shutdown`."""
        self.start()
        handles = [ReplicaHandle.launch(s) for s in specs]
        self.replicas.extend(handles)
        results = await asyncio.gather(*(h.wait_ready(timeout) for h in handles), return_exceptions=True)
        for r in results:
            if isinstance(r, dict):
                self._remember_pids(r)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for h in handles:
                await h.shutdown()
            raise errors[0]
        return handles

    def start_replicas(self, specs: Sequence[ReplicaSpec], timeout: float = 600.0) -> list[ReplicaHandle]:
        """Blocking :meth:`start_replicas_async` (from a thread without a running event loop)."""
        return asyncio.run(self.start_replicas_async(specs, timeout))

    def _remember_pids(self, health: dict[str, Any]) -> None:
        for key in ("frontend_pid", "engine_pid"):
            pid = health.get(key)
            if isinstance(pid, int) and health.get("node_id") in (None, "", self._local_node_id()):
                self._pids.add(pid)

    def _local_node_id(self) -> str:
        try:
            import ray

            return ray.get_runtime_context().get_node_id()
        except Exception:
            return ""

    def leftover_processes(self) -> list[Any]:
        """Live processes of this runtime: Ray's (command line names the session/temp dir) + recorded replica pids."""
        import psutil

        me = os.getpid()
        out = []
        # A joined cluster's session dir also names its own daemons (raylet, agents, GCS): only our replicas' pids
        # count then. A local cluster is ours entirely.
        markers = [m for m in (self.session_dir, self.temp_dir) if m] if self.started_local else []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                cmd = " ".join(p.info["cmdline"] or [])
                if p.pid in self._pids or (markers and any(m in cmd for m in markers)):
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    def shutdown(self, wait_s: float = 10.0) -> list[int]:
        """Stop the replicas, disconnect (and stop the local cluster), and wait for their processes to exit.

        Returns:
            Pids that had to be killed after ``wait_s`` (empty when everything exited by itself).
        """
        import psutil
        import ray

        if self.session_dir is None:
            return []
        if self.replicas and ray.is_initialized():
            for h in self.replicas:
                if h.is_alive and h.info:
                    self._remember_pids(h.info)

            async def stop_all() -> None:
                await asyncio.gather(*(h.shutdown() for h in self.replicas), return_exceptions=True)

            try:
                asyncio.run(stop_all())
            except RuntimeError:  # called from inside a running loop: kill without the graceful step
                for h in self.replicas:
                    h.kill()
        self.replicas.clear()
        if ray.is_initialized():
            ray.shutdown()
        deadline = time.monotonic() + wait_s
        left = self.leftover_processes()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.leftover_processes()
        killed = []
        for p in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                logger.warning("RayRuntime: killing leftover process %d (%s)", p.pid, " ".join(p.cmdline()[:3]))
                p.kill()
                killed.append(p.pid)
        self.session_dir = None
        self._pids.clear()
        if self.started_local and self._own_temp:
            for _ in range(3):  # a dying Ray process may still write a last log line
                shutil.rmtree(self.temp_dir, ignore_errors=True)
                if not os.path.exists(self.temp_dir):
                    break
                time.sleep(0.5)
        self.started_local = False
        return killed


def _session_dir(ray: Any) -> str:
    try:
        return ray._private.worker.global_worker.node.get_session_dir_path()
    except Exception:
        return ""
