"""MessageQueue: bound without silent drops, wait_until/get_batch, thread safety, checkpoint round trip."""

from __future__ import annotations

import threading
import time

import pytest

from lightning_hybrid_rollout.rollout.message_queue import MessageQueue, MessageQueueClosed
from lightning_hybrid_rollout.rollout.sample import Sample


def s(i: int) -> Sample:
    return Sample(uid=f"u{i}", group_id=f"g{i}", prompt="p", prompt_token_ids=[1], response_token_ids=[i],
                  response_logprobs=[-0.5], reward=float(i))  # fmt: skip


def test_bound_refuses_instead_of_dropping():
    q = MessageQueue(maxsize=3)
    assert q.put_many([s(0), s(1)])
    assert not q.put_many([s(2), s(3)], block=False)  # all or nothing
    assert q.size() == 2 and q.rejected == 2 and q.dropped == 0
    assert q.put(s(2), block=False)
    assert not q.put(s(3), timeout=0.01)
    assert q.size() == 3
    with pytest.raises(ValueError, match="raise max_required_samples"):
        q.put_many([s(i) for i in range(4)])


def test_get_batch_fifo_stats_and_timeout():
    clock = [0.0]
    q = MessageQueue(maxsize=8, clock=lambda: clock[0])
    q.put_many([s(0), s(1)])
    clock[0] = 2.0
    q.put(s(2))
    clock[0] = 5.0
    batch = q.get_batch(3, timeout=1)
    assert [x.uid for x in batch] == ["u0", "u1", "u2"]
    st = q.last_get_stats
    assert st.size_at_start == 3 and st.wait_samples == 0
    assert st.max_age_s == 5.0 and st.mean_age_s == pytest.approx(13 / 3)
    with pytest.raises(TimeoutError, match="holds 0 of the 2"):
        q.get_batch(2, timeout=0.01)
    with pytest.raises(ValueError, match=r"\[1, maxsize\]"):
        q.get_batch(9)


def test_wait_until_and_blocking_get_across_threads():
    q = MessageQueue(maxsize=4)
    assert not q.wait_until(2, timeout=0.01)

    def producer():
        for i in range(2):
            time.sleep(0.02)
            q.put(s(i))

    t = threading.Thread(target=producer)
    t.start()
    assert q.wait_until(2, timeout=5)
    t.join()
    assert q.size() == 2
    got = q.get_batch(2, timeout=1)
    assert q.last_get_stats.wait_samples == 0 and len(got) == 2


def test_a_put_wakes_a_waiting_consumer_only_once_its_batch_is_there():
    q = MessageQueue(maxsize=16)
    wakeups = []
    notify_all = q._cond.notify_all
    q._cond.notify_all = lambda: (wakeups.append(len(q._items)), notify_all())  # type: ignore[method-assign]
    got: list[list[Sample]] = []
    consumer = threading.Thread(target=lambda: got.append(q.get_batch(6, timeout=10)))
    consumer.start()
    deadline = time.monotonic() + 5
    while not q._needs and time.monotonic() < deadline:  # blocked, waiting for 6
        time.sleep(0.001)
    for i in range(6):  # one sample at a time, as a rollouter with groups of one puts them
        q.put(s(i))
    consumer.join(5)
    assert [len(b) for b in got] == [6]
    # puts 1-5 woke nobody, put 6 woke the consumer; its get_batch notified once (room for blocked producers)
    assert wakeups == [6, 0], wakeups


def test_blocking_put_waits_for_consumer():
    q = MessageQueue(maxsize=2)
    q.put_many([s(0), s(1)])
    done = threading.Event()

    def producer():
        assert q.put(s(2), timeout=5)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.02)
    assert not done.is_set()
    q.get_batch(1)
    t.join(5)
    assert done.is_set() and [x.uid for x in q.get_batch(2)] == ["u1", "u2"]


def test_threadsafe_many_producers_one_consumer_exactly_once():
    q = MessageQueue(maxsize=16)
    n_prod, per = 4, 250
    seen: list[str] = []

    def producer(p: int):
        for i in range(per):
            assert q.put(s(p * per + i), timeout=10)

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(n_prod)]
    for t in threads:
        t.start()
    while len(seen) < n_prod * per:
        seen.extend(x.uid for x in q.get_batch(4, timeout=10))
    for t in threads:
        t.join()
    assert len(seen) == len(set(seen)) == n_prod * per
    assert q.total_put == q.total_got == n_prod * per and q.rejected == 0


def test_close_wakes_consumer_with_cause_and_counts_refused_puts():
    q = MessageQueue(maxsize=4)
    q.put(s(0))
    err: list[BaseException] = []

    def consumer():
        try:
            q.get_batch(3)
        except MessageQueueClosed as e:
            err.append(e)

    t = threading.Thread(target=consumer)
    t.start()
    time.sleep(0.02)
    q.close("rollouter failed", error=ValueError("boom"))
    t.join(5)
    assert err and "rollouter failed" in str(err[0]) and isinstance(err[0].__cause__, ValueError)
    assert not q.put(s(1)) and q.dropped == 1
    assert q.get_batch(1)[0].uid == "u0"  # buffered samples stay readable


def test_listener_called_after_get():
    q = MessageQueue(maxsize=2)
    calls = []
    q.add_listener(lambda: calls.append(q.size()))
    q.put(s(0))
    q.get_batch(1)
    assert calls == [0]


def test_state_dict_round_trip_keeps_every_sample_even_beyond_bound():
    q = MessageQueue(maxsize=4)
    q.put_many([s(i) for i in range(4)])
    q.get_batch(1)
    state = q.state_dict()
    q2 = MessageQueue(maxsize=2)
    q2.load_state_dict(state)
    assert q2.size() == 3
    got = q2.get_batch(2) + q2.get_batch(1)
    assert [x.uid for x in got] == ["u1", "u2", "u3"]
    assert got[0] == s(1)
    assert q2.total_got == 1 + 3
