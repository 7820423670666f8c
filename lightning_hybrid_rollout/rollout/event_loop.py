"""The trainer process's one asyncio loop, running in one daemon thread.

The rollouter produces on it and the runtime's control calls (weight pushes, wake/sleep) run on it; other threads
hand it coroutines with :meth:`EventLoopThread.run`.

Example::

    import asyncio

    loop = EventLoopThread("example")
    try:
        assert loop.run(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["EventLoopThread"]

T = TypeVar("T")


class EventLoopThread:
    """An asyncio loop in a daemon thread.

    Args:
        name: The thread's name.
    """

    def __init__(self, name: str = "lhr-loop") -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), name=name, daemon=True)
        self.thread.start()
        ready.wait()

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        try:
            self.loop.run_forever()
        finally:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))

    @property
    def is_alive(self) -> bool:
        """Whether the loop is running (not closed)."""
        return self.thread.is_alive() and not self.loop.is_closed()

    def in_loop_thread(self) -> bool:
        """Whether the caller runs on the loop's own thread (where a blocking :meth:`run` would deadlock)."""
        return threading.current_thread() is self.thread

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop from another thread and return its result.

        Raises:
            RuntimeError: Called from the loop's own thread (it would wait for itself forever).
            TimeoutError: ``timeout`` seconds passed (the coroutine is cancelled).
        """
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError(
                f"{self.thread.name}: a blocking call from the event loop's own thread would deadlock; await the "
                "coroutine instead, or call from another thread"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.thread.name}: the call did not finish within {timeout}s") from None

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run the plain function ``fn`` on the loop's thread (e.g. to create tasks there) and return its result."""

        async def wrapper() -> T:
            return fn()

        return self.run(wrapper(), timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop (its remaining tasks are cancelled) and join the thread."""
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout)
        if not self.thread.is_alive():
            self.loop.close()
