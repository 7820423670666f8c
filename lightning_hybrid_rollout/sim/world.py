"""The rollout side of the simulator: replicas, load balancer, rollouter and message queue on a virtual clock that moves
only when the trainer side asks, mirroring the runtime's rollouter (design/notes.md §3; docs/simulator.md, "What is
modelled").

Example::

    from lightning_hybrid_rollout.sim.scenario import Scenario
    from lightning_hybrid_rollout.sim.world import RolloutWorld

    sc = Scenario.from_dict({"name": "w", "runs": [{"name": "r", "train_devices": 4, "rollout_devices": 4}]})
    world = RolloutWorld(sc, sc.runs[0])
    world.start()
    world.run_until(lambda: world.queue_size >= 4, "4 samples")
    assert world.queue_size >= 4 and world.now > 0
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from lightning_hybrid_rollout.errors import SimulationError as SimulationError  # re-exported
from lightning_hybrid_rollout.sim.scenario import ReplicaModel, RunSpec, Scenario
from lightning_hybrid_rollout.trace import IN_FLIGHT, QUEUE_DEPTH, TraceWriter

logger = logging.getLogger(__name__)

__all__ = ["ProductionWindow", "RolloutWorld", "SimReplica", "SimSample", "SimulationError"]

_EPS = 1e-9


@dataclass(eq=False)
class SimSample:
    """One sample being generated (or generated).

    Args:
        sid: Admission index (0, 1, ...).
        gid: Group index.
        length: Tokens it decodes in total.
        remaining: Tokens still to decode (partial rollout keeps the rest).
        admitted_version: Param version when admitted.
        admitted_t: Virtual time of admission.
        turns: A multi-turn episode's per-turn lengths (empty: one turn of ``length``); ``remaining`` is then the
            current turn's.
        tool_s: Seconds of the tool call after each turn but the last.
        extra_tokens: Tokens trained over but not decoded (tool results).
    """

    sid: int
    gid: int
    length: int
    remaining: float
    admitted_version: int
    admitted_t: float
    replica: SimReplica | None = None
    target: float = 0.0
    seq: int = 0
    work_at_route: float = 0.0
    finished_t: float | None = None
    min_version: int | None = None
    max_version: int | None = None
    aborts: int = 0
    turns: tuple[int, ...] = ()
    tool_s: tuple[float, ...] = ()
    extra_tokens: int = 0
    turn: int = 0
    done_before: int = 0

    def decoded(self, remaining: float) -> float:
        """Tokens decoded so far (earlier turns included), with ``remaining`` tokens of the current turn left.

        A re-prefill penalty still in ``remaining`` counts against it (the decode-token equivalents booked as
        re-prefill), so it may be below ``done_before`` right after an abort.
        """
        turn = self.turns[self.turn] if self.turns else self.length
        return self.done_before + turn - remaining


@dataclass(eq=False)
class SimReplica:
    """One replica: its model, state, and the samples it is decoding.

    ``progress`` is the tokens decoded so far by *each* sample that has been on it since the start (all in-flight
    samples decode at the same speed), so a sample finishes when ``progress`` reaches its ``target``.
    """

    name: str
    kind: str
    index: int
    model: ReplicaModel
    cap: int
    first_device: int
    state: str = "parked"
    serving: bool = False
    routable: bool = False
    awake: bool = False
    progress: float = 0.0
    last_t: float = 0.0
    tokens: float = 0.0
    members: dict[int, SimSample] = field(default_factory=dict)
    heap: list[tuple[float, int, int]] = field(default_factory=list)
    state_since: float = 0.0
    limit: int = 0
    speed_factor: float = 1.0  # the share of its speed it keeps now (``model.speed_while_training`` while training)
    _speed: float = -1.0  # cached speed(); -1 = stale (invalidate with touch())

    @property
    def devices(self) -> list[int]:
        """The device indices it occupies."""
        return list(range(self.first_device, self.first_device + self.model.devices))

    def speed(self) -> float:
        """Tokens/s each in-flight sample decodes at now (0 while not serving)."""
        if self._speed >= 0.0:
            return self._speed
        n = len(self.members)
        if not self.serving or n == 0:
            self._speed = 0.0
        else:
            self._speed = self.model.throughput(n, self.limit or self.cap) * self.speed_factor / n
        return self._speed

    def touch(self) -> None:
        """Invalidate the cached speed (after a change of members, serving flag or limit)."""
        self._speed = -1.0

    def advance(self, t: float) -> None:
        """Move this replica's progress to time ``t``."""
        if t > self.last_t:
            v = self.speed()
            if v > 0.0:
                d = v * (t - self.last_t)
                self.progress += d
                self.tokens += d * len(self.members)
            self.last_t = t

    def _top(self) -> tuple[float, int, int] | None:
        heap = self.heap
        while heap:
            _, seq, sid = heap[0]
            s = self.members.get(sid)
            if s is not None and s.seq == seq:
                return heap[0]
            heapq.heappop(heap)
        return None

    def next_completion(self) -> float:
        """Virtual time of its next sample completion (``inf`` if none is in progress)."""
        top = self._top()
        if top is None:
            return math.inf
        v = self.speed()
        if v <= 0.0:
            return math.inf
        return self.last_t + max(0.0, top[0] - self.progress) / v


