"""The asyncio producer: prompts → generation requests → rewarded samples → :class:`MessageQueue`.

The :class:`Rollouter` owns an event loop in a background thread. The trainer (main thread) drives it through
thread-safe control methods that schedule onto that loop and wait for the result.

Data plane, per prompt: the prompt is tokenized once and expanded into ``n_samples_per_prompt`` samples sharing a
``group_id`` (each with a unique ``uid``). Each sample is generated as one or more *segments* (engine requests,
routed by the :class:`~lightning_hybrid_rollout.rollout.load_balancer.LoadBalancer`):

- an aborted segment (deactivation, rebalance, pause) is retried with ``prompt + tokens generated so far`` and
  ``max_tokens`` reduced by them (partial rollout; with ``partial_rollout=False`` the sample restarts from
  scratch); tokens and logprobs of the segments are concatenated and never exceed the response length
  (``sampling.max_tokens``);
- a segment whose replica died (``ReplicaDeadError`` / Ray actor death) marks the replica dead in the load
  balancer and is retried on another replica;
- the finished sample records the min/max weight version of its segments and the replica of each, is rewarded by
  ``reward_fn`` and, once its whole group is finished, the group goes into the queue in one atomic put.

Exactly once: each admitted sample yields exactly one :class:`Sample` in the queue (none lost, none duplicated),
across aborts, dead replicas, pause/resume and a ``state_dict``/``load_state_dict`` round trip.

Flow control (DESIGN §3, seed §4.2):

- in flight: at most ``cap = min(active_servers * concurrent_samples_per_replica, max_required_samples)`` samples;
- staleness: every admitted sample adds 1 to ``staleness_samples``; prompts are admitted (a whole group at a
  time) only while ``staleness_samples + n <= max_required_samples`` and the queue is not full;
  :meth:`Rollouter.reset_staleness` (once per parameter version) sets it to ``outstanding + queue size``, so no more
  than ``max_required_samples`` samples are admitted per parameter version;
- utilization history: ``(t, active, cap)`` appended on every submit, completion, park/unpark during a pause and
  capacity change; :meth:`Rollouter.reset_staleness` closes the window and returns it with
  ``step_generated_samples`` (the input of ``metrics.rollout_resource_utilization``).

Production per replica role (the ``rate_matched`` policy's inputs): tokens each role's replicas return (aborted
partial segments included) and the seconds during which at least one replica of the role was serving (routable in
the load balancer, not under a weight sync announced with :meth:`Rollouter.set_syncing`, rollouter started and not
paused), read per sync cycle with :meth:`Rollouter.take_role_window`. The role of a replica is its ``role``
attribute (``"standalone"`` when it has none).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from lightning_hybrid_rollout.errors import RolloutError as RolloutError  # re-exported
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.flow_control import admits_group, in_flight_cap, staleness_after_reset
from lightning_hybrid_rollout.rollout.load_balancer import (
    LoadBalancer,
    ReplicaLike,
    is_replica_dead_error,
)
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.partial_rollout import (
    failure_backoff_s,
    is_refusal,
    refusal_backoff_s,
    settle_segment,
)
from lightning_hybrid_rollout.rollout.prompts import PromptItem as PromptItem  # re-exported
from lightning_hybrid_rollout.rollout.prompts import expand_prompts as expand_prompts  # re-exported
from lightning_hybrid_rollout.rollout.prompts import parse_prompt_item
from lightning_hybrid_rollout.rollout.role_window import RoleProduction, replica_role
from lightning_hybrid_rollout.rollout.role_window import RoleWindow as RoleWindow  # re-exported
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.rollout.sample_state import PromptGroup, SampleState
from lightning_hybrid_rollout.rollout.utilization import HistoryPoint as HistoryPoint  # re-exported
from lightning_hybrid_rollout.rollout.utilization import RolloutStepStats as RolloutStepStats  # re-exported
from lightning_hybrid_rollout.rollout.utilization import UtilizationHistory

log = logging.getLogger(__name__)

T = TypeVar("T")


class Rollouter:
    """Asynchronous rollout producer with partial rollout, staleness budget and exactly-once delivery.

    Args:
        prompts: Iterable of prompts: a string, or a mapping with ``"prompt"`` (and optionally
            ``"prompt_token_ids"``); the mapping's other keys become the sample's ``metadata``.
        tokenize: ``text -> token ids`` (called once per prompt, on the rollouter's loop).
        reward_fn: ``sample -> reward`` (called once per finished sample, on the rollouter's loop).
        message_queue: Where finished samples go; its ``maxsize`` should be ``max_required_samples``.
        sampling: Sampling parameters; ``sampling.max_tokens`` is the response length, never exceeded.
        replicas: Replicas to register in a new load balancer (ignored when ``load_balancer`` is given).
        load_balancer: An existing load balancer to route through.
        n_samples_per_prompt: Samples per prompt (GRPO group size).
        max_required_samples: Staleness budget per parameter version and in-flight ceiling (default: the queue's
            ``maxsize``).
        concurrent_samples_per_replica: In-flight samples per active replica.
        partial_rollout: Continue aborted samples from their generated prefix (else restart them).
        clock: Time source for the utilization history and per-sample timings.
        max_segment_failures: Non-fatal generate errors tolerated per sample before the rollouter fails.
        no_replica_timeout_s: How long a sample waits while every replica is dead (or none is registered) before
            the rollouter fails (``None``: forever). Removed/paused replicas are waited for without a timeout.
        abort_timeout_s: How long abort/pause/rebalance wait for aborted requests to come back.
        name: Thread name and log prefix.

    Example::

        queue = MessageQueue(maxsize=72)
        rollouter = Rollouter(prompts, tokenizer.encode, reward_fn, queue,
                              sampling=SamplingSpec(max_tokens=256), replicas=replicas, n_samples_per_prompt=8)
        rollouter.start()
        batch = queue.get_batch(32)
        stats = rollouter.reset_staleness()  # once per parameter version
        rollouter.stop()
    """

    def __init__(
        self,
        prompts: Iterable[PromptItem],
        tokenize: Callable[[str], Sequence[int]],
        reward_fn: Callable[[Sample], float],
        message_queue: MessageQueue,
        *,
        sampling: SamplingSpec,
        replicas: Sequence[ReplicaLike] = (),
        load_balancer: LoadBalancer | None = None,
        n_samples_per_prompt: int = 1,
        max_required_samples: int | None = None,
        concurrent_samples_per_replica: int = 16,
        partial_rollout: bool = True,
        clock: Callable[[], float] = time.monotonic,
        max_segment_failures: int = 8,
        no_replica_timeout_s: float | None = 600.0,
        abort_timeout_s: float = 60.0,
        name: str = "rollouter",
    ) -> None:
        max_required = message_queue.maxsize if max_required_samples is None else max_required_samples
        if n_samples_per_prompt < 1:
            raise ValueError(f"n_samples_per_prompt must be >= 1, got {n_samples_per_prompt}")
        if max_required < n_samples_per_prompt:
            raise ValueError(
                f"max_required_samples ({max_required}) must be >= n_samples_per_prompt ({n_samples_per_prompt}): "
                "a prompt group is admitted whole; raise staleness_threshold / required_samples or lower n"
            )
        if message_queue.maxsize < n_samples_per_prompt:
            raise ValueError(
                f"message queue maxsize ({message_queue.maxsize}) must be >= n_samples_per_prompt "
                f"({n_samples_per_prompt}): groups are put whole"
            )
        if concurrent_samples_per_replica < 1:
            raise ValueError(f"concurrent_samples_per_replica must be >= 1, got {concurrent_samples_per_replica}")
        if sampling.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens (response length) must be >= 1, got {sampling.max_tokens}")
        self._prompts: Iterator[PromptItem] = iter(prompts)
        self._tokenize = tokenize
        self._reward_fn = reward_fn
        self.message_queue = message_queue
        self.sampling = sampling
        self.load_balancer = load_balancer if load_balancer is not None else LoadBalancer(replicas)
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_required_samples = max_required
        self.concurrent_samples_per_replica = concurrent_samples_per_replica
        self.partial_rollout = partial_rollout
        self.max_segment_failures = max_segment_failures
        self.no_replica_timeout_s = no_replica_timeout_s
        self.abort_timeout_s = abort_timeout_s
        self.name = name
        self._clock = clock

        # counters (checkpointed)
        self.param_version = 0
        self.staleness_samples = 0
        self.total_prompts = 0
        self.total_admitted_samples = 0
        self.total_generated_samples = 0
        self.total_delivered_samples = 0
        self.aborted_segments = 0
        self.retried_segments = 0
        self.dead_replica_retries = 0
        self.failed_segments = 0
        self.rejected_segments = 0
        self.dropped = 0
        self.step_generated_samples = 0
        self._window_admitted = 0
        self._group_counter = 0

        # runtime state
        self._groups: dict[str, PromptGroup] = {}
        self._to_dispatch: deque[SampleState] = deque()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._in_flight = 0
        self._parked = 0
        self._history = UtilizationHistory(self._cap())
        self._exhausted = False
        self._stopping = False
        self._paused = False
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._gate: asyncio.Event | None = None
        self._space: asyncio.Event | None = None
        self._drained = threading.Event()
        self._started = False
        self._role_production = RoleProduction()  # tokens and serving seconds per replica role, on the loop only

        self.load_balancer.add_listener(self._on_pool_change)
        self.message_queue.add_listener(self._on_queue_space)

    # ================================================================== lifecycle (trainer thread)

    def start(self) -> None:
        """Start the event loop thread and begin producing samples."""
        if self._started:
            raise RuntimeError(f"{self.name} was already started; create a new Rollouter (load its state_dict)")
        self._started = True
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, args=(ready,), name=self.name, daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self, timeout: float = 30.0, *, abort_in_flight: bool = True) -> None:
        """Stop producing and join the thread; unfinished samples stay in :meth:`state_dict`.

        Args:
            timeout: Seconds to wait for the shutdown.
            abort_in_flight: Abort requests running on the replicas (frees the engines; their partial output is
                kept as the samples' prefix).
        """
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return
        try:
            self._call(self._shutdown(abort_in_flight, timeout), timeout=timeout + 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> Rollouter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ================================================================== control (thread-safe)

    def pause(self, *, abort_in_flight: bool = False, timeout: float | None = None) -> int:
        """Stop admitting prompts and dispatching segments (e.g. around a weight sync).

        Args:
            abort_in_flight: Also abort the running requests and wait until they are back; their samples park with
                their prefix and continue after :meth:`resume` (partial rollout across weight versions).
            timeout: Seconds to wait for aborted requests (default ``abort_timeout_s``).

        Returns:
            Number of requests aborted.
        """
        return self._call(self._pause_async(abort_in_flight, timeout))

    def resume(self) -> None:
        """Undo :meth:`pause`."""
        self._call(self._resume_async())

    def reset_staleness(self) -> RolloutStepStats:
        """Close the rollout window of this parameter version (call once per version, after the weight sync).

        Sets ``staleness_samples = outstanding samples + queue size`` (DESIGN §3) and returns the window's
        ``(t, active, cap)`` history and ``step_generated_samples``; a new window starts now.
        """
        return self._call(self._reset_staleness_async())

    def update_weight_version(self, version: int) -> None:
        """Record the trainer's current weight version (reported in :class:`RolloutStepStats` and sample metadata).

        Args:
            version: The new version.
        """
        self._call(self._set_version_async(version))

    def add_replicas(self, replicas: Sequence[ReplicaLike], *, paused: bool = False) -> None:
        """Register replicas in the load balancer (seed activation step 1); capacity grows.

        Args:
            replicas: Replica handles.
            paused: Keep them unroutable until :meth:`resume_generation_replicas`.
        """
        self._call(self._lb_async(lambda lb: lb.add_replicas(replicas, paused=paused)))

    def remove_replicas(self, replica_ids: Sequence[str]) -> None:
        """Cut routing to replicas (seed deactivation step 1): no new request reaches them.

        Args:
            replica_ids: Ids of registered replicas.
        """
        self._call(self._lb_async(lambda lb: lb.remove_replicas(replica_ids)))

    def resume_generation_replicas(self, replica_ids: Sequence[str] | None = None) -> None:
        """Let (paused) replicas accept requests (seed activation step 2).

        Args:
            replica_ids: Ids to resume; ``None`` resumes all.
        """
        self._call(self._lb_async(lambda lb: lb.resume_replicas(replica_ids)))

    def abort_replicas(self, replica_ids: Sequence[str] | None = None, *, timeout: float | None = None) -> int:
        """Abort the in-flight requests on replicas and wait until they are back (seed deactivation step 2).

        The aborted samples are retried (from their prefix) on the replicas that are still routable; call
        :meth:`remove_replicas` first so they do not land on the same replicas again.

        Args:
            replica_ids: Replicas to abort on; ``None`` means all.
            timeout: Seconds to wait (default ``abort_timeout_s``).

        Returns:
            Number of requests aborted.
        """
        return self._call(self._abort_async(replica_ids, timeout))

    def rebalance_requests(self, *, timeout: float | None = None) -> int:
        """Clear the sticky cache, abort in-flight requests on active replicas, then let them re-route least-loaded.

        Args:
            timeout: Seconds to wait for the aborted requests (default ``abort_timeout_s``).

        Returns:
            Number of requests aborted (and re-routed).
        """
        return self._call(self._rebalance_async(timeout))

    def set_syncing(self, replica_ids: Sequence[str], syncing: bool) -> None:
        """Mark replicas as under (or done with) a weight sync: their time does not count as serving.

        The engines pause in place during a sync, so the load balancer keeps them registered; this only feeds the
        per-role serving time of :meth:`take_role_window`.

        Args:
            replica_ids: Replica ids (registered or not).
            syncing: True when the sync starts, False when it ends.
        """
        self._call(self._set_syncing_async(list(replica_ids), syncing))

    def take_role_window(self) -> RoleWindow:
        """Close the production window per replica role and start a new one now.

        The first window starts at the first call of any control method (or :meth:`start`); serving time only
        counts while the rollouter runs.
        """
        return self._call(self._take_role_window_async())

    def peek_role_window(self) -> RoleWindow:
        """The production window per replica role *so far*, without closing it.

        Same fields as :meth:`take_role_window`; the next :meth:`take_role_window` still covers the whole window.
        For a decision that needs the cycle's measurements before the cycle's bookkeeping ends (the callback's
        ``overlap_sync`` asks the policy before the standalone weight sync).
        """
        return self._call(self._take_role_window_async(restart=False))

    def active_server_count(self) -> int:
        """Registered, alive replicas in the load balancer."""
        return self._call(self._lb_async(lambda lb: lb.active_server_count()))

    def wait_drained(self, timeout: float | None = None) -> bool:
        """Block until the prompt iterator is exhausted and every admitted sample is in the queue.

        Args:
            timeout: Seconds (``None``: forever).
        """
        return self._drained.wait(timeout)

    # ================================================================== introspection

    @property
    def max_concurrent_samples(self) -> int:
        """Current in-flight cap: ``min(active_servers * concurrent_samples_per_replica, max_required_samples)``."""
        return self._cap()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The rollouter's event loop (running in its thread after :meth:`start`), e.g. for ``push_weights(loop=)``."""
        return self._loop

    @property
    def in_flight(self) -> int:
        """Samples dispatched and not finished (parked ones included)."""
        return self._in_flight

    @property
    def outstanding_samples(self) -> int:
        """Admitted samples not yet delivered to the queue."""
        return self.total_admitted_samples - self.total_delivered_samples

    @property
    def exhausted(self) -> bool:
        """Whether the prompt iterator is exhausted."""
        return self._exhausted

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the rollouter, if any."""
        return self._error

    @property
    def is_running(self) -> bool:
        """Whether the loop thread is alive and producing."""
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def counters(self) -> dict[str, int]:
        """Monotonic counters (for logging under ``fully_async/rollouter/*``)."""
        return {
            "total_prompts": self.total_prompts,
            "total_admitted_samples": self.total_admitted_samples,
            "total_generated_samples": self.total_generated_samples,
            "total_delivered_samples": self.total_delivered_samples,
            "aborted_segments": self.aborted_segments,
            "retried_segments": self.retried_segments,
            "dead_replica_retries": self.dead_replica_retries,
            "failed_segments": self.failed_segments,
            "rejected_segments": self.rejected_segments,
            "dropped": self.dropped,
            "staleness_samples": self.staleness_samples,
            "in_flight": self._in_flight,
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters, unfinished prompt groups (with their generated prefixes) and the queue's buffered samples.

        Taken atomically on the loop, so a checkpoint neither loses nor duplicates a sample. The prompt iterator's
        position is the data loader's to checkpoint.
        """
        return self._call(self._state_dict_async())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (before :meth:`start`): unfinished groups are generated first.

        Args:
            state: What :meth:`state_dict` returned.
        """
        if self._started:
            raise RuntimeError("load_state_dict must be called before start()")
        for key, value in state["counters"].items():
            if key != "in_flight":
                setattr(self, key, int(value))
        self.param_version = int(state["param_version"])
        self._group_counter = int(state["group_counter"])
        self._groups.clear()
        self._to_dispatch.clear()
        for g in state["pending_groups"]:
            group = PromptGroup.from_state(g)
            self._to_dispatch.extend(st for st in group.samples if st.result is None)
            self._groups[group.group_id] = group
        if "message_queue" in state:
            self.message_queue.load_state_dict(state["message_queue"])
        self.staleness_samples = staleness_after_reset(self.outstanding_samples, self.message_queue.size())

    # ================================================================== loop-side implementation

    def _thread_main(self, ready: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        self._wake = asyncio.Event()
        self._gate = asyncio.Event()
        self._space = asyncio.Event()
        if not self._paused:
            self._gate.set()
        self._main_task = loop.create_task(self._main())
        ready.set()
        try:
            loop.run_forever()
        finally:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))

    async def _main(self) -> None:
        assert self._wake is not None
        self._record()
        self._tick_serving()
        for group in list(self._groups.values()):
            if group.done:
                await self._deliver_group(group)
        try:
            while not self._stopping:
                self._wake.clear()
                while self._progress():
                    pass
                self._check_drained()
                await self._wake.wait()
        except Exception as exc:  # pragma: no cover - defensive: a bug in the admission loop
            self._fail(exc)

    def _progress(self) -> bool:
        """Dispatch one admitted sample or admit one prompt group; False when blocked."""
        if self._stopping or self._paused or self._error is not None:
            return False
        cap = self._cap()
        if self._to_dispatch:
            if self._in_flight >= cap:
                return False
            self._dispatch(self._to_dispatch.popleft())
            return True
        if self._exhausted or not admits_group(
            self.n_samples_per_prompt,
            in_flight=self._in_flight,
            cap=cap,
            queue_size=self.message_queue.size(),
            queue_maxsize=self.message_queue.maxsize,
            staleness_samples=self.staleness_samples,
            max_required_samples=self.max_required_samples,
        ):
            return False
        try:
            item = next(self._prompts)
        except StopIteration:
            self._exhausted = True
            log.info("%s: prompt iterator exhausted after %d prompts", self.name, self.total_prompts)
            return False
        self._admit(item)
        return True

    def _admit(self, item: PromptItem) -> None:
        prompt, metadata, token_ids = parse_prompt_item(item)
        ids = list(token_ids) if token_ids is not None else list(self._tokenize(prompt))
        group = PromptGroup.admit(
            self._group_counter,
            prompt,
            ids,
            metadata,
            n_samples=self.n_samples_per_prompt,
            base_seed=self.sampling.seed,
            param_version=self.param_version,
        )
        self._groups[group.group_id] = group
        self._to_dispatch.extend(group.samples)
        self._group_counter += 1
        self.total_prompts += 1
        n = len(group.samples)
        self.total_admitted_samples += n
        self.staleness_samples += n
        self._window_admitted += n

    def _dispatch(self, st: SampleState) -> None:
        assert self._loop is not None
        self._in_flight += 1
        self._record()
        self._tasks[st.uid] = self._loop.create_task(self._run_sample(st), name=st.uid)

    async def _run_sample(self, st: SampleState) -> None:
        try:
            try:
                finished = await self._generate(st)
            finally:
                self._in_flight -= 1
                self._record()
                self._kick()
            group = self._groups.get(st.group_id)
            if finished and group is not None and group.done:
                await self._deliver_group(group)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
        finally:
            self._tasks.pop(st.uid, None)
            self._check_drained()

    async def _generate(self, st: SampleState) -> bool:
        """Run segments until the sample finishes; False if the rollouter stops first (state kept)."""
        assert self._gate is not None
        group = self._groups[st.group_id]
        response_length = self.sampling.max_tokens
        stop_ids = set(self.sampling.stop_token_ids)
        lb = self.load_balancer
        if st.started_at is None:
            st.started_at = self._clock()
        while True:
            if not self._gate.is_set():
                await self._park()
            if self._stopping:
                return False
            remaining = response_length - len(st.tokens)
            if remaining <= 0:  # restored from a checkpoint at full length
                self._finish(st, group, "length")
                return True
            request_id = f"{st.uid}:{st.attempts}"
            st.attempts += 1
            replica = await lb.acquire(request_id, sticky_key=st.uid, timeout=self.no_replica_timeout_s)
            if not self._gate.is_set() or self._stopping:
                lb.release(replica.replica_id, request_id)
                continue
            spec = dataclasses.replace(self.sampling, max_tokens=remaining, seed=st.seed)
            try:
                result = await replica.generate(request_id, group.prompt_token_ids + st.tokens, spec)
            except Exception as exc:
                if is_replica_dead_error(exc):
                    lb.mark_dead(replica.replica_id)
                    self.dead_replica_retries += 1
                    log.warning(
                        "%s: replica %s died under %s; retrying elsewhere", self.name, replica.replica_id, st.uid
                    )
                    continue
                st.failures += 1
                self.failed_segments += 1
                if st.failures > self.max_segment_failures:
                    raise RolloutError(
                        f"sample {st.uid} failed {st.failures} times (last on replica {replica.replica_id}): {exc!r}; "
                        "check the replicas' health or raise max_segment_failures"
                    ) from exc
                log.warning("%s: segment %s failed on %s: %r; retrying", self.name, request_id, replica.replica_id, exc)
                await asyncio.sleep(failure_backoff_s(st.failures))
                continue
            finally:
                lb.release(replica.replica_id, request_id)
            tokens = list(result.token_ids)
            self._role_production.add_tokens(replica_role(replica), len(tokens))
            logprobs = list(result.logprobs)
            overshoot = len(tokens) > remaining
            if overshoot:
                log.warning(
                    "%s: replica %s returned %d tokens for max_tokens=%d (%s); truncating",
                    self.name,
                    replica.replica_id,
                    len(tokens),
                    remaining,
                    request_id,
                )
                tokens, logprobs = tokens[:remaining], logprobs[:remaining]
            if is_refusal(result, tokens):
                st.rejections += 1
                self.rejected_segments += 1
                if st.rejections == 1:
                    log.warning(
                        "%s: replica %s refused %s (engine state %s); remove_replicas before sleep_replicas and "
                        "wake_up before add_replicas",
                        self.name,
                        replica.replica_id,
                        request_id,
                        result.info.get("rejected"),
                    )
                lb.clear_sticky_key(st.uid)
                await asyncio.sleep(refusal_backoff_s(st.rejections))
                continue
            if result.finish_reason == "abort":
                self.aborted_segments += 1
            reason = settle_segment(
                st,
                tokens,
                logprobs,
                result,
                replica_id=replica.replica_id,
                overshoot=overshoot,
                partial_rollout=self.partial_rollout,
                response_length=response_length,
                stop_ids=stop_ids,
            )
            if reason is None:
                self.retried_segments += 1
                continue
            self._finish(st, group, reason)
            return True

    def _finish(self, st: SampleState, group: PromptGroup, reason: str) -> None:
        sample = st.to_sample(group, reason, self._clock())
        sample.reward = float(self._reward_fn(sample))
        st.result = sample
        self.total_generated_samples += 1
        self.step_generated_samples += 1

    async def _park(self) -> None:
        assert self._gate is not None
        self._parked += 1
        self._record()
        try:
            await self._gate.wait()
        finally:
            self._parked -= 1
            self._record()

    async def _deliver_group(self, group: PromptGroup) -> None:
        """Put a finished group into the queue atomically; it stays in ``_groups`` (and state_dict) until then."""
        assert self._space is not None
        if group.delivering or group.group_id not in self._groups:
            return
        samples = [s.result for s in group.samples if s.result is not None]
        queue = self.message_queue
        group.delivering = True
        warned = False
        try:
            while True:
                self._space.clear()
                if queue.closed or self._stopping:
                    break
                if queue.size() + len(samples) <= queue.maxsize and queue.put_many(samples, block=False):
                    del self._groups[group.group_id]
                    self.total_delivered_samples += len(samples)
                    return
                if not warned:
                    log.warning(
                        "%s: queue full (%d); holding %d samples until it drains", self.name, queue.size(), len(samples)
                    )
                    warned = True
                await self._space.wait()
        finally:
            group.delivering = False
        self.dropped += len(samples)
        log.warning(
            "%s: %d samples of %s not delivered (queue closed or stopping); kept in state_dict",
            self.name,
            len(samples),
            group.group_id,
        )

    # ---------------------------------------------------------------- control coroutines

    async def _pause_async(self, abort_in_flight: bool, timeout: float | None) -> int:
        self._paused = True
        self._tick_serving()
        if self._gate is not None:
            self._gate.clear()
        if not abort_in_flight or self._gate is None:
            return 0
        return await self.load_balancer.abort_replicas(None, wait=True, timeout=timeout or self.abort_timeout_s)

    async def _resume_async(self) -> None:
        self._paused = False
        self._tick_serving()
        if self._gate is not None:
            self._gate.set()
        self._kick()

    async def _reset_staleness_async(self) -> RolloutStepStats:
        self.staleness_samples = staleness_after_reset(self.outstanding_samples, self.message_queue.size())
        stats = RolloutStepStats(
            history=[],
            step_generated_samples=self.step_generated_samples,
            admitted_samples=self._window_admitted,
            staleness_samples=self.staleness_samples,
            param_version=self.param_version,
        )
        if self._loop is not None and self._started:
            self._record()
            stats.history = self._history.close_window()
        self.step_generated_samples = 0
        self._window_admitted = 0
        self._kick()
        return stats

    async def _set_syncing_async(self, replica_ids: list[str], syncing: bool) -> None:
        self._role_production.set_syncing(replica_ids, syncing)
        self._tick_serving()

    async def _take_role_window_async(self, restart: bool = True) -> RoleWindow:
        now = self._tick_serving()
        return self._role_production.window(now, restart=restart)

    async def _set_version_async(self, version: int) -> None:
        self.param_version = int(version)

    async def _lb_async(self, fn: Callable[[LoadBalancer], T]) -> T:
        value = fn(self.load_balancer)
        self._on_pool_change()
        return value

    async def _abort_async(self, replica_ids: Sequence[str] | None, timeout: float | None) -> int:
        return await self.load_balancer.abort_replicas(replica_ids, wait=True, timeout=timeout or self.abort_timeout_s)

    async def _rebalance_async(self, timeout: float | None) -> int:
        lb = self.load_balancer
        gate = self._gate
        was_open = gate is not None and gate.is_set()
        if gate is not None:
            gate.clear()
        try:
            lb.clear_sticky_cache()
            n = await lb.abort_replicas(lb.replica_ids("active"), wait=True, timeout=timeout or self.abort_timeout_s)
        finally:
            if gate is not None and was_open and not self._paused:
                gate.set()
        log.info("%s: rebalanced %d in-flight requests over %s", self.name, n, lb.routable_replica_ids())
        return n

    async def _shutdown(self, abort_in_flight: bool, timeout: float) -> None:
        self._stopping = True
        self._tick_serving()
        if self._gate is not None:
            self._gate.set()  # parked samples see _stopping and return
        if self._space is not None:
            self._space.set()  # samples waiting for queue room give up (their group stays in state_dict)
        if abort_in_flight and self._tasks:
            try:
                await self.load_balancer.abort_replicas(None, wait=True, timeout=min(timeout, self.abort_timeout_s))
            except TimeoutError as exc:
                log.warning("%s: %s", self.name, exc)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._kick()
        if self._main_task is not None:
            await asyncio.gather(self._main_task, return_exceptions=True)

    async def _state_dict_async(self) -> dict[str, Any]:
        counters = self.counters()
        return {
            "counters": counters,
            "param_version": self.param_version,
            "group_counter": self._group_counter,
            "pending_groups": [g.to_state() for g in self._groups.values()],
            "message_queue": self.message_queue.state_dict(),
        }

    # ---------------------------------------------------------------- helpers

    def _cap(self) -> int:
        active = self.load_balancer.active_server_count()
        return in_flight_cap(active, self.concurrent_samples_per_replica, self.max_required_samples)

    def _record(self) -> None:
        """Append ``(t, active, cap)``; active = samples generating or waiting for a replica (not parked)."""
        if not self._started:
            return
        cap = self._cap()
        self._history.append(self._clock(), self._in_flight - self._parked, cap)

    def _roles_serving_now(self) -> frozenset[str]:
        if not self._started or self._stopping or self._paused or self._loop is None:
            return frozenset()
        return self._role_production.serving_roles(self.load_balancer)

    def _tick_serving(self) -> float:
        """Credit the time since the last tick to the roles that were serving, then re-read who serves now.

        Called right after every change of what serves (pool change, pause/resume, sync marks, start, stop).
        Returns the tick's clock reading.
        """
        now = self._clock()
        self._role_production.tick(now, self._roles_serving_now())
        return now

    def _on_pool_change(self) -> None:
        self._tick_serving()
        if self._cap() != self._history.last_cap:
            self._record()
            self._history.last_cap = self._cap()
        self._kick()

    def _on_queue_space(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
            loop.call_soon_threadsafe(self._on_space_loop)

    def _on_space_loop(self) -> None:
        if self._space is not None:
            self._space.set()
        self._kick()

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _check_drained(self) -> None:
        if self._exhausted and self.outstanding_samples == 0 and not self._to_dispatch:
            self._drained.set()

    def _fail(self, exc: BaseException) -> None:
        if self._error is not None:
            return
        self._error = exc
        self._stopping = True
        self._tick_serving()
        if self._space is not None:
            self._space.set()
        log.error("%s: stopping after an unrecoverable error: %r", self.name, exc)
        self.message_queue.close(reason=f"{self.name} failed: {exc!r}", error=exc)
        if self._gate is not None:
            self._gate.set()
        self._kick()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a control coroutine on the loop from another thread (or inline before start/after stop)."""
        loop = self._loop
        thread = self._thread
        if loop is None or thread is None or not thread.is_alive() or loop.is_closed():
            return asyncio.run(coro)
        if threading.current_thread() is thread:
            coro.close()
            raise RuntimeError(
                f"{self.name}: synchronous control methods cannot be called from the rollouter's own event loop "
                "thread (they would deadlock); call them from the trainer thread"
            )
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.name}: control call did not finish within {timeout}s") from None
