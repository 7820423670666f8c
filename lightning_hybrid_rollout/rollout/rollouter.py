"""The asyncio producer: prompts → generation requests → rewarded samples → :class:`MessageQueue`.

The :class:`Rollouter` runs the :class:`~lightning_hybrid_rollout.rollout.production.ProductionLoop` on an event loop
in a background thread and gives the trainer thread-safe control methods (pause, replica switches, weight-version
windows). Partial rollout, routing, flow control and the exactly-once guarantee are described in docs/rollout.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from lightning_hybrid_rollout.errors import RolloutError as RolloutError  # re-exported
from lightning_hybrid_rollout.rollout.drain import DrainReport
from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.event_loop import EventLoopThread
from lightning_hybrid_rollout.rollout.group_filter import GroupFilter, GroupFilterFn
from lightning_hybrid_rollout.rollout.load_balancer import LoadBalancer, ReplicaLike
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.partial_rollout import EpisodeRunner
from lightning_hybrid_rollout.rollout.production import GroupScorer, ProductionLoop
from lightning_hybrid_rollout.rollout.prompts import PromptItem as PromptItem  # re-exported
from lightning_hybrid_rollout.rollout.role_window import RoleWindow as RoleWindow  # re-exported
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.rollout.utilization import RolloutStepStats as RolloutStepStats  # re-exported

T = TypeVar("T")


class Rollouter(ProductionLoop):
    """Asynchronous rollout producer with partial rollout, staleness budget and exactly-once delivery.

    Args:
        prompts: Iterable of prompts: a string, or a mapping with ``"prompt"`` (and optionally
            ``"prompt_token_ids"``); the mapping's other keys become the sample's ``metadata``. An iterable with
            ``state_dict``/``load_state_dict`` (a ``CheckpointablePrompts`` of :mod:`.production`) has its
            position saved in :meth:`state_dict`, atomically with the groups it produced.
        tokenize: ``text -> token ids`` (called once per prompt, on the rollouter's loop).
        reward_fn: ``sample -> reward`` (called once per finished sample, on the rollouter's loop), or a
            :class:`~lightning_hybrid_rollout.rollout.production.GroupScorer` (one awaited ``score_group`` per
            finished group, before it is delivered: the reward functions run off the loop).
        message_queue: Where finished samples go; its ``maxsize`` should be ``max_required_samples``.
        sampling: Sampling parameters; ``sampling.max_tokens`` is the response length, never exceeded.
        replicas: Replicas to register in a new load balancer (ignored when ``load_balancer`` is given).
        load_balancer: An existing load balancer to route through.
        n_samples_per_prompt: Samples per prompt (GRPO group size).
        max_required_samples: Staleness budget per parameter version and in-flight ceiling (default: the queue's
            ``maxsize``).
        concurrent_samples_per_replica: In-flight samples per active replica (an episode in its tool/environment
            turn holds no engine request and is not counted).
        partial_rollout: Continue aborted samples from their generated prefix (else restart them).
        clock: Time source for the utilization history and per-sample timings.
        max_segment_failures: Non-fatal generate errors tolerated per sample before the rollouter fails.
        no_replica_timeout_s: How long a sample waits while every replica is dead (or none is registered) before
            the rollouter fails (``None``: forever). Removed/paused replicas are waited for without a timeout.
        abort_timeout_s: How long abort/pause/rebalance wait for aborted requests to come back.
        name: Thread name and log prefix.
        group_filter: ``samples -> keep``, called on each finished, rewarded group before it is delivered (e.g.
            :func:`~lightning_hybrid_rollout.rollout.group_filter.rewards_vary`): a dropped group never reaches the
            queue and a new prompt is admitted in its place (dynamic sampling). ``None``: every group is delivered.
        max_filtered_samples: Most samples the filter drops per parameter version; past it groups pass unfiltered,
            with one warning per version (``None``: no cap).
        episodes: Makes each sample a multi-turn episode (model turn, tool/environment turn, ...): an
            :class:`~lightning_hybrid_rollout.rollout.partial_rollout.EpisodeRunner` such as
            :class:`~lightning_hybrid_rollout.agentic.runtime.EpisodeDriver` (docs/agentic.md). ``None``: one model
            turn per sample.

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
        reward_fn: Callable[[Sample], float] | GroupScorer,
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
        group_filter: GroupFilterFn | None = None,
        max_filtered_samples: int | None = None,
        episodes: EpisodeRunner | None = None,
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
        if max_filtered_samples is not None and max_filtered_samples < 0:
            raise ValueError(f"max_filtered_samples must be >= 0 or None (no cap), got {max_filtered_samples}")
        if group_filter is not None and not callable(group_filter):
            raise ValueError(f"group_filter must be a callable samples -> keep, got {group_filter!r}")
        if concurrent_samples_per_replica < 1:
            raise ValueError(f"concurrent_samples_per_replica must be >= 1, got {concurrent_samples_per_replica}")
        if sampling.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens (response length) must be >= 1, got {sampling.max_tokens}")
        super().__init__(
            prompts,
            tokenize,
            reward_fn,
            message_queue,
            sampling=sampling,
            load_balancer=load_balancer if load_balancer is not None else LoadBalancer(replicas),
            n_samples_per_prompt=n_samples_per_prompt,
            max_required_samples=max_required,
            concurrent_samples_per_replica=concurrent_samples_per_replica,
            partial_rollout=partial_rollout,
            clock=clock,
            max_segment_failures=max_segment_failures,
            no_replica_timeout_s=no_replica_timeout_s,
            abort_timeout_s=abort_timeout_s,
            name=name,
            group_filter=None if group_filter is None else GroupFilter(group_filter, max_filtered_samples, name),
            episodes=episodes,
        )
        self._thread: threading.Thread | None = None
        self._loop_thread: EventLoopThread | None = None
        self._owns_loop = False
        self._stopped = False

    # ================================================================== lifecycle (trainer thread)

    def start(self, loop_thread: EventLoopThread | None = None) -> None:
        """Begin producing samples on ``loop_thread`` (the trainer process's one loop), or on a loop of its own.

        Args:
            loop_thread: The event-loop thread to produce on (the runtime's); None starts one the rollouter owns and
                closes at :meth:`stop`.
        """
        if self._started:
            raise RuntimeError(f"{self.name} was already started; create a new Rollouter (load its state_dict)")
        self._started = True
        self._owns_loop = loop_thread is None
        self._loop_thread = loop_thread if loop_thread is not None else EventLoopThread(self.name)
        self._loop = self._loop_thread.loop
        self._thread = self._loop_thread.thread
        self._loop_thread.call(self._begin)

    def stop(self, timeout: float = 30.0, *, abort_in_flight: bool = True) -> None:
        """Stop producing and join the thread; unfinished samples stay in :meth:`state_dict`.

        Args:
            timeout: Seconds to wait for the shutdown.
            abort_in_flight: Abort requests running on the replicas (frees the engines; their partial output is
                kept as the samples' prefix).
        """
        if self._loop_thread is None or not self._loop_thread.is_alive or self._stopped:
            return
        try:
            self._call(self._shutdown(abort_in_flight, timeout), timeout=timeout + 5)
        finally:
            self._stopped = True
            if self._owns_loop:
                self._loop_thread.close(timeout)

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

    @property
    def is_paused(self) -> bool:
        """Whether :meth:`pause` is in effect."""
        return self._paused

    def reset_staleness(self) -> RolloutStepStats:
        """Close the rollout window of this parameter version (call once per version, after the weight sync).

        Sets ``staleness_samples = outstanding samples + queue size`` (design/notes.md §3) and returns the window's
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

    def drain_replicas(
        self, replica_ids: Sequence[str] | None, budget_s: float, *, timeout: float | None = None
    ) -> DrainReport:
        """Drain-aware :meth:`abort_replicas`: requests that will finish within ``budget_s`` complete, the others
        are aborted (and continue from their prefix elsewhere); returns once none of them is left on the replicas.

        See :meth:`LoadBalancer.drain_replicas`; ``budget_s <= 0`` aborts everything, as :meth:`abort_replicas`.

        Args:
            replica_ids: Replicas to drain; ``None`` means all.
            budget_s: Seconds the replicas may let requests finish.
            timeout: Seconds to wait (default ``abort_timeout_s``).

        Returns:
            A :class:`~lightning_hybrid_rollout.rollout.drain.DrainReport` (drained / aborted requests, the aborted
            ones' re-prefill tokens, seconds).
        """
        return self._call(
            self.load_balancer.drain_replicas(replica_ids, budget_s, timeout=timeout or self.abort_timeout_s)
        )

    def rebalance_requests(self, *, timeout: float | None = None) -> int:
        """Clear the sticky cache, abort in-flight requests on active replicas, then let them re-route least-loaded.

        Returns once the abort calls are answered, not once the aborted requests are back (they re-route on the
        rollouter's loop as they come), so the trainer waits about one replica round trip. A request that reached an
        engine after its abort finishes where it is: a rebalance is an optimisation, not a guarantee.

        Args:
            timeout: Seconds to wait for the abort calls (default ``abort_timeout_s``).

        Returns:
            Number of requests aborted (and re-routed).
        """
        return self._call(self._rebalance_async(timeout))

    def set_syncing(self, replica_ids: Sequence[str], syncing: bool) -> None:
        """Mark replicas as under (or done with) a weight sync: their time does not count as serving.

        Only the per-role serving time of :meth:`take_role_window` reads it.

        Args:
            replica_ids: Replica ids (registered or not).
            syncing: True when the sync starts, False when it ends.
        """
        self._call(self._set_syncing_async(list(replica_ids), syncing))

    async def set_syncing_async(self, replica_ids: Sequence[str], syncing: bool) -> None:
        """:meth:`set_syncing` for a coroutine already on the rollouter's loop (the runtime's weight push)."""
        await self._set_syncing_async(list(replica_ids), syncing)

    def take_role_window(self) -> RoleWindow:
        """Close the production window per replica role and start a new one now.

        The first window starts at the first call of any control method (or :meth:`start`); serving time only
        counts while the rollouter runs.
        """
        return self._call(self._take_role_window_async())

    def peek_role_window(self) -> RoleWindow:
        """The production window per replica role *so far*, without closing it.

        For a decision that needs the cycle's measurements before its bookkeeping ends (``overlap_sync``); the next
        :meth:`take_role_window` still covers the whole window.
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
    # (``outstanding_samples`` and ``counters()`` come with the ProductionLoop, which uses them too)

    @property
    def max_concurrent_samples(self) -> int:
        """Current in-flight cap: ``min(active_servers * concurrent_samples_per_replica, max_required_samples)``."""
        return self._cap()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The rollouter's event loop (running in its thread after :meth:`start`), e.g. for ``push_weights(loop=)``."""
        return self._loop

    @property
    def loop_thread(self) -> EventLoopThread | None:
        """The event-loop thread the rollouter produces on (its own, or the one given to :meth:`start`)."""
        return self._loop_thread

    @property
    def in_flight(self) -> int:
        """Samples dispatched and not finished (parked ones included), less the episodes counted in
        :attr:`episodes_in_tools`: the samples the in-flight cap bounds."""
        return self._in_flight

    @property
    def episodes_in_tools(self) -> int:
        """Episodes in a tool/environment turn, or back from it and waiting for an in-flight slot (they hold none)."""
        return self._in_tools

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
        return self._loop_thread is not None and self._loop_thread.is_alive and not self._stopping

    def state_dict(self) -> dict[str, Any]:
        """Counters, unfinished prompt groups (with their generated prefixes) and the queue's buffered samples.

        Taken atomically on the loop, so a checkpoint neither loses nor duplicates a sample; a checkpointable prompt
        iterable's position is taken in the same step (``"prompts"``).
        """
        return self._call(self._state_dict_async())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (before :meth:`start`): unfinished groups are generated first.

        Args:
            state: What :meth:`state_dict` returned.
        """
        if self._started:
            raise RuntimeError("load_state_dict must be called before start()")
        self._restore(state)

    # ================================================================== the bridge to the loop

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a control coroutine on the loop from another thread (or inline before start/after stop)."""
        lt = self._loop_thread
        if lt is None or not lt.is_alive:
            return asyncio.run(coro)
        loop = lt.loop
        if lt.in_loop_thread():
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