@dataclass
class ProductionWindow:
    """Decode work per replica kind since the last :meth:`RolloutWorld.take_window`.

    Args:
        serving_s: Seconds during which at least one replica of the kind was serving.
        tokens: Tokens the kind's replicas decoded (re-prefill penalties included).
        delivered: Samples delivered to the queue.
        delivered_tokens: Their response tokens.
    """

    serving_s: dict[str, float] = field(default_factory=lambda: {"standalone": 0.0, "hybrid": 0.0})
    tokens: dict[str, float] = field(default_factory=lambda: {"standalone": 0.0, "hybrid": 0.0})
    delivered: int = 0
    delivered_tokens: int = 0


class RolloutWorld:
    """Replicas + load balancer + rollouter + message queue, advanced by the trainer side.

    Args:
        scenario: The scenario.
        run: The run (its device split decides the replicas).
        trace: Optional trace writer for replica states and queue counters.
    """

    def __init__(
        self, scenario: Scenario, run: RunSpec, trace: TraceWriter | None = None, counter_interval_s: float = 2.0
    ) -> None:
        self.scenario = scenario
        self.run = run
        self.trace = trace
        self.now = 0.0
        self.version = 0
        #: Training progress the length model follows, in sync cycles of ``trigger_parameter_sync_step`` micro-steps
        #: (equal to ``version`` unless a run's first cycle is shorter; see ``RunSpec.early_first_sync``).
        self.progress = 0.0
        self.progress_at: dict[int, float] = {0: 0.0}
        self.max_required = scenario.max_required_samples
        self.queue_bound = scenario.max_required_samples
        self.group_size = scenario.group_size
        self._z_rng = random.Random(scenario.seed)
        self._episode_rng = random.Random(scenario.seed + 1)  # turns and tool latencies (own stream)
        #: Episodes waiting on a tool call, by sid, and their returns ``(time, seq, sid)``.
        self.tool_waiting: dict[int, SimSample] = {}
        self._tool_heap: list[tuple[float, int, int]] = []
        self._seq = itertools.count()
        self.replicas: list[SimReplica] = []
        device = 0
        hm = scenario.hybrid_model
        if run.hybrid:
            for i in range(run.train_devices // hm.devices):
                self.replicas.append(SimReplica(f"hybrid_{i}", "hybrid", i, hm, scenario.cap_of(hm), device))
                device += hm.devices
        else:
            device += run.train_devices
        self.train_device_range = (0, run.train_devices)
        sm = scenario.replica
        for i in range(run.rollout_devices // sm.devices):
            r = SimReplica(f"standalone_{i}", "standalone", i, sm, scenario.cap_of(sm), device)
            r.state, r.serving, r.routable, r.awake = "active", True, True, True
            self.replicas.append(r)
            device += sm.devices
        #: Device-second accounting behind ``RunResult.gap_s``, in standalone device-seconds at the best standalone
        #: rate of the current progress (``standalone_peak_per_device`` tokens/s; see :meth:`_account`).
        self.device_account: dict[str, float] = {}
        self.standalone_peak_per_device = 1.0
        self._set_limits()
        self._cap_cache = -1
        self.standalone = [r for r in self.replicas if r.kind == "standalone"]
        self.hybrid = [r for r in self.replicas if r.kind == "hybrid"]
        # rollouter
        self.started = False
        self.staleness_samples = 0
        self.in_flight = 0
        self.parked: deque[SimSample] = deque()
        self.to_dispatch: deque[SimSample] = deque()
        self.group_left: dict[int, int] = {}
        self.group_samples: dict[int, list[SimSample]] = {}
        self.queue: deque[SimSample] = deque()
        self.admitted = 0
        self.generated = 0  # samples delivered to the queue (cumulative)
        self.consumed = 0
        self.step_generated = 0
        self.history: list[tuple[float, int, int]] = []
        self._last_cap = -1
        # accounting
        self.throttled_s = 0.0
        self._throttled = False
        self.window = ProductionWindow()
        self._window_tokens0 = {"standalone": 0.0, "hybrid": 0.0}
        #: Seconds each replica kind was serving since the start (the runtime's ``serving_s.<role>`` running total).
        self.serving_total = {"standalone": 0.0, "hybrid": 0.0}
        self.cumulative_aborts = 0
        self.counter_interval_s = counter_interval_s
        self._counter_last: dict[str, tuple[float, float]] = {}  # name -> (time written, value written)
        self._counter_pending: dict[str, float] = {}
        if trace is not None:
            for r in self.replicas:
                kv = {} if r.model.kv_cache_tokens is None else {"kv_cache_tokens": r.model.kv_cache_tokens}
                trace.describe_track(self.track(r), kind=r.kind, devices=r.devices, concurrency=r.cap, **kv)

    # ------------------------------------------------------------------------------------------- properties

    @staticmethod
    def track(r: SimReplica) -> str:
        """Trace track of a replica."""
        return f"replica/{r.name}"

    @property
    def queue_size(self) -> int:
        """Samples in the message queue."""
        return len(self.queue)

    @property
    def outstanding(self) -> int:
        """Admitted samples not yet in the queue (in flight, waiting for dispatch, or parked)."""
        return self.admitted - self.generated

    def cap(self) -> int:
        """The rollouter's concurrency cap now."""
        if self._cap_cache < 0:
            total = sum(r.cap for r in self.replicas if r.routable)
            self._cap_cache = min(total, self.max_required)
        return self._cap_cache

    def hybrid_serving(self) -> bool:
        """Whether any hybrid replica is routable and serving."""
        return any(r.serving and r.routable for r in self.hybrid)

    # ---------------------------------------------------------------------------------------------- clock

    def _set_time(self, t: float) -> None:
        if t < self.now - _EPS:
            raise SimulationError(f"the virtual clock cannot go back: now={self.now}, asked {t}")
        dt = t - self.now
        if dt > 0:
            self._account(dt)
            if self._throttled:
                self.throttled_s += dt
            if any(r.serving for r in self.standalone):
                self.window.serving_s["standalone"] += dt
                self.serving_total["standalone"] += dt
            if any(r.serving for r in self.hybrid):
                self.window.serving_s["hybrid"] += dt
                self.serving_total["hybrid"] += dt
            self.now = t

    def _account(self, dt: float) -> None:
        """Add ``dt`` seconds of every replica's state to :attr:`device_account`.

        Serving replicas: what they decode (``<kind>_decoded``) and what they could decode more at their own peak
        (``<kind>_below_peak``, ``standalone_below_peak_throttled`` while admission is blocked) and what they decode
        below their best speed (``<kind>_slowed``: the trainer's training takes it off, or, with a
        ``speed_while_training`` above 1, its absence does), all in standalone device-seconds at the best speed, so
        the three add up to the replica's peak; standalone replicas not serving: their device-seconds per state
        (``standalone_<state>``).
        """
        acc = self.device_account
        unit = self.standalone_peak_per_device
        for r in self.replicas:
            kind = r.kind
            if r.serving:
                limit = r.limit or r.cap
                best = r.model.best_speed
                full = r.model.throughput(len(r.members), limit)
                x = full * r.speed_factor
                short = (r.model.throughput(limit, limit) - full) * best * dt / unit
                acc[kind + "_decoded"] = acc.get(kind + "_decoded", 0.0) + x * dt / unit
                if x < full * best:
                    acc[kind + "_slowed"] = acc.get(kind + "_slowed", 0.0) + (full * best - x) * dt / unit
                key = kind + ("_below_peak_throttled" if self._throttled and kind == "standalone" else "_below_peak")
                acc[key] = acc.get(key, 0.0) + short
            elif kind == "standalone":
                key = "standalone_" + r.state
                acc[key] = acc.get(key, 0.0) + r.model.devices * dt

    def set_trainer_training(self, training: bool) -> None:
        """The trainer starts (``True``) or ends a training step now: every replica decodes at
        ``model.speed_while_training`` of its speed meanwhile (progress so far is kept at the old speed)."""
        for r in self.replicas:
            factor = r.model.speed_while_training if training else 1.0
            if factor != r.speed_factor:
                r.advance(self.now)
                r.speed_factor = factor
                r.touch()

    def advance_to(self, t: float) -> None:
        """Process every completion up to ``t``, then set the clock to ``t``.

        Args:
            t: Virtual time (>= now).
        """
        while True:
            t_next, r = self._next_completion()
            if t_next > t:
                break
            self._fire(r, t_next)
        self._set_time(max(t, self.now))

    def run_until(self, predicate: Callable[[], bool], what: str, limit_s: float = 1e9) -> float:
        """Process completions until ``predicate()`` holds; return the seconds waited.

        Args:
            predicate: Checked now and after every completion.
            what: What is awaited (for the error message).
            limit_s: Give up after this much virtual time.

        Raises:
            SimulationError: Nothing can make ``predicate`` true (no sample in progress) or ``limit_s`` passed.
        """
        start = self.now
        while not predicate():
            t_next, r = self._next_completion()
            if t_next == math.inf:
                raise SimulationError(
                    f"waiting for {what} at t={self.now:.3f}s but nothing is generating: queue={self.queue_size}, "
                    f"in_flight={self.in_flight}, cap={self.cap()}, staleness={self.staleness_samples}/"
                    f"{self.max_required}; check the run's devices and the policy"
                )
            if t_next - start > limit_s:
                raise SimulationError(f"waited more than {limit_s}s of virtual time for {what}")
            self._fire(r, t_next)
        return self.now - start

    def _next_completion(self) -> tuple[float, SimReplica | None]:
        """The next event: a turn's completion on a replica, or (replica None) a tool call's return."""
        best_t, best_r = math.inf, None
        for r in self.replicas:
            t = r.next_completion()
            if t < best_t:
                best_t, best_r = t, r
        if self._tool_heap and self._tool_heap[0][0] < best_t:
            return self._tool_heap[0][0], None
        return best_t, best_r

    def _fire(self, r: SimReplica | None, t: float) -> None:
        if r is not None:
            self._complete(r, t)
            return
        _, _, sid = heapq.heappop(self._tool_heap)
        s = self.tool_waiting.pop(sid)
        self._set_time(t)
        if not self._route(s):
            self.parked.append(s)
        self._record()

    def _complete(self, r: SimReplica, t: float) -> None:
        self._set_time(t)
        r.advance(t)
        top = r._top()
        assert top is not None
        _, _, sid = heapq.heappop(r.heap)
        s = r.members.pop(sid)
        r.touch()
        r.progress = max(r.progress, s.target)
        s.replica = None
        if s.turn + 1 < len(s.turns):  # a model turn ends: the episode calls a tool, off the replica
            s.done_before += s.turns[s.turn]
            s.turn += 1
            s.remaining = float(s.turns[s.turn])
            self.tool_waiting[s.sid] = s
            heapq.heappush(self._tool_heap, (t + s.tool_s[s.turn - 1], next(self._seq), s.sid))
            self._record()
            return
        s.remaining = 0.0
        s.finished_t = t
        s.max_version = self.version
        self.in_flight -= 1
        left = self.group_left[s.gid] - 1
        self.group_left[s.gid] = left
        if left == 0:
            del self.group_left[s.gid]
            group = self.group_samples.pop(s.gid)
            self.queue.extend(group)
            self.generated += len(group)
            self.step_generated += len(group)
            w = self.window
            w.delivered += len(group)
            w.delivered_tokens += sum(g.length for g in group)
            self._counter(QUEUE_DEPTH, self.queue_size)
        self._record()
        self._progress()
        self._counter(IN_FLIGHT, self.in_flight)

    # ------------------------------------------------------------------------------------------- rollouter

    def start(self) -> None:
        """Start admitting (time 0): seed the utilization history with the real capacity."""
        self.started = True
        self._last_cap = self.cap()
        self.history = [(self.now, 0, self._last_cap)]
        self._progress()
        self._counter(IN_FLIGHT, self.in_flight)
        self._counter(QUEUE_DEPTH, self.queue_size)
        for r in self.replicas:
            r.state_since = self.now

    def _record(self) -> None:
        if not self.started:
            return
        cap = self.cap()
        self._last_cap = cap
        self.history.append((self.now, self.in_flight - len(self.parked), cap))

    def _admission_blocked(self) -> bool:
        return self.queue_size >= self.queue_bound or self.staleness_samples + self.group_size > self.max_required

    def _progress(self) -> None:
        """Dispatch admitted samples and admit groups while the flow control allows (runtime's ``_progress``)."""
        if not self.started:
            return
        while True:
            cap = self.cap()
            if self.to_dispatch:
                if self.in_flight >= cap:
                    break
                self._dispatch(self.to_dispatch.popleft())
                continue
            if self.in_flight >= cap or self._admission_blocked():
                break
            self._admit()
        self._throttled = self.in_flight < self.cap() and not self.to_dispatch and self._admission_blocked()

    def _admit(self) -> None:
        gid = self.admitted // self.group_size
        group = []
        for _ in range(self.group_size):
            z = self._z_rng.gauss(0.0, 1.0)
            length = self.scenario.lengths.length(z, self.progress)
            s = SimSample(self.admitted, gid, length, float(length), self.version, self.now)
            if self.scenario.multi_turn:
                self._draw_episode(s)
            self.admitted += 1
            group.append(s)
        self.group_left[gid] = len(group)
        self.group_samples[gid] = group
        self.staleness_samples += len(group)
        self.to_dispatch.extend(group)

    def _draw_episode(self, s: SimSample) -> None:
        """Make ``s`` a multi-turn episode: its turns (the first keeps ``s.length``) and tool latencies."""
        ag, lengths, rng = self.scenario.agentic, self.scenario.lengths, self._episode_rng
        n = rng.randint(ag.min_turns, ag.max_turns)
        turns = [s.length] + [lengths.length(rng.gauss(0.0, 1.0), self.progress) for _ in range(n - 1)]
        s.turns = tuple(turns)
        s.tool_s = tuple(ag.tool_latency(rng.gauss(0.0, 1.0)) for _ in range(n - 1))
        s.length = sum(turns)
        s.extra_tokens = ag.tool_output_tokens * (n - 1)

    def _dispatch(self, s: SimSample) -> None:
        self.in_flight += 1
        if s.min_version is None:
            s.min_version = self.version
        if not self._route(s):
            self.parked.append(s)
        self._record()

    def _route(self, s: SimSample) -> bool:
        best: SimReplica | None = None
        best_load = math.inf
        for r in self.replicas:
            if r.routable:
                load = len(r.members) / r.cap
                if load < best_load:
                    best, best_load = r, load
        if best is None:
            return False
        best.advance(self.now)
        s.replica = best
        s.seq = next(self._seq)
        s.work_at_route = s.remaining
        s.target = best.progress + s.remaining
        best.members[s.sid] = s
        best.touch()
        heapq.heappush(best.heap, (s.target, s.seq, s.sid))
        return True

    def _route_parked(self) -> None:
        n = len(self.parked)
        for _ in range(n):
            s = self.parked.popleft()
            if not self._route(s):
                self.parked.append(s)
                break

    def take(self, n: int) -> list[SimSample]:
        """The trainer takes ``n`` samples from the queue (FIFO)."""
        if n > self.queue_size:
            raise SimulationError(f"take({n}) with only {self.queue_size} samples in the queue")
        batch = [self.queue.popleft() for _ in range(n)]
        self.consumed += n
        self._counter(QUEUE_DEPTH, self.queue_size)
        self._progress()
        return batch

    def reset_staleness(self) -> tuple[list[tuple[float, int, int]], int]:
        """Close the rollouter's step window (once per param version).

        Returns:
            ``(history, step_generated_samples)`` of the closed window.
        """
        self.staleness_samples = self.outstanding + self.queue_size
        self._record()
        history = self.history
        self.history = [history[-1]]
        generated, self.step_generated = self.step_generated, 0
        self._progress()
        return history, generated

    def _set_limits(self) -> None:
        context = self.scenario.context_at(self.progress)
        sm = self.scenario.replica
        limit = sm.run_limit(self.scenario.cap_of(sm), context)
        self.standalone_peak_per_device = sm.throughput(limit, limit) * sm.best_speed / sm.devices
        for r in self.replicas:
            r.advance(self.now)
            r.limit = r.model.run_limit(r.cap, context)
            r.touch()

    def set_version(self, version: int, progress: float | None = None) -> None:
        """The trainer published param version ``version`` (the KV-cache limits follow its mean length).

        Args:
            version: The new param version.
            progress: Training progress in full sync cycles (default: ``version``); lengths drift with it.
        """
        self.version = version
        self.progress = float(version if progress is None else progress)
        self.progress_at[version] = self.progress
        self._set_limits()
        for r in self.replicas:
            for s in r.members.values():
                s.max_version = version
        for s in self.tool_waiting.values():
            s.max_version = version

    def take_window(self) -> ProductionWindow:
        """Return and restart the production accounting window."""
        w = self.peek_window()
        self.window = ProductionWindow()
        for kind, replicas in (("standalone", self.standalone), ("hybrid", self.hybrid)):
            self._window_tokens0[kind] = sum(r.tokens for r in replicas)
        return w

    def peek_window(self) -> ProductionWindow:
        """The production accounting window so far (a copy; the window goes on)."""
        w = ProductionWindow(dict(self.window.serving_s), {}, self.window.delivered, self.window.delivered_tokens)
        for kind, replicas in (("standalone", self.standalone), ("hybrid", self.hybrid)):
            for r in replicas:
                r.advance(self.now)
            w.tokens[kind] = sum(r.tokens for r in replicas) - self._window_tokens0[kind]
        return w

    # ------------------------------------------------------------------------------------------ replicas

    def set_state(self, replicas: list[SimReplica], state: str, *, serving: bool, routable: bool | None = None) -> None:
        """Change replicas' state (trace span boundaries), serving flag and (optionally) routability."""
        cap_before = self.cap()
        for r in replicas:
            r.advance(self.now)
            if r.state != state:
                self._span(r)
                r.state = state
            r.serving = serving
            r.touch()
            if routable is not None:
                r.routable = routable
        self._cap_cache = -1
        if self.cap() != cap_before:
            self._record()
        if routable:
            self._route_parked()
        self._progress()

    def abort(self, replicas: list[SimReplica], penalty: bool = True, account: str | None = None) -> int:
        """Abort the in-flight samples of ``replicas`` and re-route them (partial rollout). Returns how many.

        The re-prefill penalty is counted in ``device_account[account]`` (default ``"<kind>_reprefill"``).
        """
        moved: list[SimSample] = []
        for r in replicas:
            r.advance(self.now)
            for s in list(r.members.values()):
                remaining = max(0.0, s.target - r.progress)
                decoded = max(float(s.done_before), s.decoded(remaining))  # the prefix to re-prefill
                if penalty:
                    extra = decoded * self.scenario.switch.resume_prefill_ratio
                    remaining += extra
                    key = account or r.kind + "_reprefill"
                    self.device_account[key] = (
                        self.device_account.get(key, 0.0) + extra / self.standalone_peak_per_device
                    )
                s.remaining = remaining
                s.aborts += 1
                s.replica = None
                moved.append(s)
            r.members.clear()
            r.heap.clear()
            r.touch()
        moved.sort(key=lambda s: s.sid)
        for s in moved:
            if not self._route(s):
                self.parked.append(s)
        self.cumulative_aborts += len(moved)
        self._record()
        self._progress()
        return len(moved)

    # ------------------------------------------------------------------------------------------- tracing

    def _span(self, r: SimReplica) -> None:
        if self.trace is not None and self.now > r.state_since:
            self.trace.span(self.track(r), r.state, r.state_since, self.now)
        r.state_since = self.now

    def _counter(self, name: str, value: float) -> None:
        """Write a counter sample, coalesced to at most one per ``counter_interval_s`` of virtual time."""
        if self.trace is None:
            return
        last = self._counter_last.get(name)
        if last is not None and last[1] == value:
            self._counter_pending.pop(name, None)
            return
        if last is not None and self.now - last[0] < self.counter_interval_s:
            self._counter_pending[name] = value
            return
        self.trace.counter(name, self.now, value)
        self._counter_last[name] = (self.now, value)
        self._counter_pending.pop(name, None)

    def close_spans(self) -> None:
        """Write the replicas' open state spans and pending counter values (at the end of a run)."""
        for r in self.replicas:
            self._span(r)
        if self.trace is not None:
            for name, value in self._counter_pending.items():
                self.trace.counter(name, self.now, value)
            self._counter_pending.clear()
