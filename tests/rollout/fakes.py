"""In-process async fakes of a rollout replica, and helpers for fast rollout tests.

:class:`FakeReplica` satisfies ``load_balancer.ReplicaLike``. Its output is a pure function of the absolute
position in the sequence: the token at absolute index ``j`` (prompt included) is ``TOKEN_BASE + j`` with logprob
``-j / 1000``. A partial-rollout continuation (prompt + prefix) therefore yields exactly the tokens an
uninterrupted run would have, and a test can check a concatenated response token by token.

:class:`FakeWeightReceiver` satisfies ``weights.receiver.WeightReceiver`` (what a weight push calls): it parses and
hashes every bucket it is given, like an engine's worker, so a push into it is verified by checksum.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.errors import ReplicaDeadError
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.weights.factory import create_receiver
from lightning_hybrid_rollout.rollout.weights.format import combine_digests, parse_safetensors, tensor_digest
from lightning_hybrid_rollout.rollout.weights.receiver import BucketPayload, Span

TOKEN_BASE = 1000


def expected_token(abs_index: int) -> int:
    """Token the fake emits at absolute sequence index ``abs_index``."""
    return TOKEN_BASE + abs_index


def expected_logprob(abs_index: int) -> float:
    """Logprob the fake reports at absolute sequence index ``abs_index``."""
    return -abs_index / 1000.0


@dataclass
class FakeCall:
    """One generate call the fake received."""

    request_id: str
    prompt_len: int
    max_tokens: int
    t: float


class _Req:
    def __init__(self) -> None:
        self.aborted = False
        self.produced = 0
        self.wake = asyncio.Event()


class FakeReplica:
    """Async fake replica with random per-token latency, aborts, holds and death.

    Args:
        replica_id: Id.
        role: ``"standalone"`` or ``"hybrid"``.
        token_latency: ``(low, high)`` seconds slept per token (uniform, seeded).
        seed: RNG seed for latencies and random aborts.
        weight_version: Version reported in results (settable at any time).
        stop_at: ``uid -> absolute sequence length`` at which the sample stops with ``"stop"`` (``None``: never).
        abort_prob: Probability per token that the engine aborts the request by itself (preemption chaos).
        hold: Do not produce tokens until :meth:`release_all` (deterministic tests).
    """

    def __init__(
        self,
        replica_id: str,
        *,
        role: str = "standalone",
        token_latency: tuple[float, float] = (0.0, 0.0),
        seed: int = 0,
        weight_version: int = 0,
        stop_at: Callable[[str], int | None] | None = None,
        abort_prob: float = 0.0,
        hold: bool = False,
    ) -> None:
        self.replica_id = replica_id
        self.role = role
        self.is_alive = True
        self.token_latency = token_latency
        self.weight_version = weight_version
        self.stop_at = stop_at
        self.abort_prob = abort_prob
        self.hold = hold
        self.calls: list[FakeCall] = []
        self.abort_requests: list[str] = []
        self.forbidden = False
        self.violations: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.tokens_generated = 0
        self._rng = random.Random(seed)
        self._running: dict[str, _Req] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    # -------------------------------------------------------------- ReplicaLike

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        self._loop = asyncio.get_running_loop()
        if not self.is_alive:
            raise ReplicaDeadError(self.replica_id)
        if self.forbidden:
            self.violations.append(request_id)
        self.calls.append(FakeCall(request_id, len(prompt_token_ids), sampling.max_tokens, time.monotonic()))
        req = _Req()
        self._running[request_id] = req
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        version = self.weight_version
        uid = request_id.rsplit(":", 1)[0]
        stop_len = self.stop_at(uid) if self.stop_at is not None else None
        start = len(prompt_token_ids)
        tokens: list[int] = []
        logprobs: list[float] = []
        try:
            while self.hold and not req.aborted and self.is_alive:
                await req.wake.wait()
                req.wake.clear()
            for i in range(sampling.max_tokens):
                low, high = self.token_latency
                if high > 0:
                    await asyncio.sleep(self._rng.uniform(low, high))
                if not self.is_alive:
                    raise ReplicaDeadError(self.replica_id, f"died during {request_id}")
                if req.aborted or (self.abort_prob and self._rng.random() < self.abort_prob):
                    return self._result(request_id, tokens, logprobs, "abort", version)
                j = start + i
                tokens.append(expected_token(j))
                logprobs.append(expected_logprob(j))
                self.tokens_generated += 1
                req.produced += 1
                if stop_len is not None and j + 1 >= stop_len:
                    return self._result(request_id, tokens, logprobs, "stop", version)
            if req.aborted and not tokens:
                return self._result(request_id, tokens, logprobs, "abort", version)
            return self._result(request_id, tokens, logprobs, "length", version)
        finally:
            self.in_flight -= 1
            del self._running[request_id]

    async def abort(self, request_ids: list[str]) -> None:
        if not self.is_alive:
            raise ReplicaDeadError(self.replica_id)
        self.abort_requests.extend(request_ids)
        for rid in request_ids:
            req = self._running.get(rid)
            if req is not None:
                req.aborted = True
                req.wake.set()

    # -------------------------------------------------------------- test controls (any thread)

    def has_partial_request(self) -> bool:
        """Whether a running request has produced at least one token."""
        return any(req.produced > 0 for req in tuple(self._running.values()))

    def kill(self) -> None:
        """Make the replica dead: running and future requests raise :class:`ReplicaDeadError`."""
        self.is_alive = False
        self._wake_all()

    def release_all(self) -> None:
        """Stop holding: held requests start producing tokens."""
        self.hold = False
        self._wake_all()

    def _wake_all(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def wake() -> None:
            for req in list(self._running.values()):
                req.wake.set()

        try:
            if asyncio.get_running_loop() is loop:
                wake()
                return
        except RuntimeError:
            pass
        loop.call_soon_threadsafe(wake)

    def _result(
        self, request_id: str, tokens: list[int], logprobs: list[float], reason: str, version: int
    ) -> GenerationResult:
        return GenerationResult(
            request_id=request_id,
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason=reason,  # type: ignore[arg-type]
            weight_version=version,
            replica_id=self.replica_id,
        )


class FakeWeightReceiver:
    """A pure-Python replica speaking the weight-update protocol (``weights.receiver.WeightReceiver``).

    It maps the trainer's node staging file, parses every bucket it loads (node staging file, Ray-path buckets, or
    its own staged copies) and hashes the tensors as the engine's worker does, so :meth:`finish_weight_update`
    returns the checksum of what it really read.

    Args:
        replica_id: Id.
        can_attach: Whether :meth:`attach_node_staging` succeeds (False: as if on another node).
        events: A list shared with the test: every call appends ``"<replica_id>:<method>"`` (order across replicas).
    """

    def __init__(self, replica_id: str, can_attach: bool = True, events: list[str] | None = None) -> None:
        self.replica_id = replica_id
        self.info: dict[str, Any] = {}
        self.can_attach = can_attach
        self.events = events
        self.calls: list[str] = []
        self.loaded_spans: list[Span] = []
        self.weight_version = 0
        self._mm: mmap.mmap | None = None
        self._staged: dict[int, bytes] = {}
        self._digests: dict[str, str] = {}
        self._version: int | None = None
        self.receivers: dict[str, Any] = {}  # transport -> its real engine-side receiver

    def _record(self, method: str) -> None:
        self.calls.append(method)
        if self.events is not None:
            self.events.append(f"{self.replica_id}:{method}")

    def _load(self, buf: Any, offset: int, nbytes: int) -> dict[str, Any]:
        if self._version is None:
            raise RuntimeError(f"{self.replica_id}: load outside begin/finish")
        items, size = parse_safetensors(buf, offset)
        assert size == nbytes, (size, nbytes)
        self._digests.update({n: tensor_digest(n, t) for n, t in items})
        return {"tensors": len(items), "bytes": nbytes}

    @staticmethod
    def _blob(bucket: BucketPayload) -> bytes:
        return bucket.to_bytes() if hasattr(bucket, "to_bytes") else bytes(memoryview(bucket).cast("B"))

    async def attach_node_staging(self, path: str, size: int, inode: int) -> bool:
        self._record("attach_node_staging")
        if not self.can_attach or os.stat(path).st_ino != inode:
            return False
        fd = os.open(path, os.O_RDONLY)
        try:
            self._mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return True

    async def begin_weight_update(self, version: int, total_bytes: int = 0, keep: bool = False) -> None:
        self._record("begin_weight_update")
        self._digests, self._version = {}, version

    async def load_weight_from_node_staging(self, spans: list[Span]) -> dict[str, Any]:
        self._record("load_weight_from_node_staging")
        assert self._mm is not None, "no node staging file attached"
        for offset, nbytes in spans:
            self._load(self._mm, offset, nbytes)
            self.loaded_spans.append((offset, nbytes))
        return {"buckets": len(spans)}

    async def load_weight_bucket(self, bucket: BucketPayload) -> dict[str, Any]:
        self._record("load_weight_bucket")
        blob = self._blob(bucket)
        return self._load(blob, 0, len(blob))

    async def stage_weight_bucket(self, bucket: BucketPayload, offset: int, total_bytes: int) -> float:
        self._record("stage_weight_bucket")
        assert self._version is None, "cannot stage weights during a weight update"
        self._staged[offset] = self._blob(bucket)
        return 0.0

    async def load_weight_from_staging(self, spans: list[Span]) -> dict[str, Any]:
        self._record("load_weight_from_staging")
        for offset, nbytes in spans:
            self._load(self._staged.pop(offset), 0, nbytes)
        return {"buckets": len(spans)}

    async def receive_weights(self, transport: str, request: Any) -> dict[str, Any]:
        self._record(f"receive_weights:{transport}")
        if transport not in self.receivers:
            self.receivers[transport] = create_receiver(transport)
        items = await asyncio.to_thread(self.receivers[transport].receive, request)  # a join or a receive blocks
        if items and self._version is None:
            raise RuntimeError(f"{self.replica_id}: load outside begin/finish")
        self._digests.update({n: tensor_digest(n, t) for n, t in items})
        return {"tensors": len(items)}

    async def abort_weight_update(self) -> None:
        self._record("abort_weight_update")
        self._digests, self._version = {}, None

    async def finish_weight_update(self) -> str:
        self._record("finish_weight_update")
        if self._version is None:
            raise RuntimeError(f"{self.replica_id}: finish_weight_update without begin")
        self.weight_version, self._version = self._version, None
        return combine_digests(self._digests)


class ManualClock:
    """A clock the test sets by hand (thread-safe reads)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def char_tokenize(text: str) -> list[int]:
    """Tokenizer for tests: one token (< TOKEN_BASE) per character."""
    return [ord(c) % 997 for c in text]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.002) -> None:
    """Poll ``predicate`` until true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        time.sleep(interval)
