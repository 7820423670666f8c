"""A rollout replica = one :class:`~.vllm.driver.VLLMEngine` in a Ray actor, plus its driver-side handle.

``ReplicaActor`` (an async Ray actor) hosts the engine; on CPU it pins itself (every thread, so the engine-core
process it spawns inherits the mask) to an explicit core list and asks Ray for that many CPUs. Where it may run is
part of its :class:`ReplicaSpec` (custom Ray resources for a standalone replica, hard node affinity to its trainer
rank's node for a hybrid one, the rank's device on GPU), so a replacement launched from the same spec lands under
the same constraints (built by ``run/placement.py``).

:class:`ReplicaHandle` is what the load balancer, rollouter and controller hold: async methods mirroring the
:class:`~lightning_hybrid_rollout.rollout.engine.RolloutEngine` protocol and the weight push's
:class:`~lightning_hybrid_rollout.rollout.weights.receiver.WeightReceiver` protocol, translating a dead actor into
:class:`~lightning_hybrid_rollout.errors.ReplicaDeadError` (the type ``errors.is_replica_dead_error`` checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from lightning_hybrid_rollout.errors import ReplicaDeadError as ReplicaDeadError  # re-exported
from lightning_hybrid_rollout.rollout.drain import DrainReport
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
from lightning_hybrid_rollout.rollout.vllm.driver import VLLMEngine
from lightning_hybrid_rollout.rollout.weights.receiver import BucketPayload, Span

logger = logging.getLogger(__name__)

ReplicaRole = Literal["standalone", "hybrid"]
ReplicaState = Literal["starting", "active", "parked", "syncing", "stopped", "dead"]


def round_robin_cores(index: int, cpus_per_replica: int, available: Sequence[int] | None = None) -> list[int]:
    """Cores for replica ``index`` when none are given: consecutive blocks of the available cores, wrapping.

    Args:
        index: Replica position (0, 1, ...).
        cpus_per_replica: Cores each replica gets.
        available: Core ids to pick from (default: this process's affinity).
    """
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if not cores:
        raise RuntimeError("no CPU cores available for pinning")
    return sorted({cores[(index * cpus_per_replica + k) % len(cores)] for k in range(cpus_per_replica)})


def pin_process(cores: Sequence[int]) -> list[int]:
    """Pin every thread of this process (and so every child it starts later) to ``cores``; returns the mask."""
    mask = set(cores)
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):  # thread exited meanwhile
            os.sched_setaffinity(int(tid), mask)
    os.sched_setaffinity(0, mask)
    return sorted(os.sched_getaffinity(0))


def _process_tree_cpu_seconds(pid: int) -> dict[str, float]:
    import psutil

    out: dict[str, float] = {}
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[f"{p.pid}:{p.name()}"] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


@dataclass
class ReplicaSpec:
    """How to start one replica.

    Args:
        replica_id: Unique name (also the Ray actor name, prefixed ``lhr-replica-``).
        role: ``"standalone"`` (always generating) or ``"hybrid"`` (on the trainer's devices, woken on demand).
        engine: Engine settings.
        cpus: Ray CPUs (= cores pinned to on CPU).
        cpu_ids: Explicit cores to pin to (CPU only; default: round robin by ``index``).
        index: Position used for round-robin pinning.
        gpus: Ray GPUs (``tensor_parallel_size`` on a dedicated GPU; a fraction to share the trainer's GPU).
        placement_group: Ray placement group to schedule into (GPU path).
        bundle_index: Bundle of ``placement_group``.
        resources: Custom Ray resources the actor asks for (a standalone replica: one unit of
            ``RolloutConfig.standalone_resource``, so Ray places it only on the nodes advertising it).
        node_id: Ray node the actor must run on (hard node affinity; a hybrid replica: its trainer rank's node).
            Ignored when ``placement_group`` is set.
        cuda_devices: GPU only: the node-local device indices the actor sees (``CUDA_VISIBLE_DEVICES``; a hybrid
            replica: its trainer rank's device). Ray still counts ``gpus`` on the node but is told not to choose the
            devices itself. ``None``: Ray's choice.
        env: Extra environment variables for the actor.
        weight_version: Version of the weights the engine starts with.
        pin: Pin to ``cpu_ids`` (CPU only).
        generation: 0 for the first actor of this replica; each replacement after a failure counts up.
    """

    replica_id: str
    role: ReplicaRole
    engine: VLLMEngineConfig
    cpus: int = 1
    cpu_ids: list[int] | None = None
    index: int = 0
    gpus: float = 0.0
    placement_group: Any = None
    bundle_index: int = -1
    resources: dict[str, float] = field(default_factory=dict)
    node_id: str | None = None
    cuda_devices: list[int] | None = None
    env: dict[str, str] = field(default_factory=dict)
    weight_version: int = 0
    pin: bool = True
    generation: int = 0

    @property
    def actor_name(self) -> str:
        """The Ray actor's name: ``lhr-replica-<replica_id>``, with ``-r<generation>`` for a replacement (a dead
        actor's name may still be taken while Ray reaps it)."""
        return f"lhr-replica-{self.replica_id}" + (f"-r{self.generation}" if self.generation else "")

    def actor_env(self) -> dict[str, str]:
        """Environment of the actor process (inherited by the engine core it spawns)."""
        env = dict(self.engine.process_env(on_cuda=self.gpus > 0))
        env["OMP_NUM_THREADS"] = str(max(1, self.cpus))
        env["RAY_DEDUP_LOGS"] = "0"
        # vLLM's caches are shared between runs, as for any vLLM user: the user's VLLM_CACHE_ROOT, else vLLM's own
        # default (~/.cache/vllm). A cache per run made every engine start re-inspect the model in a subprocess
        # (vLLM's model-info cache: ~10 s of a core per start on this CPU); its entries are keyed by a hash of the
        # model code and written atomically, so runs and replicas starting together share them safely.
        if os.environ.get("VLLM_CACHE_ROOT"):
            env["VLLM_CACHE_ROOT"] = os.environ["VLLM_CACHE_ROOT"]
        if self.cuda_devices is not None and self.gpus > 0:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in self.cuda_devices)
            env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"  # else Ray overwrites it with its own pick
        env.update(self.env)
        return env


class ReplicaActor:
    """The Ray actor body (decorated at launch time by :meth:`ReplicaHandle.launch`)."""

    def __init__(self, spec_dict: dict[str, Any], engine_cfg: dict[str, Any]) -> None:
        self.replica_id: str = spec_dict["replica_id"]
        self.role: ReplicaRole = spec_dict["role"]
        self.cores: list[int] = []
        cfg = VLLMEngineConfig(**engine_cfg)
        if cfg.run_dir:
            cfg.run_dir = os.path.join(cfg.run_dir, self.replica_id)
        if spec_dict.get("pin", True) and not cfg.on_cuda and hasattr(os, "sched_setaffinity"):
            cores = spec_dict.get("cpu_ids") or round_robin_cores(spec_dict.get("index", 0), spec_dict.get("cpus", 1))
            self.cores = pin_process(cores)
        self.engine = VLLMEngine(cfg, self.replica_id, spec_dict.get("weight_version", 0))

    async def start(self) -> dict[str, Any]:
        """Start the engine (blocking part in a thread); returns :meth:`health`."""
        if self.engine.llm is None:
            await asyncio.to_thread(self.engine.start)
            await self.engine.post_start()
        return await self.health()

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        return await self.engine.generate(request_id, prompt_token_ids, sampling)

    async def generate_group(
        self, requests: list[tuple[str, list[int], SamplingSpec]]
    ) -> list[GenerationResult | BaseException]:
        return await self.engine.generate_group(requests)

    async def abort(self, request_ids: list[str]) -> None:
        await self.engine.abort(request_ids)

    async def drain(self, budget_s: float) -> DrainReport:
        return await self.engine.drain(budget_s)

    async def sleep(self) -> float:
        return await self.engine.sleep()

    async def wake_up(self) -> float:
        return await self.engine.wake_up()

    async def weights_checksum(self) -> str:
        return await self.engine.weights_checksum()

    # ---- weight updates: the WeightReceiver protocol (rollout/weights/receiver.py), forwarded to the engine -------
    async def attach_node_staging(self, path: str, size: int, inode: int) -> bool:
        return await self.engine.attach_node_staging(path, size, inode)

    async def begin_weight_update(self, version: int, total_bytes: int = 0, keep: bool = False) -> None:
        await self.engine.begin_weight_update(version, total_bytes, keep)

    async def load_weight_from_node_staging(self, spans: list[Span]) -> dict[str, Any]:
        return await self.engine.load_weight_from_node_staging(spans)

    async def load_weight_bucket(self, bucket: BucketPayload) -> dict[str, Any]:
        return await self.engine.load_weight_bucket(bucket)

    async def stage_weight_bucket(self, bucket: BucketPayload, offset: int, total_bytes: int) -> float:
        return await self.engine.stage_weight_bucket(bucket, offset, total_bytes)

    async def load_weight_from_staging(self, spans: list[Span]) -> dict[str, Any]:
        return await self.engine.load_weight_from_staging(spans)

    async def abort_weight_update(self) -> None:
        await self.engine.abort_weight_update()

    async def finish_weight_update(self) -> str:
        return await self.engine.finish_weight_update()

    async def receive_weights(self, transport: str, request: Any) -> dict[str, Any]:
        return await self.engine.receive_weights(transport, request)

    async def health(self) -> dict[str, Any]:
        """The engine's health, plus the role, the pinned cores, the Ray node and ``monotonic``: this host's
        ``time.monotonic()`` right after the engine answered (a caller on the same node places the answer's counters
        on its own clock with it)."""
        h = await self.engine.health()
        now = time.monotonic()
        h.update(role=self.role, cores=self.cores, node_id=_node_id(), monotonic=now)
        return h

    async def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by this actor's process and its children (the engine core), per process."""
        return _process_tree_cpu_seconds(os.getpid())

    async def shutdown(self) -> None:
        await self.engine.shutdown()


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # not in Ray
        return ""


class ReplicaHandle:
    """Driver-side async handle of one replica actor.

    Args:
        actor: The Ray actor handle.
        spec: How it was started.
    """

    def __init__(self, actor: Any, spec: ReplicaSpec) -> None:
        self.actor = actor
        self.spec = spec
        self.replica_id = spec.replica_id
        self.role: ReplicaRole = spec.role
        self.info: dict[str, Any] = {}
        self._dead: BaseException | None = None
        self._start_ref: Any = None
        self.launch_seconds = 0.0
        self._t_launch = time.perf_counter()

    def __repr__(self) -> str:
        return f"ReplicaHandle({self.replica_id!r}, role={self.role!r}, alive={self.is_alive})"

    # ---- launch ---------------------------------------------------------------------------------------------------
    @classmethod
    def launch(cls, spec: ReplicaSpec) -> ReplicaHandle:
        """Create the actor and start its engine in the background; await :meth:`wait_ready` before use."""
        import ray

        remote_cls = ray.remote(ReplicaActor)
        opts: dict[str, Any] = {
            "name": spec.actor_name,
            "num_cpus": spec.cpus,
            "num_gpus": spec.gpus,
            "max_concurrency": 4096,
            "max_restarts": 0,
            "runtime_env": {"env_vars": spec.actor_env()},
        }
        if spec.resources:
            opts["resources"] = dict(spec.resources)
        if spec.placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=spec.placement_group,
                placement_group_bundle_index=spec.bundle_index,
                placement_group_capture_child_tasks=True,
            )
        elif spec.node_id:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=spec.node_id, soft=False)
        spec_dict = {k: v for k, v in asdict(spec).items() if k not in ("engine", "placement_group", "env")}
        actor = remote_cls.options(**opts).remote(spec_dict, asdict(spec.engine))
        h = cls(actor, spec)
        h._start_ref = actor.start.remote()
        return h

    async def wait_ready(self, timeout: float | None = 600.0) -> dict[str, Any]:
        """Wait until the engine is up; returns its health dict."""
        if self._start_ref is None:
            return self.info
        try:
            self.info = await asyncio.wait_for(self._call_ref(self._start_ref), timeout)
        except TimeoutError as e:
            raise TimeoutError(
                f"replica {self.replica_id} did not start within {timeout} s (engine start is ~5-30 s on CPU; "
                f"is Ray short of CPUs for num_cpus={self.spec.cpus}?)"
            ) from e
        self._start_ref = None
        self.launch_seconds = time.perf_counter() - self._t_launch
        return self.info

    # ---- calls ----------------------------------------------------------------------------------------------------
    @property
    def is_alive(self) -> bool:
        """False once a call found the actor dead (or after :meth:`kill`)."""
        return self._dead is None

    async def _call_ref(self, ref: Any) -> Any:
        import ray

        if self._dead is not None:
            raise ReplicaDeadError(self.replica_id, self._dead)
        try:
            return await ref
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as e:
            self._dead = e
            raise ReplicaDeadError(self.replica_id, e) from e

    async def _call(self, method: str, *args: Any) -> Any:
        if self._dead is not None:
            raise ReplicaDeadError(self.replica_id, self._dead)
        return await self._call_ref(getattr(self.actor, method).remote(*args))

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        """See :meth:`VLLMEngine.generate`."""
        return await self._call("generate", request_id, list(prompt_token_ids), sampling)

    async def generate_group(
        self, requests: list[tuple[str, list[int], SamplingSpec]]
    ) -> list[GenerationResult | BaseException]:
        """A prompt group's requests in one actor call; see :meth:`VLLMEngine.generate_group`."""
        return await self._call("generate_group", [(rid, list(ids), spec) for rid, ids, spec in requests])

    async def abort(self, request_ids: list[str]) -> None:
        """See :meth:`VLLMEngine.abort`."""
        await self._call("abort", list(request_ids))

    async def drain(self, budget_s: float) -> DrainReport:
        """See :meth:`VLLMEngine.drain`."""
        return await self._call("drain", float(budget_s))

    async def sleep(self) -> float:
        """Park (CPU) / sleep (GPU); returns the engine-side seconds."""
        return await self._call("sleep")

    async def wake_up(self) -> float:
        """Undo :meth:`sleep`; returns the engine-side seconds."""
        return await self._call("wake_up")

    async def weights_checksum(self) -> str:
        """See :meth:`VLLMEngine.weights_checksum`."""
        return await self._call("weights_checksum")

    # ---- weight updates: the WeightReceiver protocol (rollout/weights/receiver.py) --------------------------------
    async def attach_node_staging(self, path: str, size: int, inode: int) -> bool:
        """See :meth:`VLLMEngine.attach_node_staging`."""
        return await self._call("attach_node_staging", path, size, inode)

    async def begin_weight_update(self, version: int, total_bytes: int = 0, keep: bool = False) -> None:
        """See :meth:`VLLMEngine.begin_weight_update`."""
        await self._call("begin_weight_update", version, total_bytes, keep)

    async def load_weight_from_node_staging(self, spans: list[Span]) -> dict[str, Any]:
        """See :meth:`VLLMEngine.load_weight_from_node_staging`."""
        return await self._call("load_weight_from_node_staging", spans)

    async def load_weight_bucket(self, bucket: BucketPayload) -> dict[str, Any]:
        """See :meth:`VLLMEngine.load_weight_bucket` (an ObjectRef arrives as a zero-copy view)."""
        return await self._call("load_weight_bucket", bucket)

    async def stage_weight_bucket(self, bucket: BucketPayload, offset: int, total_bytes: int) -> float:
        """See :meth:`VLLMEngine.stage_weight_bucket`."""
        return await self._call("stage_weight_bucket", bucket, offset, total_bytes)

    async def load_weight_from_staging(self, spans: list[Span]) -> dict[str, Any]:
        """See :meth:`VLLMEngine.load_weight_from_staging`."""
        return await self._call("load_weight_from_staging", spans)

    async def abort_weight_update(self) -> None:
        """See :meth:`VLLMEngine.abort_weight_update`."""
        await self._call("abort_weight_update")

    async def finish_weight_update(self) -> str:
        """See :meth:`VLLMEngine.finish_weight_update`."""
        return await self._call("finish_weight_update")

    async def receive_weights(self, transport: str, request: Any) -> dict[str, Any]:
        """See :meth:`VLLMEngine.receive_weights`."""
        return await self._call("receive_weights", transport, request)

    async def health(self) -> dict[str, Any]:
        """Engine state, weight version, in-flight count, tokens generated, pids, pinned cores, node, and the
        actor's ``time.monotonic()`` when the engine answered."""
        h = await self._call("health")
        self.info = h
        return h

    async def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds of the actor process and its children so far (``"pid:name" -> seconds``)."""
        return await self._call("cpu_seconds")

    async def shutdown(self, timeout: float = 20.0) -> None:
        """Stop the engine gracefully, then kill the actor."""
        if self._dead is None:
            try:
                await asyncio.wait_for(self._call("shutdown"), timeout)
            except (ReplicaDeadError, TimeoutError):
                pass
            except Exception as e:  # a failing engine shutdown must not stop the kill
                logger.warning("replica %s: engine shutdown failed: %r", self.replica_id, e)
        self.kill()

    def kill(self) -> None:
        """Kill the actor immediately (its engine core dies with it; see ``RayRuntime``)."""
        import ray

        if self._dead is None:
            self._dead = RuntimeError("killed by the driver")
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.actor, no_restart=True)
