"""Ray for the rollout side: start a private, loopback-only, token-authenticated local Ray (or join an existing
cluster), own the replica actors, and leave no process behind at shutdown (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from lightning_hybrid_rollout.rollout import run_guard
from lightning_hybrid_rollout.rollout.replica import ReplicaHandle, ReplicaSpec

logger = logging.getLogger(__name__)


class RayRuntime:
    """Context manager owning a Ray connection and the replicas started through it.

    Args:
        address: Ray address to join (``None``: start a private local cluster).
        num_cpus: CPUs the local cluster advertises (default: this process's cores).
        num_gpus: GPUs the local cluster advertises (default: Ray detects).
        object_store_memory: Object store size of the local cluster (bytes).
        temp_dir: Root for Ray's session files (default: ``ray/`` in the run's private directory under
            ``$TMPDIR/lhr-<uid>/``; Unix socket paths must stay short).
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
        self.temp_dir = temp_dir or ""
        self.files: run_guard.RunFiles | None = None
        self._watchdog: Any = None
        self._saved_env: dict[str, str | None] = {}
        self.started_local = False
        self.session_dir: str | None = None
        self.replicas: list[ReplicaHandle] = []
        #: pid -> start time of each replica's actor and engine process on this node, read when the replica was up
        #: (a pid alone may name another process by the shutdown: the replica was replaced and the pid reused).
        self._pids: dict[int, float] = {}
        self._tree: dict[int, float] = {}  # pid -> start time of the run's processes seen before Ray's shutdown
        self.init_seconds = 0.0

    @property
    def local_cpus(self) -> int:
        """CPUs the local cluster this runtime starts advertises (``num_cpus``, else this process's cores)."""
        return self.num_cpus if self.num_cpus is not None else len(os.sched_getaffinity(0))

    # ---- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> RayRuntime:
        """Connect to / start Ray. Idempotent."""
        import ray

        if self.session_dir is not None:
            return self
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        for name in ("ray", "vllm"):
            logging.getLogger(name).setLevel(self.ray_log_level)
        if ray.is_initialized():
            raise RuntimeError(
                "Ray is already initialized in this process; RayRuntime owns the connection. Use the existing "
                "RayRuntime or call ray.shutdown() first."
            )
        t = time.perf_counter()
        kwargs: dict[str, Any] = {
            "runtime_env": {"env_vars": dict(self.env_vars)},
            "log_to_driver": self.log_to_driver,
            "logging_level": self.ray_log_level,
            "configure_logging": True,
        }
        if self.address is None:
            self._prepare_local()
            kwargs.update(
                address="local",
                num_cpus=self.local_cpus,
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
            with _loopback_node_address(self.started_local or _is_loopback(self.address)):
                ctx = ray.init(**kwargs)
        except Exception as e:
            self.started_local = False
            self._release_local()
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

    def _prepare_local(self) -> None:
        """Sweep dead runs, make this run's private directories and token, start the watchdog, set the env."""
        run_guard.sweep_dead_runs()
        self.files = run_guard.RunFiles.create()
        if self._own_temp:
            self.temp_dir = str(self.files.ray_temp_dir)
        os.makedirs(self.temp_dir, mode=0o700, exist_ok=True)
        token_path = self.files.write_token()
        self._watchdog = run_guard.start_watchdog(self.files)
        env = {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": token_path,
            run_guard.RUN_ID_ENV: self.files.run_id,
            run_guard.STAGING_DIR_ENV: str(self.files.staging_dir),
        }
        self._saved_env = {k: os.environ.get(k) for k in (*env, "RAY_AUTH_TOKEN")}
        os.environ.pop("RAY_AUTH_TOKEN", None)  # it would take precedence over our file
        os.environ.update(env)
        _reload_ray_auth_config()

    def _release_local(self) -> None:
        """Undo :meth:`_prepare_local`: restore the environment, stop the watchdog (it cleans up), remove files."""
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self._saved_env:
            _reload_ray_auth_config()
        self._saved_env = {}
        run_guard.stop_watchdog(self._watchdog)
        self._watchdog = None
        if self.files is not None:
            self.files.remove()
            self.files = None

    @property
    def run_id(self) -> str | None:
        """The id every process of this (local) run carries in ``LHR_RUN_ID``; None when joined or not started."""
        return self.files.run_id if self.files is not None else None

    @property
    def staging_dir(self) -> str | None:
        """This run's private shared-memory staging directory (local runs)."""
        return str(self.files.staging_dir) if self.files is not None else None

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
            if (
                isinstance(pid, int)
                and pid not in self._pids
                and health.get("node_id") in (None, "", self._local_node_id())
            ):
                started = run_guard.process_start_time(pid)
                if started is not None:
                    self._pids[pid] = started

    def _local_node_id(self) -> str:
        try:
            import ray

            return ray.get_runtime_context().get_node_id()
        except Exception:
            return ""

    def leftover_processes(self) -> list[Any]:
        """Live processes of this runtime: Ray's (command line names the session/temp dir) + recorded replica processes
        (by pid *and* start time: a pid of a replica that exited may name another run's process since)."""
        import psutil

        me = os.getpid()
        out = []
        # A joined cluster's session dir also names its own daemons (raylet, agents, GCS): only our replicas' pids
        # count then. A local cluster is ours entirely: every process carrying its run id, or naming its dirs.
        if self.started_local and self.files is not None:
            watchdog = (self._watchdog.pid,) if self._watchdog is not None else ()
            markers = tuple(m for m in (self.session_dir, self.temp_dir, str(self.files.root)) if m)
            out = run_guard.run_processes(self.files.run_id, markers=markers, exclude=watchdog, recorded=self._tree)
        seen = {p.pid for p in out}
        for pid, started in self._pids.items():
            if pid in seen or pid == me:
                continue
            try:
                p = psutil.Process(pid)
                if run_guard.same_process(p.create_time(), started) and p.status() != psutil.STATUS_ZOMBIE:
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
        with contextlib.suppress(Exception):  # Ray's agents lose their parent (and their marks) as Ray stops
            for p in self.leftover_processes():
                with contextlib.suppress(psutil.Error):
                    self._tree[p.pid] = p.create_time()
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
        self._tree.clear()
        if self.started_local:
            self._release_local()  # the run's directories (Ray's session files among them), the watchdog, the env
        self.started_local = False
        return killed


def _session_dir(ray: Any) -> str:
    try:
        return ray._private.worker.global_worker.node.get_session_dir_path()
    except Exception:
        return ""


def _is_loopback(address: str | None) -> bool:
    """Whether a cluster address to join names a cluster reachable on this machine's loopback only.

    True for ``127.0.0.1:<port>`` / ``localhost:<port>`` when nothing answers on the machine's own address at that
    port (a cluster whose nodes were started on 127.0.0.1, e.g. ``ray.cluster_utils.Cluster``). A GCS that listens on
    every interface (``ray start --head``) answers there too and is joined the usual way: this driver then listens
    on the machine's address, which replicas on other machines need to fetch the objects it owns.
    """
    if not address or address in ("auto", "local") or "://" in address:
        return False
    host, _, port = address.rpartition(":")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
        return False
    import socket

    from ray._private import services

    try:
        machine = services.resolve_ip_for_localhost(host.strip("[]"))
    except Exception:  # no address of its own: loopback is all there is
        return True
    if machine in ("127.0.0.1", "localhost", "::1"):
        return True
    try:
        with socket.create_connection((machine, int(port)), timeout=1.0):
            return False
    except OSError:
        return True


@contextlib.contextmanager
def _loopback_node_address(local: bool) -> Any:
    """Keep a local cluster's node address at 127.0.0.1 (or join a cluster whose nodes are on loopback).

    ``ray.init(_node_ip_address="127.0.0.1")`` replaces a loopback address by the machine's own one
    (``resolve_ip_for_localhost``) unless ``ray_constants.ENABLE_RAY_CLUSTER`` is false; Ray's servers then bind to
    that address or every interface. Clearing the flag for the call keeps every server of the node on loopback. A
    joined address ``127.0.0.1:<port>`` is resolved the same way (to the machine's address, where a cluster whose
    nodes listen on loopback only cannot be reached), so joining such a cluster (:func:`_is_loopback`) clears the
    flag too.
    """
    if not local:
        yield
        return
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _reload_ray_auth_config() -> None:
    """Make this process's Ray see the current ``RAY_AUTH_MODE`` / token file (both are cached after import)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
