"""The bounded, thread-safe sample queue between the rollouter (producer) and the trainer (consumer).

Bounded by ``max_required_samples`` (design/notes.md §3); whole prompt groups go in with one put, and a put that does
not fit returns ``False`` so no sample is dropped silently. :meth:`MessageQueue.get_batch` records :class:`GetStats`
(time blocked, samples waited for), the source of the policy context's ``step_wait_times`` / ``step_wait_samples``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.errors import MessageQueueClosed as MessageQueueClosed  # re-exported
from lightning_hybrid_rollout.rollout.sample import Sample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GetStats:
    """What one :meth:`MessageQueue.get_batch` call saw.

    Args:
        requested: Samples asked for.
        size_at_start: Queue size when the call began.
        wait_samples: ``max(0, requested - size_at_start)``: samples that had to be generated while waiting
            (samples served from backlog are not counted; design/notes.md §3).
        wait_s: Seconds the call blocked.
        mean_age_s: Mean time the returned samples spent in the queue (clock of the queue).
        max_age_s: Longest time one of them spent in the queue.
    """

    requested: int
    size_at_start: int
    wait_samples: int
    wait_s: float
    mean_age_s: float
    max_age_s: float


class MessageQueue:
    """Bounded FIFO of :class:`~lightning_hybrid_rollout.rollout.sample.Sample`, safe across threads.

    Args:
        maxsize: Capacity in samples (``max_required_samples``).
        clock: Time source for sample ages (default ``time.monotonic``); blocking timeouts always use real time.

    Example::

        queue = MessageQueue(maxsize=64)
        queue.put(sample)                     # from the rollouter
        batch = queue.get_batch(32, timeout=600)  # from the trainer
    """

    def __init__(self, maxsize: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize (max_required_samples) must be >= 1, got {maxsize}")
        self._maxsize = maxsize
        self._clock = clock
        self._items: deque[tuple[float, Sample]] = deque()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._close_reason: str = ""
        self._close_error: BaseException | None = None
        self._listeners: list[Callable[[], None]] = []
        #: what each blocked consumer waits for (a sample count): a put wakes them only once the smallest is reached
        self._needs: list[int] = []
        self.total_put = 0
        self.total_got = 0
        self.rejected = 0
        self.dropped = 0
        self.last_get_stats: GetStats | None = None

    # ------------------------------------------------------------------ producer side

    @property
    def maxsize(self) -> int:
        """Capacity in samples."""
        return self._maxsize

    def put(self, sample: Sample, block: bool = True, timeout: float | None = None) -> bool:
        """Append one sample; see :meth:`put_many`."""
        return self.put_many([sample], block=block, timeout=timeout)

    def put_many(self, samples: Iterable[Sample], block: bool = True, timeout: float | None = None) -> bool:
        """Append samples atomically (all or none), waiting for room if ``block``.

        Args:
            samples: Samples to append (a whole prompt group, typically).
            block: Wait for room; ``False`` returns immediately when they do not fit.
            timeout: Seconds to wait for room (``None``: forever).

        Returns:
            ``True`` if appended; ``False`` if they did not fit in time (counted in ``rejected``) or the queue is
            closed (counted in ``dropped``). The caller still owns the samples in that case.

        Raises:
            ValueError: More samples than the queue can ever hold.
        """
        batch = list(samples)
        if len(batch) > self._maxsize:
            raise ValueError(
                f"cannot put {len(batch)} samples at once into a queue of maxsize {self._maxsize}; "
                "raise max_required_samples to at least the group size"
            )
        with self._cond:
            fits = lambda: self._closed or len(self._items) + len(batch) <= self._maxsize  # noqa: E731
            if not fits() and block:
                self._cond.wait_for(fits, timeout)
            if self._closed:
                self.dropped += len(batch)
                log.warning("message queue closed (%s): %d samples not accepted", self._close_reason, len(batch))
                return False
            if len(self._items) + len(batch) > self._maxsize:
                self.rejected += len(batch)
                return False
            now = self._clock()
            self._items.extend((now, s) for s in batch)
            self.total_put += len(batch)
            if self._needs and len(self._items) >= min(self._needs):  # a put only ever wakes a waiting consumer
                self._cond.notify_all()
        return True

    def close(self, reason: str = "closed", error: BaseException | None = None) -> None:
        """Close the queue: waiting consumers wake and raise :class:`MessageQueueClosed`; puts are refused.

        Buffered samples stay readable through :meth:`state_dict` (and :meth:`get_batch` while enough remain).

        Args:
            reason: Why (shown in errors).
            error: The producer's failure, chained into the consumers' error.
        """
        with self._cond:
            self._closed = True
            self._close_reason = reason
            self._close_error = error
            self._cond.notify_all()
        self._notify_listeners()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from the consumer's thread) after samples are taken out or the queue closes.

        Args:
            callback: Cheap and thread-safe (the rollouter passes ``loop.call_soon_threadsafe``-based wake-ups).
        """
        self._listeners.append(callback)

    # ------------------------------------------------------------------ consumer side

    def size(self) -> int:
        """Snapshot of the number of buffered samples (verl's ``get_queue_size_sync()``)."""
        with self._lock:
            return len(self._items)

    def __len__(self) -> int:
        return self.size()

    def _wait_for_items(self, n: int, timeout: float | None) -> bool:
        """Under the lock: block until ``n`` samples are buffered or the queue closes (``False`` on timeout).

        The need is registered so that a put wakes this consumer only once it can be served, not per group."""
        if len(self._items) >= n or self._closed:
            return True
        self._needs.append(n)
        try:
            return self._cond.wait_for(lambda: len(self._items) >= n or self._closed, timeout)
        finally:
            self._needs.remove(n)

    def wait_until(self, n: int, timeout: float | None = None) -> bool:
        """Block until the queue holds at least ``n`` samples.

        Args:
            n: Sample count to wait for (``<= maxsize``).
            timeout: Seconds (``None``: forever).

        Returns:
            ``True`` if reached, ``False`` on timeout.

        Raises:
            MessageQueueClosed: The queue was closed with fewer than ``n`` samples.
        """
        self._check_n(n)
        with self._cond:
            ok = self._wait_for_items(n, timeout)
            if len(self._items) >= n:
                return True
            if self._closed:
                self._raise_closed(n)
            return bool(ok) and len(self._items) >= n

    def get_batch(self, n: int, timeout: float | None = None) -> list[Sample]:
        """Take the ``n`` oldest samples, blocking until that many are buffered. Records :attr:`last_get_stats`.

        Args:
            n: Batch size (``1 <= n <= maxsize``).
            timeout: Seconds to wait (``None``: forever).

        Returns:
            ``n`` samples in FIFO order.

        Raises:
            TimeoutError: Fewer than ``n`` samples after ``timeout`` (nothing is taken).
            MessageQueueClosed: The queue was closed with fewer than ``n`` samples.
        """
        self._check_n(n)
        start = time.monotonic()
        with self._cond:
            size_at_start = len(self._items)
            self._wait_for_items(n, timeout)
            if len(self._items) < n:
                if self._closed:
                    self._raise_closed(n)
                raise TimeoutError(
                    f"message queue holds {len(self._items)} of the {n} samples requested after {timeout}s; "
                    "the rollouter is slower than expected or stalled (check its error/counters) "
                    "or raise the timeout"
                )
            now = self._clock()
            taken = [self._items.popleft() for _ in range(n)]
            self.total_got += n
            self._cond.notify_all()
        ages = [now - t for t, _ in taken]
        self.last_get_stats = GetStats(
            requested=n,
            size_at_start=size_at_start,
            wait_samples=max(0, n - size_at_start),
            wait_s=time.monotonic() - start,
            mean_age_s=sum(ages) / n,
            max_age_s=max(ages),
        )
        self._notify_listeners()
        return [s for _, s in taken]

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Buffered samples (as plain dicts) and counters; a resumed run loses no buffered sample."""
        with self._lock:
            return {
                "samples": [dataclasses.asdict(s) for _, s in self._items],
                "total_put": self.total_put,
                "total_got": self.total_got,
                "rejected": self.rejected,
                "dropped": self.dropped,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the buffer with a :meth:`state_dict`'s samples (kept even beyond ``maxsize``, with a warning).

        Args:
            state: What :meth:`state_dict` returned.
        """
        samples = [s if isinstance(s, Sample) else Sample(**s) for s in state.get("samples", [])]
        if len(samples) > self._maxsize:
            log.warning(
                "restoring %d samples into a queue of maxsize %d: keeping all of them (puts wait until it drains)",
                len(samples),
                self._maxsize,
            )
        with self._cond:
            now = self._clock()
            self._items = deque((now, s) for s in samples)
            self.total_put = int(state.get("total_put", len(samples)))
            self.total_got = int(state.get("total_got", 0))
            self.rejected = int(state.get("rejected", 0))
            self.dropped = int(state.get("dropped", 0))
            self._cond.notify_all()

    # ------------------------------------------------------------------ internals

    def _check_n(self, n: int) -> None:
        if n < 1 or n > self._maxsize:
            raise ValueError(
                f"requested {n} samples from a queue of maxsize {self._maxsize}: must be in [1, maxsize]; "
                "raise max_required_samples or lower the batch size"
            )

    def _raise_closed(self, n: int) -> None:
        raise MessageQueueClosed(
            f"message queue closed ({self._close_reason}) with {len(self._items)} of {n} samples requested"
        ) from self._close_error

    def _notify_listeners(self) -> None:
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("message queue listener failed")
