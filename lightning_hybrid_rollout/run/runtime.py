"""RolloutRuntime: the rollout side of one run (Ray, replicas, queue, rollouter), and the queries the callback uses.

Lives on global rank 0 of the trainer. The callback owns one and reads it through :class:`RuntimeQueries`; the
controller drives its :attr:`pool` (:class:`~lightning_hybrid_rollout.run.hybrid_pool.HybridReplicaPool`).
CPU placement is :mod:`~lightning_hybrid_rollout.run.placement`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.errors import ReplicaFailureError, WeightSyncError
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.event_loop import EventLoopThread
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.run.decode_probe import DecodeProgressProbe
from lightning_hybrid_rollout.run.hybrid_pool import HybridReplicaPool, NoTrainer, OverlapReport, TrainerLink
from lightning_hybrid_rollout.run.placement import (
    check_local_placement,
    pin_trainer_process,
    place_replicas,
    plan_cpu_placement,
)
from lightning_hybrid_rollout.run.tracer import RunTracer, trace_track

if TYPE_CHECKING:
    from lightning_hybrid_rollout.run.workload import PromptFeed, Workload

__all__ = [
    "HybridReplicaPool",
    "NoTrainer",
    "OverlapReport",
    "RolloutRuntime",
    "RuntimeQueries",
    "TrainerLink",
    "pin_trainer_process",
    "plan_cpu_placement",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


def refill_cap(max_num_gen_batches: int, step_required_samples: int) -> int | None:
    """The samples the group filter may drop per sync cycle: ``(max_num_gen_batches - 1) x step_required_samples``
    (``None``: no cap, for 0)."""
    if max_num_gen_batches <= 0:
        return None
    return (max_num_gen_batches - 1) * step_required_samples


class RuntimeQueries:
    """The narrow interface through which the callback reads and drives the rollout side's data plane.

    Implemented over ``self.queue`` (the :class:`~lightning_hybrid_rollout.rollout.message_queue.MessageQueue`) and
    ``self.rollouter`` (the :class:`~lightning_hybrid_rollout.rollout.rollouter.Rollouter`); the callback never
    reaches into either directly, so a test double only needs these two attributes and this base class.
    """

    queue: Any
    rollouter: Any
    #: The last taken window's prefix-cache hit rate (:meth:`prefix_cache_hit_rate`).
    _prefix_cache_hit_rate: float = 0.0

    _cycle_sync_bytes: int = 0

    def take_cycle_sync_bytes(self) -> int:
        """Payload bytes of the weight pushes since the last call, one copy per push (a cycle's
        ``dynamic_resource/weight_sync_bytes``; full weights or the LoRA adapter alone)."""
        taken, self._cycle_sync_bytes = self._cycle_sync_bytes, 0
        return taken

    def queue_size(self) -> int:
        """Samples buffered now."""
        return int(self.queue.size())

    def samples_put(self) -> int:
        """Samples ever put into the queue (a counter: the difference over an interval is what arrived)."""
        return int(self.queue.total_put)

    def wait_for_samples(self, n: int, timeout: float) -> bool:
        """Block until the queue holds ``n`` samples (True) or ``timeout`` seconds passed (False)."""
        return bool(self.queue.wait_until(n, timeout=timeout))

    def take_samples(self, n: int, timeout: float) -> list[Any]:
        """Remove and return ``n`` samples (oldest first)."""
        return list(self.queue.get_batch(n, timeout=timeout))

    def queue_state(self) -> dict[str, Any]:
        """The buffered samples, for a checkpoint."""
        return dict(self.queue.state_dict())

    def restore_queue(self, state: dict[str, Any]) -> None:
        """Put a checkpoint's buffered samples back."""
        self.queue.load_state_dict(state)

    def prompts_skipped_too_long(self) -> int:
        """Prompts skipped because they are longer than ``rollout.prompt_length`` tokens (since the run began)."""
        feed = getattr(self, "prompt_feed", None)
        return int(feed.skipped_too_long) if feed is not None else 0

    def generated_samples(self) -> int:
        """Samples the rollouter completed since it started and the group filter did not drop (the accepted ones:
        what the policies count)."""
        counters = self.rollouter.counters()
        return int(counters.get("total_generated_samples", 0)) - int(counters.get("total_filtered_samples", 0))

    def set_weight_version(self, version: int) -> None:
        """Samples generated from now on are stamped with ``version``."""
        self.rollouter.update_weight_version(version)

    def new_param_version(self, version: int) -> Any:
        """A weight sync finished: reset the staleness budget (its stats are returned) and stamp ``version``."""
        stats = self.rollouter.reset_staleness()
        self.rollouter.update_weight_version(version)
        return stats

    def peek_role_window(self) -> Any:
        """The cycle's per-role production so far, without starting a new window."""
        return self.rollouter.peek_role_window()

    def take_role_window(self) -> Any:
        """The cycle's per-role production, starting a new window."""
        window = self.rollouter.take_role_window()
        self._prefix_cache_hit_rate = float(getattr(window, "prefix_cache_hit_rate", 0.0))
        return window

    def prefix_cache_hit_rate(self) -> float:
        """Cached prompt tokens over prompt tokens of the segments returned in the last taken window (the cycle's:
        ``rollout/prefix_cache_hit_rate``)."""
        return self._prefix_cache_hit_rate

    # replica failures: none in a test double (RolloutRuntime replaces failed replicas)

    @property
    def colocated_fallback(self) -> bool:
        """Every standalone replica is gone and only the hybrid ones can generate."""
        return False

    def supervise(self, weights: list[tuple[str, Any]] | None, version: int, *, probe: bool) -> None:
        """Find failed replicas and replace them (see :meth:`RolloutRuntime.supervise`)."""

    def replica_restarts(self) -> int:
        """Replicas replaced since the run began."""
        return 0

    def probe_decode_progress(self) -> None:
        """Sample each standalone replica's generated tokens into the trace (see
        :meth:`RolloutRuntime.probe_decode_progress`); nothing in a test double."""


