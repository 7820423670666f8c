"""The trainer process's one event loop (``rollout/event_loop.py``): the rollouter produces on the runtime's loop."""

from __future__ import annotations

import asyncio
import textwrap
import threading

import pytest

from lightning_hybrid_rollout.rollout import event_loop
from lightning_hybrid_rollout.rollout.event_loop import EventLoopThread
from tests.rollout.fakes import FakeReplica
from tests.rollout.test_rollouter import make


def test_the_module_example_runs() -> None:
    exec(textwrap.dedent(event_loop.__doc__.split("Example::")[1]), {"EventLoopThread": EventLoopThread})


def test_a_blocking_call_from_the_loops_own_thread_raises_instead_of_deadlocking() -> None:
    loop = EventLoopThread("t")
    try:

        async def inner() -> None:
            loop.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="would deadlock"):
            loop.run(inner(), timeout=5)
        with pytest.raises(TimeoutError, match="did not finish within"):
            loop.run(asyncio.sleep(10), timeout=0.05)
    finally:
        loop.close()
    assert not loop.is_alive


def test_a_rollouter_given_the_runtimes_loop_produces_on_it_and_leaves_it_running_at_stop() -> None:
    shared = EventLoopThread("lhr-runtime")
    before = {t.name for t in threading.enumerate()}
    try:
        ro, queue = make([FakeReplica("r0", token_latency=(0.0005, 0.001), seed=1)], n_prompts=8)
        ro.start(loop_thread=shared)
        assert ro.loop_thread is shared and ro.loop is shared.loop
        assert {t.name for t in threading.enumerate()} == before  # no thread of its own
        samples = queue.get_batch(8, timeout=20)
        assert len(samples) == 8
        ro.stop()
        assert shared.is_alive and shared.run(asyncio.sleep(0, result="still serving")) == "still serving"
    finally:
        shared.close()


def test_a_rollouter_without_a_loop_owns_one_and_closes_it_at_stop() -> None:
    ro, queue = make([FakeReplica("r0", token_latency=(0.0005, 0.001), seed=1)], n_prompts=4)
    ro.start()
    own = ro.loop_thread
    assert own is not None and own.is_alive
    assert len(queue.get_batch(4, timeout=20)) == 4
    ro.stop()
    assert not own.is_alive
