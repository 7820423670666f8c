"""The rollouter's producer on its own event loop: admit prompt groups, dispatch samples, deliver whole groups.

:class:`ProductionLoop` is the loop side of :class:`~lightning_hybrid_rollout.rollout.rollouter.Rollouter`, which
turns its ``_*_async`` coroutines into thread-safe methods; everything here runs on that one loop, so nothing takes a
lock. A group is dispatched as one batch once the in-flight cap has room for it, rewarded once all its samples are
finished, and put into the queue in one atomic put (docs/rollout.md). An episode in its tool/environment turn holds
no engine request, so it leaves the in-flight count for that turn and takes a slot again, ahead of new dispatches,
before its next model turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.flow_control import admits_group, in_flight_cap, staleness_after_reset
from lightning_hybrid_rollout.rollout.group_filter import FilterWindow, GroupFilter
from lightning_hybrid_rollout.rollout.load_balancer import LoadBalancer
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.partial_rollout import EpisodeRunner, SampleGenerator
from lightning_hybrid_rollout.rollout.prompts import PromptItem, parse_prompt_item
from lightning_hybrid_rollout.rollout.role_window import RoleProduction, RoleWindow
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.rollout.sample_state import PromptGroup, SampleState
from lightning_hybrid_rollout.rollout.utilization import RolloutStepStats, UtilizationHistory

log = logging.getLogger("lightning_hybrid_rollout.rollout.rollouter")  # the Rollouter's records keep their logger

T = TypeVar("T")


@runtime_checkable
class GroupScorer(Protocol):
    """Rewards a finished prompt group with one awaited call (the reward functions run off the rollouter's loop)."""

    async def score_group(self, samples: Sequence[Sample]) -> Sequence[float]:
        """One reward per sample, in order; raising stops the rollouter with that error."""
        ...


@runtime_checkable
class CheckpointablePrompts(Protocol):
    """A prompt iterable whose position is part of the rollouter's ``state_dict`` (taken on the loop, atomically)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class ProductionLoop:
    """The loop side of the :class:`~lightning_hybrid_rollout.rollout.rollouter.Rollouter`, not used on its own.

    Takes the Rollouter's arguments, checked, with ``max_required_samples`` resolved and the ``load_balancer`` built.
    """

    def __init__(
        self,
        prompts: Iterable[PromptItem],
        tokenize: Callable[[str], Sequence[int]],
        reward_fn: Callable[[Sample], float] | GroupScorer,
        message_queue: MessageQueue,
        *,
        sampling: SamplingSpec,
        load_balancer: LoadBalancer,
        n_samples_per_prompt: int,
        max_required_samples: int,
        concurrent_samples_per_replica: int,
        partial_rollout: bool,
        clock: Callable[[], float],
        max_segment_failures: int,
        no_replica_timeout_s: float | None,
        abort_timeout_s: float,
        name: str,
        group_filter: GroupFilter | None = None,
        episodes: EpisodeRunner | None = None,
    ) -> None:
        #: The prompt iterable itself: its position is checkpointed when it is a :class:`CheckpointablePrompts`.
        self._prompt_source = prompts
        self._prompts_iter: Iterator[PromptItem] | None = None
        self._tokenize = tokenize
        self._reward_fn = reward_fn
        self._scorer: GroupScorer | None = reward_fn if isinstance(reward_fn, GroupScorer) else None
        self.message_queue = message_queue
        self.sampling = sampling
        self.load_balancer = load_balancer
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_required_samples = max_required_samples
        self.concurrent_samples_per_replica = concurrent_samples_per_replica
        self.partial_rollout = partial_rollout
        self.max_segment_failures = max_segment_failures
        self.no_replica_timeout_s = no_replica_timeout_s
        self.abort_timeout_s = abort_timeout_s
        self.name = name
        self._clock = clock
        #: Drops finished groups before the queue (dynamic sampling); their prompts are replaced by new ones.
        self.group_filter = group_filter
        #: Makes each sample a multi-turn episode (tools, an environment); None: one model turn per sample.
        self.episodes = episodes

        # counters (checkpointed)
        self.param_version = 0
        self.staleness_samples = 0
        self.total_prompts = 0
        self.total_admitted_samples = 0
        self.total_generated_samples = 0
        self.total_delivered_samples = 0
        self.total_filtered_groups = 0
        self.total_filtered_samples = 0
        self.aborted_segments = 0
        self.retried_segments = 0
        self.dead_replica_retries = 0
        self.failed_segments = 0
        self.rejected_segments = 0
        self.replica_calls = 0  # generation calls (one per batch round): a group's samples share one
        self.dropped = 0
        self.step_generated_samples = 0
        self._window_admitted = 0
        self._group_counter = 0

        # runtime state
        self._groups: dict[str, PromptGroup] = {}
        self._to_dispatch: deque[SampleState] = deque()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Samples dispatched and not finished, less the episodes in a tool/environment turn: what the cap counts.
        self._in_flight = 0
        self._parked = 0
        #: Episodes in a tool/environment turn, or back from it and waiting for a slot (they hold none).
        self._in_tools = 0
        #: Those waiting for a slot, in arrival order; they get one before any new dispatch.
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._history = UtilizationHistory(self._cap())
        self._exhausted = False
        self._stopping = False
        self._paused = False
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._gate: asyncio.Event | None = None
        self._space: asyncio.Event | None = None
        self._drained = threading.Event()
        self._started = False
        self._role_production = RoleProduction()  # tokens and serving seconds per replica role, on the loop only
        self._generator = SampleGenerator(self, self._role_production, clock)

        self.load_balancer.add_listener(self._on_pool_change)
        self.message_queue.add_listener(self._on_queue_space)

    # ================================================================== counters

    @property
    def outstanding_samples(self) -> int:
        """Admitted samples neither delivered to the queue nor dropped by the group filter."""
        return self.total_admitted_samples - self.total_delivered_samples - self.total_filtered_samples

    def counters(self) -> dict[str, int]:
        """Monotonic counters (for logging under ``fully_async/rollouter/*``)."""
        return {
            "total_prompts": self.total_prompts,
            "total_admitted_samples": self.total_admitted_samples,
            "total_generated_samples": self.total_generated_samples,
            "total_delivered_samples": self.total_delivered_samples,
            "total_filtered_groups": self.total_filtered_groups,
            "total_filtered_samples": self.total_filtered_samples,
            "aborted_segments": self.aborted_segments,
            "retried_segments": self.retried_segments,
            "dead_replica_retries": self.dead_replica_retries,
            "failed_segments": self.failed_segments,
            "rejected_segments": self.rejected_segments,
            "replica_calls": self.replica_calls,
            "dropped": self.dropped,
            "staleness_samples": self.staleness_samples,
            "in_flight": self._in_flight,
            "episodes_in_tools": self._in_tools,
        }

    # ================================================================== the loop

    def _begin(self) -> None:
        """On the loop's thread: the loop-side events and the main task (the loop itself runs elsewhere)."""
        loop = self._loop
        assert loop is not None
        self._wake = asyncio.Event()
        self._gate = asyncio.Event()
        self._space = asyncio.Event()
        if not self._paused:
            self._gate.set()
        self._main_task = loop.create_task(self._main())

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
        self._grant_slots()
        if self._stopping or self._paused or self._error is not None:
            return False
        if self._slot_waiters:  # episodes back from their tools go first: a started episode finishes first
            return False
        cap = self._cap()
        if self._to_dispatch:
            room = cap - self._in_flight
            take = self._head_batch_size(cap)
            if room < take:  # take >= 1
                return False
            self._dispatch([self._to_dispatch.popleft() for _ in range(take)])
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
        if self._prompts_iter is None:  # first drawn here, after any load_state_dict
            self._prompts_iter = iter(self._prompt_source)
        try:
            item = next(self._prompts_iter)
        except StopIteration:
            self._exhausted = True
            log.info("%s: prompt iterator exhausted after %d prompts", self.name, self.total_prompts)
            return False
        self._admit(item)
        return True

    def _head_batch_size(self, cap: int) -> int:
        """How many samples the next dispatch takes: the head group's samples waiting here, or ``cap`` of them if
        they are more.

        A group waits until the cap has room for all of them, rather than going out in parts: parts finish at their
        own times, leave the in-flight count off a multiple of the group size, and so split the next groups too (a
        retry or an abort at a weight sync starts it). Measured on ``benchmarks/cpu_miniature.py``: 2.1-2.5 replica
        calls per group before, each paying its own Ray round trip and prefill.
        """
        group_id = self._to_dispatch[0].group_id
        take = 0
        for st in self._to_dispatch:
            if st.group_id != group_id or take >= cap:
                break
            take += 1
        return max(take, 1)

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

    def _dispatch(self, batch: list[SampleState]) -> None:
        """Start one task for ``batch`` (samples of one group, in flight together: one replica call per round)."""
        assert self._loop is not None
        self._in_flight += len(batch)
        self._record()
        name = batch[0].uid
        self._tasks[name] = self._loop.create_task(self._run_batch(batch), name=name)

    async def _run_batch(self, batch: list[SampleState]) -> None:
        assert self._gate is not None
        group = self._groups[batch[0].group_id]
        running = {st.uid for st in batch}

        def finished(st: SampleState, reason: str) -> None:
            self._finish(st, group, reason)
            running.discard(st.uid)
            self._in_flight -= 1
            self._record()
            self._kick()

        try:
            try:
                await self._generator.generate(
                    batch,
                    group,
                    gate=self._gate,
                    park=self._park,
                    stopping=lambda: self._stopping,
                    finished=finished,
                    tool_turn=self._tool_turn,
                )
            finally:
                if running:  # unfinished (the rollouter stopped, or an error): their state stays in the group
                    self._in_flight -= len(running)
                    self._record()
                    self._kick()
            if not running and group.done:
                await self._deliver_group(group)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
        finally:
            self._tasks.pop(batch[0].uid, None)
            self._check_drained()

    def _finish(self, st: SampleState, group: PromptGroup, reason: str) -> None:
        sample = st.to_sample(group, reason, self._clock())
        if self._scorer is None:
            sample.reward = float(self._reward_fn(sample))  # type: ignore[operator]
        st.result = sample
        self.total_generated_samples += 1
        self.step_generated_samples += 1

    async def _park(self, n: int) -> None:
        assert self._gate is not None
        self._parked += n
        self._record()
        try:
            await self._gate.wait()
        finally:
            self._parked -= n
            self._record()

    async def _tool_turn(self, turn: Awaitable[str | None]) -> str | None:
        """Await an episode's tool/environment turn (``EpisodeRunner.after_turn``) off its in-flight slot.

        The episode holds no engine request meanwhile, so the replica's slot goes to another sample. When a model
        turn follows, the episode waits for a slot again (ahead of new dispatches); when it returns or raises it
        holds one again, which ``finished`` or the batch's bookkeeping releases.
        """
        self._in_flight -= 1
        self._in_tools += 1
        self._record()
        self._kick()
        try:
            reason = await turn
        except BaseException:
            self._hold_slot()
            raise
        if reason is None:
            await self._take_slot()  # holds a slot once it returns or raises
        else:
            self._hold_slot()  # the episode ended: finished() releases the slot at once
        return reason

    def _hold_slot(self) -> None:
        self._in_tools -= 1
        self._in_flight += 1
        self._record()

    async def _take_slot(self) -> None:
        """Wait until the cap has room (or the rollouter stops), behind the episodes that came back earlier."""
        if not self._slot_waiters and (self._in_flight < self._cap() or self._stopping):
            self._hold_slot()
            return
        assert self._loop is not None
        granted = self._loop.create_future()
        self._slot_waiters.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if not granted.done() or granted.cancelled():  # not granted: hold one for the batch's bookkeeping
                with contextlib.suppress(ValueError):
                    self._slot_waiters.remove(granted)
                self._hold_slot()
            raise

    def _grant_slots(self) -> None:
        """Give the waiting episodes the slots the cap has room for (all of them once stopping: they return)."""
        while self._slot_waiters and (self._in_flight < self._cap() or self._stopping):
            granted = self._slot_waiters.popleft()
            if not granted.done():
                granted.set_result(None)
                self._hold_slot()

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
            if self._scorer is not None and not group.scored:
                rewards = list(await self._scorer.score_group(samples))
                if len(rewards) != len(samples):
                    raise RuntimeError(f"{self.name}: the group scorer gave {len(rewards)} rewards for {len(samples)}")
                for sample, reward in zip(samples, rewards):
                    sample.reward = float(reward)
                group.scored = True
            if self.group_filter is not None and self.group_filter.drops(samples):
                self._drop_group(group, samples)
                return
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
        if self._stopping and self._error is None:  # the end of a fit: _shutdown says once what it kept
            return
        log.warning(
            "%s: %d samples of %s not delivered (queue closed); kept in state_dict",
            self.name,
            len(samples),
            group.group_id,
        )

    def _drop_group(self, group: PromptGroup, samples: list[Sample]) -> None:
        """Drop a filtered group: its prompt stays consumed, and its samples leave the staleness budget so that a
        new prompt is admitted in its place (the refill)."""
        del self._groups[group.group_id]
        n = len(samples)
        self.total_filtered_groups += 1
        self.total_filtered_samples += n
        self.staleness_samples = max(0, self.staleness_samples - n)
        log.debug("%s: group %s dropped by the group filter (%d samples)", self.name, group.group_id, n)
        self._kick()

    # ================================================================== operations (the Rollouter's control methods)

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
            filtering=self.group_filter.close_window() if self.group_filter is not None else FilterWindow(),
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
            # the aborted requests re-route as they come back (see Rollouter.rebalance_requests): not waited for
            n = await lb.abort_replicas(lb.replica_ids("active"), wait=False, timeout=timeout or self.abort_timeout_s)
        finally:
            if gate is not None and was_open and not self._paused:
                gate.set()
        log.debug("%s: rebalanced %d in-flight requests over %s", self.name, n, lb.routable_replica_ids())
        return n

    async def _shutdown(self, abort_in_flight: bool, timeout: float) -> None:
        self._stopping = True
        self._tick_serving()
        if self._gate is not None:
            self._gate.set()  # parked samples see _stopping and return
        self._grant_slots()  # ... and so do episodes waiting for a slot
        if self._space is not None:
            self._space.set()  # samples waiting for queue room give up (their group stays in state_dict)
            await asyncio.sleep(0)  # ... by themselves, before the tasks are cancelled
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
        finished = sum(s.result is not None for g in self._groups.values() for s in g.samples)
        unfinished = sum(s.result is None for g in self._groups.values() for s in g.samples)
        if finished or unfinished:
            log.info(
                "%s: stopped with %d finished samples not yet in the queue and %d unfinished ones (%d groups), kept "
                "in its state_dict (a fit resumed from a checkpoint that holds them continues them)",
                self.name,
                finished,
                unfinished,
                len(self._groups),
            )

    async def _state_dict_async(self) -> dict[str, Any]:
        counters = self.counters()
        return {
            "counters": counters,
            "param_version": self.param_version,
            "group_counter": self._group_counter,
            "pending_groups": [g.to_state() for g in self._groups.values()],
            "message_queue": self.message_queue.state_dict(),
            **({"prompts": self._prompt_source.state_dict()} if self._checkpoints_prompts() else {}),
        }

    def _checkpoints_prompts(self) -> bool:
        return isinstance(self._prompt_source, CheckpointablePrompts)

    def _restore(self, state: Mapping[str, Any]) -> None:
        """Load what :meth:`_state_dict_async` returned (before the loop starts): unfinished groups go first."""
        for key, value in state["counters"].items():
            if key not in ("in_flight", "episodes_in_tools"):  # live counts, not checkpointed state
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
        if "prompts" in state and self._checkpoints_prompts():
            if self._prompts_iter is not None:
                raise RuntimeError(f"{self.name}: the prompt stream's position can only be restored before it is read")
            self._prompt_source.load_state_dict(state["prompts"])  # type: ignore[union-attr]
        self.staleness_samples = staleness_after_reset(self.outstanding_samples, self.message_queue.size())

    # ================================================================== helpers

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
        self._grant_slots()
        self._kick()