class RolloutRuntime(RuntimeQueries):
    """Ray + standalone/hybrid vLLM replicas + message queue + rollouter for one training run.

    Args:
        rollout: Rollout configuration.
        async_training: Async-training configuration (queue bound, staleness, partial rollout).
        workload: What the run trains on: its prompt source, rendering, reward functions and stop tokens
            (:class:`~lightning_hybrid_rollout.run.workload.Workload`).
        run_dir: Run directory (vLLM temp files, the trace).
        trace: Write ``trace.json`` (Chrome trace events) to ``run_dir``.
        trainer: What the hybrid pool asks of the trainer side (:class:`TrainerLink`; default: nothing to offload,
            no weights, version 0).
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        async_training: AsyncTrainingConfig,
        workload: Workload | None,
        run_dir: str | os.PathLike[str],
        trace: bool = True,
        trainer: TrainerLink | None = None,
        hybrid_node_ips: list[str] | None = None,
        lora: dict[str, Any] | None = None,
    ) -> None:
        self.rollout = rollout
        self.async_training = async_training
        self.workload = workload
        #: The rollouter's prompt iterable (its position is in the rollouter's state_dict); built at start.
        self.prompt_feed: PromptFeed | None = None
        #: Each trainer rank's node address when the ranks span several hosts (hybrid replica ``i`` goes to rank
        #: ``i``'s node); None: every hybrid replica on this process's node.
        self.hybrid_node_ips = hybrid_node_ips
        #: The LoRA adapter's engine fields when weight syncs send the adapter alone (``rollout.lora_sync: adapter``,
        #: :func:`~lightning_hybrid_rollout.training.lora.engine_lora_config`): the engines start with LoRA on;
        #: None: plain engines, full-weight syncs.
        self.lora = lora
        self.run_dir = Path(run_dir)
        self.trainer: TrainerLink = trainer if trainer is not None else NoTrainer()
        self.queue = MessageQueue(maxsize=async_training.max_required_samples)
        self.standalone: list[Any] = []
        self.hybrid: list[Any] = []
        self.pool = HybridReplicaPool(self)
        self.rollouter: Any = None
        self.ray: Any = None
        #: The trainer process's one event loop: the rollouter produces on it, the control calls run on it.
        self.loop = EventLoopThread("lhr-runtime")
        self.last_sync_report: Any = None
        #: The weight push (``rollout.weight_transport``; built at start, or at the first push without one).
        self.weights: Any = None
        self.standalone_sync_reports: list[Any] = []
        self.last_hybrid_sync_report: Any = None
        #: Finds failed replicas and starts their replacements (built at start).
        self.supervisor: Any = None
        self._joining: list[Any] = []  # replacements that are up, waiting for weights of the current version
        #: The run's trace (``trace.json``; every call a no-op with ``trace=False``).
        self.tracer = RunTracer(self.run_dir / "trace.json" if trace else None, self.run_dir.name)
        #: Each standalone replica's generated tokens at the trainer's ``training`` boundaries (with a trace only).
        self._decode_probe: DecodeProgressProbe | None = None
        if self.tracer.writer is not None:
            self._decode_probe = DecodeProgressProbe(self.tracer.writer, self.loop, self.tracer.ts, trace_track)

    # ----------------------------------------------------------------------------------------------- lifecycle

    def _engine_config(self) -> Any:
        from lightning_hybrid_rollout.rollout.vllm.config import engine_config_from_rollout

        return engine_config_from_rollout(self.rollout, self.run_dir / "vllm", lora=self.lora)

    def check_engine_args(self) -> None:
        """vLLM's own check of the engines' arguments, before any replica starts, when the run sets any beyond
        the defaults (``engine_kwargs``, ``max_model_len``, ``enable_prefix_caching``, ``tensor_parallel_size``):
        importing vLLM in the trainer process costs seconds, and the typed fields are checked by the config."""
        r = self.rollout
        if not (
            r.engine_kwargs or r.max_model_len is not None or r.enable_prefix_caching is not None or self.lora
        ) and (r.tensor_parallel_size == 1):
            return
        from lightning_hybrid_rollout.hub import resolve_model_path
        from lightning_hybrid_rollout.rollout.vllm.config import engine_kwargs_for
        from lightning_hybrid_rollout.rollout.vllm.engine_args import check_engine_args

        cfg = self._engine_config()  # a hub id is checked as the snapshot directory the replicas will load
        cfg = dataclasses.replace(cfg, model=resolve_model_path(cfg.model, cfg.revision), revision=None)
        check_engine_args(engine_kwargs_for(cfg, on_cuda=r.gpus_per_replica > 0))

    def start(self) -> RolloutRuntime:
        """Start Ray and the replicas (hybrid ones parked), build the rollouter (not yet generating)."""
        from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime
        from lightning_hybrid_rollout.rollout.rollouter import Rollouter
        from lightning_hybrid_rollout.rollout.weights.router import WeightRouter

        r = self.rollout
        self.check_engine_args()
        # cuda_ipc without CUDA: one line, before anything starts; a LoRA adapter-only sync is always full
        self.weights = WeightRouter(r.weight_transport, r.weight_encoding if self.lora is None else "full")
        s_cores, h_cores = plan_cpu_placement(r.standalone_replicas, r.hybrid_replicas, r.cpus_per_replica)
        ray = RayRuntime(address=r.ray_address)
        # against the CPUs the local Ray will advertise, before it is started
        check_local_placement(r, self._engine_config(), s_cores, h_cores, cpus=ray.local_cpus)
        t0 = time.monotonic()
        self.ray = ray.start()
        # by role: standalone replicas on the nodes advertising rollout.standalone_resource, hybrid ones on their
        # trainer ranks' nodes (``hybrid_node_ips``: each rank's node address when the trainer spans several nodes;
        # None: this node); a replica the cluster cannot place is refused here, before anything is launched
        specs = place_replicas(r, self._engine_config(), s_cores, h_cores, self.hybrid_node_ips)
        if r.gpus_per_replica == 0 and r.pin_trainer:
            pin_trainer_process(sorted({c for cores in h_cores for c in cores}))
        handles = self.ray.start_replicas(specs)
        from lightning_hybrid_rollout.rollout.replica_supervisor import ReplicaSupervisor

        self.supervisor = ReplicaSupervisor(
            self._start_replacement,
            health_timeout_s=r.replica_health_timeout_s,
            max_restarts=r.max_replica_restarts,
        )
        self.standalone = [h for h in handles if h.role == "standalone"]
        self.hybrid = [h for h in handles if h.role == "hybrid"]
        if self.hybrid:
            self.pool.park_started()  # hybrid replicas start parked, outside the load balancer
        kv_tokens = {h.replica_id: h.info.get("kv_cache_tokens") for h in handles}
        self.tracer.describe_tracks(self.rollout.concurrent_samples_per_replica, s_cores, h_cores, kv_tokens)
        self.set_state([h.replica_id for h in self.standalone], "active")
        self.set_state([h.replica_id for h in self.hybrid], "parked")
        log.info(
            "rollout runtime up in %.1fs: %d standalone (cores %s), %d hybrid (cores %s); actor pids %s",
            time.monotonic() - t0,
            len(self.standalone),
            s_cores,
            len(self.hybrid),
            h_cores,
            ", ".join(f"{h.replica_id}={h.info.get('frontend_pid')}" for h in handles),
        )
        a = self.async_training
        w = self.workload
        if w is None:
            raise RuntimeError("RolloutRuntime.start needs a workload (prompts, rewards, tokenizer)")
        self.prompt_feed = w.prompt_feed()
        if w.episodes is not None and self.tracer.writer is not None:
            w.episodes.on_span = self.trace_tool_call  # the tool/environment calls' spans: the trace's tools lanes
        self.rollouter = Rollouter(
            self.prompt_feed,
            w.tokenizer.encode,
            w.scorer(),
            self.queue,
            sampling=SamplingSpec(
                max_tokens=r.response_length,
                temperature=r.temperature,
                top_p=r.top_p,
                stop_token_ids=tuple(w.stop_token_ids),
            ),
            replicas=self.standalone,
            n_samples_per_prompt=r.n,
            max_required_samples=a.max_required_samples,
            concurrent_samples_per_replica=r.concurrent_samples_per_replica,
            partial_rollout=a.partial_rollout,
            group_filter=w.group_filter,
            max_filtered_samples=refill_cap(r.max_num_gen_batches, a.step_required_samples),
            episodes=w.episodes,
        )
        return self

    def start_generation(self) -> None:
        """Start producing samples, on the runtime's event loop."""
        if not self.rollouter.is_running:
            self.rollouter.start(loop_thread=self.loop)

    def stop(self) -> None:
        """Stop the rollouter, the replicas and Ray (no leftover processes), and close the trace."""
        if self._decode_probe is not None:
            self._decode_probe.close()  # its calls still out are dropped: nothing is written from here on
        if self.supervisor is not None and self.loop.is_alive:
            self.loop.call(self.supervisor.cancel)
        try:
            if self.rollouter is not None and self.rollouter.is_running:
                self.rollouter.stop()
        finally:
            try:
                if self.ray is not None:
                    self.ray.shutdown()
            finally:
                if self.weights is not None:
                    self.weights.close()  # the collective transport's broadcast groups
                self.loop.close()
                self.tracer.close()

    def check_health(self) -> None:
        """Raise the rollouter's error, if it failed."""
        err = self.rollouter.error if self.rollouter is not None else None
        if err is not None:
            raise RuntimeError(f"the rollouter stopped with an error: {err}") from err

    # ---------------------------------------------------------------------------------------------- failures

    async def _start_replacement(self, spec: Any) -> Any:
        """One replacement replica, up (a hybrid one parked, like at the start); tracked for the shutdown."""
        (handle,) = await self.ray.start_replicas_async([spec])
        if handle.role == "hybrid":
            await handle.sleep()
        return handle

    @property
    def colocated_fallback(self) -> bool:
        """Every standalone replica is gone (replacements not joined yet, or given up): only the hybrid ones can
        generate, so they must be lent at every sync (the callback forces the activation)."""
        return self.rollout.standalone_replicas > 0 and not self.standalone and bool(self.hybrid)

    def replica_restarts(self) -> int:
        """Replicas replaced since the run began (``dynamic_resource/replica_restarts``)."""
        return self.supervisor.restarts if self.supervisor is not None else 0

    def supervise(self, weights: list[tuple[str, Any]] | None, version: int, *, probe: bool) -> None:
        """Find failed replicas, start their replacements, and let each replacement that is up join.

        A failed replica leaves the runtime's lists (the load balancer already routes around a dead handle; its
        in-flight samples continue elsewhere from their prefix). A replacement joins only after it holds
        ``weights`` (verified by checksum): a standalone one then takes requests; a hybrid one joins its slot in
        the pool parked (the next activation that lends the slot wakes and syncs it), or awake and routable when the
        slot is lent now (k of n lending: the other slots stay as they are).

        Args:
            weights: The trainer's full weights of ``version`` (``None`` before the first gather: the replacement's
                weights from disk are version 0).
            version: The current parameter version.
            probe: Also ask each live replica for its health (``rollout.replica_health_timeout_s``); without it only
                replicas already known dead are handled (cheap: no call).

        Raises:
            ReplicaFailureError: No replica is left and none is starting.
        """
        sup = self.supervisor
        if sup is None:
            return
        # a replacement up but waiting for this version's weights may die there too: a failed start, retried
        for replica, why in self.loop.run(sup.find_failed(self._joining, probe=probe)):
            self._joining.remove(replica)
            self.loop.call(lambda r=replica, w=why: sup.failed_to_join(r, ReplicaFailureError(w)))
        failed = self.loop.run(sup.find_failed([*self.standalone, *self.hybrid], probe=probe))
        for replica, why in failed:
            for role_list in (self.standalone, self.hybrid):
                if replica in role_list:
                    role_list.remove(replica)
            if replica.role == "hybrid":
                self.pool.replica_failed(replica.replica_id)  # its replacement holds nothing the pool verified
            self.set_state([replica.replica_id], "restarting")
            self.loop.call(lambda r=replica, w=why: sup.replace(r, w))
        self._joining.extend(self.loop.call(sup.take_ready))
        joining, self._joining = self._joining, []
        for replica in joining:
            self._join(replica, weights, version)
        if not (self.standalone or self.hybrid or sup.starting or self._joining):
            lines = "; ".join(f"{e.replica_id} {e.kind}: {e.detail}" for e in sup.events[-6:])
            raise ReplicaFailureError(
                f"no rollout replica is left and none could be started (rollout.max_replica_restarts="
                f"{sup.max_restarts}); last events: {lines}. Check the replicas' logs under {self.run_dir}, then "
                "resume from the checkpoint."
            )

    def _join(self, replica: Any, weights: list[tuple[str, Any]] | None, version: int) -> None:
        sup = self.supervisor
        rid = replica.replica_id
        # a hybrid replacement follows its own slot: awake and current only if that slot is lent (k of n lending)
        lent = replica.role == "hybrid" and self.pool.is_awake(rid)
        verified: int | None = None
        try:
            if replica.role == "standalone" or lent:
                if replica.role == "hybrid":
                    self.loop.run(replica.wake_up())
                if weights:
                    self.loop.run(self.push_async(weights, [replica], version))  # raises unless verified
                    verified = version
                elif version != 0:
                    self._joining.append(replica)  # no weights of this version here: the next boundary's
                    return
        except Exception as err:
            failure = err
            self.loop.call(lambda: sup.failed_to_join(replica, failure))
            return
        if replica.role == "standalone":
            self.standalone.append(replica)
            if self.rollouter is not None:
                self.rollouter.add_replicas([replica])
            self.set_state([rid], "active")
        else:
            self.hybrid.append(replica)
            self.pool.replica_joined(rid, verified)
            routed = self.pool.is_routing(rid)
            if routed and self.rollouter is not None:  # else the next activation that lends its slot adds it
                self.rollouter.add_replicas([replica])
            self.set_state([rid], "active" if routed else "parked")
        sup.joined(replica)
        # the slot's "restarting" span ends here; the counter marks the join
        self.tracer.counter("replica_restarts", time.monotonic(), sup.restarts)

    # ------------------------------------------------------------------------------------------------ data

    def rollouter_state(self) -> dict[str, Any]:
        """For a checkpoint, taken atomically on the loop: the rollouter's counters, its unfinished groups (with
        their generated prefixes), the buffered samples and the prompt stream's position.

        A running rollouter is paused with its in-flight requests aborted first, so every token generated so far is
        in a kept segment (partial rollout) and in the checkpoint, then resumed: a resume regenerates nothing.
        """
        ro = self.rollouter
        if not ro.is_running or ro.is_paused:
            return dict(ro.state_dict())
        ro.pause(abort_in_flight=True)
        try:
            return dict(ro.state_dict())
        finally:
            ro.resume()

    def restore_rollouter(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`rollouter_state` (before generation starts): unfinished groups continue first, the prompt
        stream continues where it stopped."""
        self.rollouter.load_state_dict(state)

    # --------------------------------------------------------------------------------------------- weights

    async def push_async(
        self, weights: list[tuple[str, Any]], replicas: Sequence[Any], version: int, **options: Any
    ) -> tuple[Any, float]:
        """Push full weights to ``replicas`` on the runtime's loop (checksum-verified).

        Several pushes may run concurrently (each takes its own node staging file).

        Args:
            weights: ``[(name, tensor), ...]``; nothing is pushed when empty.
            replicas: Target replica handles; nothing is pushed when empty.
            version: The weight version the replicas report afterwards.
            **options: Passed to :meth:`~lightning_hybrid_rollout.rollout.weights.router.WeightRouter.push`.

        Returns:
            ``(SyncReport or None, seconds)``.
        """
        if not replicas or not weights:
            return None, 0.0
        if self.weights is None:
            from lightning_hybrid_rollout.rollout.weights.router import WeightRouter

            encoding = self.rollout.weight_encoding if self.lora is None else "full"
            self.weights = WeightRouter(self.rollout.weight_transport, encoding)
        t0 = time.monotonic()
        try:
            report = await self.weights.push(weights, list(replicas), version, **options)
        except WeightSyncError as err:
            dead = {r.replica_id for r in replicas if not r.is_alive}
            if not dead or set(err.failures) - dead or err.report is None:
                raise
            # the replicas that died under the push leave at the next supervise(); the others hold `version`
            log.warning("weight sync v%d: replica(s) %s died during the push; the others took it", version, dead)
            report = err.report
        if report is not None:
            self._cycle_sync_bytes += int(report.bytes)
        return report, time.monotonic() - t0

    def push(self, weights: list[tuple[str, Any]], replicas: Sequence[Any], version: int) -> float:
        """Push full weights to ``replicas`` (checksum-verified); returns seconds."""
        report, seconds = self.loop.run(self.push_async(weights, replicas, version))
        if report is not None:
            self.last_sync_report = report
        return seconds

    async def _set_syncing(self, ids: list[str], syncing: bool) -> None:
        """Tell the rollouter, on the loop both run on (no thread hop, nothing blocks)."""
        if self.rollouter is not None and ids:
            await self.rollouter.set_syncing_async(ids, syncing)

    async def _push_standalone_async(self, weights: list[tuple[str, Any]], version: int) -> float:
        """The standalone weight sync with its bookkeeping, on the runtime's loop; returns seconds.

        The one coroutine behind both :meth:`push_standalone` and :meth:`push_standalone_overlapped`: options of
        the standalone sync go here (``async_training.staged_standalone_sync``: a staged push, the replicas count as
        syncing from its commit only). The rollouter is told
        (:meth:`~lightning_hybrid_rollout.rollout.rollouter.Rollouter.set_syncing`), so the sync does not count as
        standalone serving time.
        """
        ids = [r.replica_id for r in self.standalone]
        options: dict[str, Any] = {"keep": True} if self.async_training.standalone_sync_mode == "keep" else {}
        if self.async_training.staged_standalone_sync:
            # staged: the replicas keep serving while the buckets reach them; they stop only for the commit

            async def on_commit() -> None:
                self.set_state(ids, "syncing")
                await self._set_syncing(ids, True)

            options.update(staged=True, on_commit=on_commit)
        else:
            self.set_state(ids, "syncing")
            await self._set_syncing(ids, True)
        try:
            report, seconds = await self.push_async(weights, self.standalone, version, **options)
            if report is not None:
                self.last_sync_report = report
                self.standalone_sync_reports.append(report)
                del self.standalone_sync_reports[:-8]  # the latest few, for logs and tests
            return seconds
        finally:
            await self._set_syncing(ids, False)
            self.set_state(ids, "active")

    def push_standalone(self, weights: list[tuple[str, Any]] | None, version: int) -> float:
        """Weight sync to every standalone replica (always, each parameter version); returns seconds.

        The rollouter is told (:meth:`~lightning_hybrid_rollout.rollout.rollouter.Rollouter.set_syncing`), so the
        sync does not count as standalone serving time.
        """
        return self.loop.run(self._push_standalone_async(weights or [], version))

    def push_standalone_overlapped(
        self, weights: list[tuple[str, Any]] | None, version: int, replicas: Sequence[int] | None = None
    ) -> OverlapReport:
        """The standalone weight sync and, concurrently, wake + weight sync of the hybrid replicas (``overlap_sync``).

        Blocks for ``max(standalone sync, wake + hybrid sync)``. The caller must have offloaded the training state
        (the hybrid engines take the trainer's devices). Afterwards the prepared replicas are awake and hold
        ``version``, so the controller's activation only adds and resumes them; if it does not activate, the caller
        puts them back to sleep. A failure of the hybrid half is logged and the replicas are put back to sleep (the
        activation then takes verl's path); a failure of the standalone sync raises.

        Args:
            weights: The trainer's full weights.
            version: The new parameter version.
            replicas: Indices of the hybrid replicas the activation will lend (k of n; None: all).
        """
        items = weights or []

        async def both() -> tuple[float, list[Any]]:
            t0 = time.monotonic()

            async def standalone() -> float:
                await self._push_standalone_async(items, version)
                return time.monotonic()

            got = await asyncio.gather(
                standalone(), self.pool.wake_and_sync_async(items, version, replicas), return_exceptions=True
            )
            return t0, list(got)

        t0, (standalone_end, hybrid) = self.loop.run(both())
        end = time.monotonic()
        if isinstance(standalone_end, BaseException):
            raise standalone_end
        if isinstance(hybrid, BaseException):
            log.warning(
                "overlap_sync: the hybrid wake-up / weight sync failed (%r); putting them back to sleep", hybrid
            )
            try:
                self.pool.sleep_replicas(replicas)
            except Exception as err:
                raise hybrid from err
            return OverlapReport(t0, standalone_end, t0, t0, end, hybrid_error=repr(hybrid))
        woken, synced = hybrid
        return OverlapReport(t0, standalone_end, woken, synced, end)

    # ----------------------------------------------------------------------------------------------- trace
    # The trace is the tracer's (run/tracer.py); these are the names the callback, the pools and the supervisor use.

    trace_track = staticmethod(trace_track)

    def probe_decode_progress(self) -> None:
        """Sample each standalone replica's tokens generated so far (finished and in flight) into the trace as the
        counter ``generated_tokens.<replica>``, at the time the replica read them; the callback calls it at both
        boundaries of every ``training`` span. Returns at once: the replicas answer on the runtime's loop
        (:class:`~lightning_hybrid_rollout.run.decode_probe.DecodeProgressProbe`). Nothing without a trace."""
        if self._decode_probe is not None:
            self._decode_probe.probe(self.standalone)

    def set_state(self, replica_ids: Sequence[str], state: str, t: float | None = None) -> None:
        """Close each replica's current state span and open ``state`` (trace only)."""
        self.tracer.set_state(replica_ids, state, t)

    def trace_phase(self, phase: str, start: float, end: float, **args: Any) -> None:
        """A trainer phase span (``waiting``, ``training``, ``weight_sync``, ``switching``)."""
        self.tracer.phase(phase, start, end, **args)

    def take_samples(self, n: int, timeout: float) -> list[Any]:
        """Remove and return ``n`` samples (oldest first); counted for the trace's ``trained_*`` totals."""
        samples = super().take_samples(n, timeout)
        self.tracer.add_totals(
            trained_samples=len(samples),
            trained_tokens=sum(s.response_length for s in samples),
            trained_tokens_sq=sum(s.response_length**2 for s in samples),  # the lengths' spread
            trained_prompt_tokens=sum(len(s.prompt_token_ids) for s in samples),
        )
        return samples

    def take_role_window(self) -> Any:
        """The cycle's per-role production, starting a new window; added to the trace's per-role totals."""
        window = super().take_role_window()
        self.tracer.add_totals(
            **{f"decoded_tokens.{role}": n for role, n in window.decoded_tokens.items()},
            **{f"serving_s.{role}": s for role, s in window.serving_s.items()},
        )
        return window

    def trace_cycle(self, step: int, t: float, metrics: dict[str, float]) -> None:
        """Queue depth / in-flight counters, the running totals (``trained_*``, ``decoded_tokens.*``,
        ``serving_s.*``: :mod:`lightning_hybrid_rollout.trace`) and the cycle's ``dynamic_resource/*`` metrics."""
        in_flight = self.rollouter.in_flight if self.rollouter is not None else None
        self.tracer.cycle(step, t, metrics, self.queue.size(), in_flight)

    def trace_tool_call(self, name: str, start: float, end: float, args: Mapping[str, Any]) -> None:
        """One ended tool call or environment reset/step (``time.monotonic()`` times) on a ``tools/lane_<k>`` track
        (:meth:`~lightning_hybrid_rollout.trace.TraceWriter.lane_span`: concurrent calls get lanes of their own)."""
        self.tracer.tool_call(name, start, end, args)
