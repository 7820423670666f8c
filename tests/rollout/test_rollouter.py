"""Rollouter with fake replicas: exactly-once under chaos, partial rollout, staleness, cap, history, rebalance."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib

import pytest

from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.load_balancer import NoReplicaAvailableError
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue, MessageQueueClosed
from lightning_hybrid_rollout.rollout.rollouter import Rollouter, RolloutError
from lightning_hybrid_rollout.rollout.sample import Sample
from tests.rollout.fakes import FakeReplica, ManualClock, char_tokenize, expected_logprob, expected_token, wait_for

P = 5  # prompt length: prompts are "p0000".."p9999"


def prompts(n: int) -> list[dict]:
    return [{"prompt": f"p{i:04d}", "answer": i} for i in range(n)]


def reward(sample: Sample) -> float:
    return float(sample.metadata["answer"] % 2)


def make(replicas, *, n_prompts=8, n=1, max_required=16, per_replica=4, max_tokens=8, queue_size=None, **kw):
    queue = MessageQueue(maxsize=queue_size or max_required, clock=kw.get("clock", time.monotonic))
    ro = Rollouter(
        prompts(n_prompts) if isinstance(n_prompts, int) else n_prompts,
        char_tokenize,
        reward,
        queue,
        sampling=SamplingSpec(max_tokens=max_tokens),
        replicas=replicas,
        n_samples_per_prompt=n,
        max_required_samples=max_required,
        concurrent_samples_per_replica=per_replica,
        **kw,
    )
    return ro, queue


def check_sample(sample: Sample, response_length: int, stop_at=None) -> None:
    """Tokens/logprobs are the uninterrupted sequence, within the length bound, with a consistent finish."""
    n = sample.response_length
    assert 1 <= n <= response_length
    assert sample.response_token_ids == [expected_token(P + i) for i in range(n)]
    assert sample.response_logprobs == [expected_logprob(P + i) for i in range(n)]
    stop = stop_at(sample.uid) if stop_at else None
    if stop is not None and stop - P <= response_length:
        assert (sample.finish_reason, n) == ("stop", stop - P)
    else:
        assert (sample.finish_reason, n) == ("length", response_length)
    assert sample.num_segments == len(sample.replica_ids) >= 1
    assert sample.min_weight_version <= sample.max_weight_version
    assert sample.reward == float(sample.metadata["answer"] % 2)
    assert sample.uid.startswith(sample.group_id + "-")


def test_exactly_once_under_random_aborts_remove_readd_and_a_dying_replica():
    rng = random.Random(1234)
    response_length = 16

    def stop_at(uid: str) -> int | None:
        h = zlib.crc32(uid.encode()) % 40
        return P + 4 + h if h < 20 else None  # some stop early, others run to the length bound

    fakes = [
        FakeReplica(rid, token_latency=(0.0001, 0.0008), seed=i, stop_at=stop_at, abort_prob=0.01)
        for i, rid in enumerate(["a", "b", "c"])
    ]
    _, b, c = fakes
    n_prompts, n = 160, 4
    total = n_prompts * n
    ro, queue = make(fakes, n_prompts=n_prompts, n=n, max_required=64, per_replica=8, max_tokens=response_length)
    got: list[Sample] = []
    events = {}
    version = 0
    ro.start()
    try:
        while len(got) < total:
            got.extend(queue.get_batch(16, timeout=30))
            k = len(got)
            if k >= 96 and "remove" not in events:
                ro.remove_replicas(["b"])
                b.forbidden = True
                events["remove"] = ro.abort_replicas(["b"])
            elif k >= 192 and "readd" not in events:
                b.forbidden = False
                ro.add_replicas([b])
                events["readd"] = True
            elif k >= 288 and "kill" not in events:
                c.kill()
                wait_for(lambda: ro.load_balancer.replica_state("c") == "dead")
                events["kill"] = ro.load_balancer.routed_counts()["c"]
            elif k >= 384 and "rebalance" not in events:
                events["rebalance"] = ro.rebalance_requests()
            if rng.random() < 0.3:
                ro.abort_replicas([rng.choice(["a", "b"])])
            if rng.random() < 0.3:  # a weight sync: pause with abort, bump versions, resume
                ro.pause(abort_in_flight=True)
                version += 1
                for f in fakes:
                    f.weight_version = version
                ro.update_weight_version(version)
                ro.resume()
            ro.reset_staleness()
        assert ro.wait_drained(10)
    finally:
        ro.stop()
    uids = [s.uid for s in got]
    assert len(uids) == len(set(uids)) == total
    assert set(uids) == {f"g{g}-{k}" for g in range(n_prompts) for k in range(n)}
    for sample in got:
        check_sample(sample, response_length, stop_at)
    assert not b.violations, "a removed replica received new requests"
    assert ro.load_balancer.replica_state("c") == "dead"
    counters = ro.counters()
    assert counters["aborted_segments"] > 50 and counters["retried_segments"] > 0
    assert counters["dead_replica_retries"] >= 1
    assert counters["total_generated_samples"] == counters["total_delivered_samples"] == total
    assert counters["dropped"] == 0 and queue.rejected == 0
    assert any(s.min_weight_version < s.max_weight_version for s in got)
    assert any(s.num_segments > 1 for s in got)
    assert ro.load_balancer.routed_counts()["c"] == events["kill"], "a dead replica was routed to"
    assert isinstance(events["rebalance"], int)


def test_partial_rollout_continues_from_prefix_with_reduced_max_tokens():
    response_length = 20
    fake = FakeReplica("a", token_latency=(0.001, 0.001))
    ro, queue = make([fake], n_prompts=4, per_replica=4, max_tokens=response_length)
    ro.start()
    try:
        wait_for(lambda: fake.tokens_generated >= 16)
        ro.pause(abort_in_flight=True)
        fake.weight_version = 1
        ro.resume()
        got = queue.get_batch(4, timeout=10)
    finally:
        ro.stop()
    for sample in got:
        check_sample(sample, response_length)
    assert all(s.num_segments == 2 and (s.min_weight_version, s.max_weight_version) == (0, 1) for s in got)
    by_uid: dict[str, list] = {}
    for call in fake.calls:
        by_uid.setdefault(call.request_id.rsplit(":", 1)[0], []).append(call)
    for calls in by_uid.values():
        first, second = calls
        assert (first.prompt_len, first.max_tokens) == (P, response_length)
        prefix = second.prompt_len - P
        assert prefix > 0 and second.max_tokens == response_length - prefix


def test_without_partial_rollout_an_aborted_sample_restarts_from_scratch():
    response_length = 12
    fake = FakeReplica("a", token_latency=(0.001, 0.001))
    ro, queue = make([fake], n_prompts=3, max_tokens=response_length, partial_rollout=False)
    ro.start()
    try:
        wait_for(lambda: fake.tokens_generated >= 6)
        assert ro.pause(abort_in_flight=True) == 3
        fake.weight_version = 1
        ro.resume()
        got = queue.get_batch(3, timeout=10)
    finally:
        ro.stop()
    for sample in got:
        check_sample(sample, response_length)
        assert sample.num_segments == 1 and sample.min_weight_version == 1
    assert all((c.prompt_len, c.max_tokens) == (P, response_length) for c in fake.calls)
    assert len(fake.calls) == 6


class OvershootReplica(FakeReplica):
    """Returns more tokens than asked, and aborts its first segment late."""

    async def generate(self, request_id, prompt_token_ids, sampling):
        result = await super().generate(request_id, prompt_token_ids, sampling)
        extra = [expected_token(len(prompt_token_ids) + len(result.token_ids) + i) for i in range(5)]
        reason = "abort" if request_id.endswith(":0") else result.finish_reason
        return GenerationResult(request_id, result.token_ids + extra, result.logprobs + [0.0] * 5, reason,
                                result.weight_version, self.replica_id)  # fmt: skip


def test_response_length_is_never_exceeded_even_by_a_misbehaving_engine():
    ro, queue = make([OvershootReplica("a")], n_prompts=4, max_tokens=10)
    with ro:
        got = queue.get_batch(4, timeout=10)
    for sample in got:
        assert sample.response_length == 10 and sample.finish_reason == "length"
        assert sample.response_token_ids == [expected_token(P + i) for i in range(10)]


def test_staleness_never_admits_more_than_max_required_per_param_version():
    max_required, n, per_version = 12, 3, 9
    fakes = [FakeReplica(r, token_latency=(0.0, 0.0005), seed=i) for i, r in enumerate("ab")]
    ro, queue = make(fakes, n_prompts=10_000, n=n, max_required=max_required, per_replica=8)
    windows = []
    ro.start()
    try:
        time.sleep(0.05)  # let it run into the budget
        carried = 0
        for _ in range(8):
            assert queue.get_batch(per_version, timeout=10)
            time.sleep(0.01)
            stats = ro.reset_staleness()
            windows.append((carried, stats.admitted_samples))
            carried = stats.staleness_samples
    finally:
        ro.stop()
    for carried_in, admitted in windows:
        assert admitted + carried_in <= max_required
    assert sum(1 for c, a in windows if a + c > max_required - n) >= 6, windows  # it did run up to the budget
    assert ro.total_admitted_samples <= max_required * (len(windows) + 1)


def test_in_flight_cap_follows_active_servers_and_max_required():
    a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
    ro, _ = make([a], n_prompts=100, max_required=10, per_replica=3)
    ro.start()
    try:
        wait_for(lambda: a.in_flight == 3)
        time.sleep(0.02)
        assert (ro.in_flight, ro.max_concurrent_samples) == (3, 3)
        ro.add_replicas([b])
        wait_for(lambda: a.in_flight + b.in_flight == 6)
        assert b.in_flight == 3  # least-loaded sends the new ones to the empty replica
        ro.add_replicas([FakeReplica("c", hold=True), FakeReplica("d", hold=True)])
        wait_for(lambda: ro.in_flight == 10)
        time.sleep(0.02)
        assert ro.in_flight == ro.max_concurrent_samples == 10  # min(4 * 3, max_required)
    finally:
        ro.stop()


def test_history_with_injected_clock():
    clock = ManualClock(0.0)
    a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
    ro, queue = make([a], n_prompts=4, max_required=10, per_replica=2, clock=clock)
    ro.start()
    try:
        wait_for(lambda: a.in_flight == 2)
        clock.t = 1.0
        ro.add_replicas([b])
        wait_for(lambda: b.in_flight == 2)
        clock.t = 2.0
        ro.remove_replicas(["b"])
        clock.t = 3.0
        a.release_all()
        b.release_all()
        assert queue.wait_until(4, timeout=5)
        clock.t = 5.0
        stats = ro.reset_staleness()
        clock.t = 6.0
        nxt = ro.reset_staleness()
    finally:
        ro.stop()
    assert stats.history == [
        (0.0, 0, 2), (0.0, 1, 2), (0.0, 2, 2),
        (1.0, 2, 4), (1.0, 3, 4), (1.0, 4, 4),
        (2.0, 4, 2),
        (3.0, 3, 2), (3.0, 2, 2), (3.0, 1, 2), (3.0, 0, 2),
        (5.0, 0, 2),
    ]  # fmt: skip
    assert stats.step_generated_samples == 4 and stats.admitted_samples == 4
    assert nxt.history == [(5.0, 0, 2), (6.0, 0, 2)] and nxt.step_generated_samples == 0
    assert all(len(p) == 3 for p in stats.history)


def test_history_pause_parks_samples():
    clock = ManualClock(0.0)
    a = FakeReplica("a", hold=True)
    ro, queue = make([a], n_prompts=1, per_replica=2, clock=clock)
    ro.start()
    try:
        wait_for(lambda: a.in_flight == 1)
        clock.t = 1.0
        assert ro.pause(abort_in_flight=True) == 1
        clock.t = 2.0
        a.release_all()
        ro.resume()
        assert queue.wait_until(1, timeout=5)
        stats = ro.reset_staleness()
    finally:
        ro.stop()
    assert stats.history[:3] == [(0.0, 0, 2), (0.0, 1, 2), (1.0, 0, 2)]
    assert stats.history[3:] == [(2.0, 1, 2), (2.0, 0, 2), (2.0, 0, 2)]


def test_rebalance_moves_in_flight_requests_to_the_new_replica():
    a, b = FakeReplica("a", hold=True), FakeReplica("b", hold=True)
    ro, queue = make([a], n_prompts=4, max_required=8, per_replica=4)
    ro.start()
    try:
        wait_for(lambda: a.in_flight == 4)
        ro.add_replicas([b])
        time.sleep(0.02)
        assert b.in_flight == 0  # nothing new to send
        assert ro.rebalance_requests() == 4
        wait_for(lambda: a.in_flight + b.in_flight == 4)
        assert (a.in_flight, b.in_flight) == (2, 2)
        assert ro.load_balancer.sticky_cache_size == 4
        a.release_all()
        b.release_all()
        got = queue.get_batch(4, timeout=5)
    finally:
        ro.stop()
    assert sorted(s.uid for s in got) == [f"g{i}-0" for i in range(4)]
    assert sorted(s.replica_ids[-1] for s in got) == ["a", "a", "b", "b"]


class _SlowAbortReplica(FakeReplica):
    """Its aborted requests come back 1 s after the abort call returns (an engine busy finishing a step)."""

    async def abort(self, request_ids: list[str]) -> None:
        loop = asyncio.get_running_loop()
        for rid in request_ids:
            req = self._running.get(rid)
            if req is not None:
                loop.call_later(1.0, lambda r=req: (setattr(r, "aborted", True), r.wake.set()))


def test_a_rebalance_returns_once_its_aborts_are_sent_not_once_the_requests_come_back():
    """The trainer waits for a rebalance (the seed's activate -> rebalance): only for the abort calls; the aborted
    requests come back and move to the least-loaded replica on the rollouter's own time."""
    a, b = _SlowAbortReplica("a", hold=True), FakeReplica("b", hold=True)
    ro, queue = make([a], n_prompts=4, max_required=8, per_replica=4)
    ro.start()
    try:
        wait_for(lambda: a.in_flight == 4)
        ro.add_replicas([b])
        assert ro.rebalance_requests() == 4
        assert a.in_flight == 4  # returned before the aborted requests came back
        wait_for(lambda: b.in_flight == 2 and a.in_flight == 2)
        a.release_all()
        b.release_all()
        got = queue.get_batch(4, timeout=5)
    finally:
        ro.stop()
    assert sorted(s.uid for s in got) == [f"g{i}-0" for i in range(4)]


def test_deactivate_order_remove_then_abort_moves_work_to_standalone():
    standalone = FakeReplica("s", token_latency=(0.001, 0.002))
    hybrid = FakeReplica("h", role="hybrid", hold=True)
    ro, queue = make([standalone, hybrid], n_prompts=12, n=2, max_required=24, per_replica=6, max_tokens=6)
    ro.start()
    try:
        wait_for(lambda: hybrid.in_flight == 6)
        ro.remove_replicas(["h"])
        hybrid.forbidden = True
        assert ro.abort_replicas(["h"]) == 6
        assert hybrid.in_flight == 0
        got = queue.get_batch(24, timeout=10)
    finally:
        ro.stop()
    assert not hybrid.violations
    assert len({s.uid for s in got}) == 24
    assert all(s.replica_ids == ["s"] for s in got)  # the aborted ones had no tokens yet: only standalone segments


def test_groups_are_delivered_whole_and_contiguous():
    fakes = [FakeReplica(r, token_latency=(0.0, 0.002), seed=i) for i, r in enumerate("ab")]
    ro, queue = make(fakes, n_prompts=12, n=4, max_required=48, per_replica=5)
    with ro:
        got = queue.get_batch(48, timeout=10)
    groups = [got[i : i + 4] for i in range(0, 48, 4)]
    for g in groups:
        assert len({s.group_id for s in g}) == 1 and [s.uid[-1] for s in g] == list("0123")


def test_state_dict_round_trip_loses_and_duplicates_nothing():
    fake = FakeReplica("a", token_latency=(0.001, 0.003), seed=3)
    ro, queue = make([fake], n_prompts=prompts(40), n=2, max_required=16, per_replica=6, max_tokens=12)
    ro.start()
    first = queue.get_batch(6, timeout=10)
    wait_for(fake.has_partial_request)
    ro.stop()
    state = ro.state_dict()
    assert state["pending_groups"] and any(s["tokens"] for g in state["pending_groups"] for s in g["samples"])
    admitted = ro.total_admitted_samples

    fake2 = FakeReplica("a2", token_latency=(0.0, 0.001))
    remaining_prompts = prompts(40)[admitted // 2 :]
    ro2, queue2 = make([fake2], n_prompts=remaining_prompts, n=2, max_required=16, per_replica=6, max_tokens=12)
    ro2.load_state_dict(state)
    assert ro2.staleness_samples == ro2.outstanding_samples + queue2.size()
    got = list(first)
    with ro2:
        while len(got) < 80:
            got.extend(queue2.get_batch(2, timeout=10))
            ro2.reset_staleness()
    uids = [s.uid for s in got]
    assert len(uids) == len(set(uids)) == 80
    for s in got:
        check_sample(s, 12)


def test_a_normal_stop_says_once_what_it_kept_instead_of_warning_for_each_group(caplog):
    """The end of a fit leaves finished groups waiting for queue room and others in flight: one INFO line counts
    them (they stay in the state_dict), not a WARNING per group."""
    fake = FakeReplica("a", token_latency=(0.0, 0.001))
    ro, _queue = make([fake], n_prompts=40, n=2, max_required=16, per_replica=8, queue_size=2)
    caplog.set_level(logging.INFO, logger="lightning_hybrid_rollout.rollout.rollouter")
    ro.start()
    wait_for(lambda: ro.counters()["total_generated_samples"] >= 8)  # the queue holds 2: 3 groups wait for room
    ro.stop()
    pending = ro.state_dict()["pending_groups"]
    samples = [s for g in pending for s in g["samples"]]
    finished = sum(1 for s in samples if s.get("result"))
    assert finished >= 6
    records = [r for r in caplog.records if "not delivered" in r.getMessage() or "stopped with" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (
            logging.INFO,
            f"rollouter: stopped with {finished} finished samples not yet in the queue and "
            f"{len(samples) - finished} unfinished ones ({len(pending)} groups), kept in its state_dict (a fit "
            "resumed from a checkpoint that holds them continues them)",
        )
    ]


def test_a_failing_reward_fn_stops_the_rollouter_and_wakes_the_trainer():
    def bad_reward(sample):
        raise ValueError("reward exploded")

    queue = MessageQueue(maxsize=4)
    ro = Rollouter(prompts(4), char_tokenize, bad_reward, queue, sampling=SamplingSpec(max_tokens=4),
                   replicas=[FakeReplica("a")])  # fmt: skip
    with ro:
        with pytest.raises(MessageQueueClosed) as info:
            queue.get_batch(2, timeout=10)
        assert isinstance(info.value.__cause__, ValueError)
        assert isinstance(ro.error, ValueError)


def test_all_replicas_dead_for_too_long_fails_with_a_clear_error():
    a = FakeReplica("a", hold=True)
    ro, queue = make([a], n_prompts=2, no_replica_timeout_s=0.1)
    with ro:
        wait_for(lambda: a.in_flight == 2)
        a.kill()
        with pytest.raises(MessageQueueClosed, match="every replica is dead"):
            queue.get_batch(1, timeout=10)
    assert isinstance(ro.error, NoReplicaAvailableError)


def test_retries_wait_through_a_deactivation_with_no_replica_left():
    """Colocated mode: every replica is removed during training; aborted samples wait (no timeout) and resume."""
    a = FakeReplica("a", hold=True)
    ro, queue = make([a], n_prompts=2, no_replica_timeout_s=0.05)
    with ro:
        wait_for(lambda: a.in_flight == 2)
        ro.remove_replicas(["a"])
        assert ro.abort_replicas(["a"]) == 2
        time.sleep(0.2)  # longer than no_replica_timeout_s
        assert ro.error is None and queue.size() == 0 and ro.max_concurrent_samples == 0
        a.release_all()
        ro.add_replicas([a])
        got = queue.get_batch(2, timeout=5)
    assert sorted(s.uid for s in got) == ["g0-0", "g1-0"]


def test_repeated_generate_errors_fail_after_the_limit():
    class Broken(FakeReplica):
        async def generate(self, request_id, prompt_token_ids, sampling):
            raise ConnectionError("flaky")

    ro, queue = make([Broken("a")], n_prompts=1, max_segment_failures=2)
    with ro, pytest.raises(MessageQueueClosed):
        queue.get_batch(1, timeout=10)
    assert isinstance(ro.error, RolloutError) and "raise max_segment_failures" in str(ro.error)
    assert ro.counters()["failed_segments"] == 3


def test_a_refusing_engine_is_retried_with_backoff_not_a_hot_loop():
    class Parked(FakeReplica):
        async def generate(self, request_id, prompt_token_ids, sampling):
            if len(self.calls) < 3:
                self.calls.append(None)
                return GenerationResult(request_id, [], [], "abort", 0, self.replica_id, info={"rejected": "parked"})
            return await super().generate(request_id, prompt_token_ids, sampling)

    ro, queue = make([Parked("a")], n_prompts=1)
    with ro:
        (sample,) = queue.get_batch(1, timeout=10)
    check_sample(sample, 8)
    assert ro.counters()["rejected_segments"] == 3 and ro.counters()["aborted_segments"] == 0


def test_invalid_configuration_is_named():
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        make([FakeReplica("a")], n=8, max_required=4)


def test_names_that_moved_out_of_rollouter_py_are_still_importable_from_it():
    from lightning_hybrid_rollout import errors
    from lightning_hybrid_rollout.rollout import production, prompts, role_window, rollouter, utilization

    assert rollouter.RolloutError is errors.RolloutError
    assert rollouter.RoleWindow is role_window.RoleWindow
    assert rollouter.RolloutStepStats is utilization.RolloutStepStats
    assert rollouter.PromptItem is prompts.PromptItem
    assert issubclass(rollouter.Rollouter, production.ProductionLoop)


def test_an_aborted_segment_finishes_its_sample_only_at_the_length_bound_or_on_a_stop_token():
    from lightning_hybrid_rollout.rollout.partial_rollout import settle_segment
    from lightning_hybrid_rollout.rollout.sample_state import SampleState

    def settle(st, tokens, reason, partial=True, overshoot=False):
        result = GenerationResult("r", tokens, [0.0] * len(tokens), reason, 3, "a")
        return settle_segment(st, tokens, [0.0] * len(tokens), result, replica_id="a", overshoot=overshoot,
                              partial_rollout=partial, response_length=6, stop_ids={9})  # fmt: skip

    st = SampleState("g0-0", "g0", 0, None)
    assert settle(st, [], "abort") is None and st.versions == []  # nothing generated: nothing kept
    assert settle(st, [1, 2], "abort") is None and (st.tokens, st.versions, st.aborted_segments) == ([1, 2], [3], 2)
    assert settle(st, [3, 9], "abort") == "stop" and st.tokens == [1, 2, 3, 9]
    st = SampleState("g0-1", "g0", 1, None, tokens=[1, 2, 3])
    assert settle(st, [4, 5, 6], "abort") == "length"
    assert settle(SampleState("g0-2", "g0", 2, None, tokens=[1]), [2], "abort", partial=False) is None
    assert settle(SampleState("g0-3", "g0", 3, None), [], "stop") == "stop"  # a final segment is kept even empty
    assert settle(SampleState("g0-4", "g0", 4, None), [1] * 6, "stop", overshoot=True) == "length"
