"""Rollouter production per replica role: decoded tokens and serving seconds per window (``rate_matched`` inputs)."""

from __future__ import annotations

from lightning_hybrid_rollout.rollout.role_window import RoleWindow
from tests.rollout.fakes import FakeReplica, ManualClock, wait_for
from tests.rollout.test_rollouter import make


def test_tokens_are_counted_per_role_and_windows_partition_them():
    s = FakeReplica("s", token_latency=(0.0005, 0.001), seed=1)
    h = FakeReplica("h", role="hybrid", token_latency=(0.0005, 0.001), seed=2)
    ro, queue = make([s], n_prompts=40, max_required=40, per_replica=4, max_tokens=8)
    ro.start()
    try:
        queue.get_batch(8, timeout=10)
        ro.add_replicas([h])
        queue.get_batch(16, timeout=10)
        first = ro.take_role_window()
        queue.get_batch(16, timeout=10)  # all 40 delivered: every segment is back
        second = ro.take_role_window()
    finally:
        ro.stop()
    assert isinstance(first, RoleWindow)
    assert first.decoded_tokens["hybrid"] > 0 and first.decoded_tokens["standalone"] > 0
    for role, fake in (("standalone", s), ("hybrid", h)):
        assert first.decoded_tokens[role] + second.decoded_tokens[role] == fake.tokens_generated
    assert sum(first.decoded_tokens.values()) + sum(second.decoded_tokens.values()) == 40 * 8
    assert first.end_s == second.start_s


def test_aborted_partial_segments_count_as_decoded_even_when_thrown_away():
    fake = FakeReplica("a", token_latency=(0.001, 0.001))
    ro, queue = make([fake], n_prompts=3, max_tokens=12, partial_rollout=False)
    ro.start()
    try:
        wait_for(lambda: fake.tokens_generated >= 6)
        assert ro.pause(abort_in_flight=True) == 3
        ro.resume()
        got = queue.get_batch(3, timeout=10)
        window = ro.take_role_window()
    finally:
        ro.stop()
    kept = sum(x.response_length for x in got)
    assert kept == 36
    assert window.decoded_tokens["standalone"] == fake.tokens_generated > kept  # the thrown-away prefixes count
    assert window.decoded_tokens["hybrid"] == 0


def test_serving_seconds_follow_routing_syncs_and_pauses_with_an_injected_clock():
    clock = ManualClock(0.0)
    s = FakeReplica("s", hold=True)
    h = FakeReplica("h", role="hybrid", hold=True)
    ro, _ = make([s], n_prompts=4, per_replica=2, clock=clock)
    before = ro.take_role_window()  # not started: nothing serves
    clock.t = 5.0
    ro.start()
    try:
        wait_for(lambda: s.in_flight == 2)  # the loop runs: serving started at t = 5
        clock.t = 6.0
        ro.add_replicas([h], paused=True)  # registered but not routable: not serving
        clock.t = 7.0
        ro.resume_generation_replicas(["h"])
        clock.t = 9.0
        ro.remove_replicas(["h"])  # deactivated: 2 s of hybrid serving
        clock.t = 10.0
        ro.set_syncing(["s"], True)  # standalone weight sync: 1 s not serving
        clock.t = 11.0
        ro.set_syncing(["s"], False)
        clock.t = 12.0
        ro.pause()  # rollouter paused: 2 s not serving
        clock.t = 14.0
        ro.resume()
        clock.t = 15.0
        first = ro.take_role_window()
        clock.t = 17.0
        second = ro.take_role_window()
        clock.t = 18.0
        ro.set_syncing(["s"], True)
        clock.t = 20.0
        ro.stop()  # stopping ends serving too
    finally:
        ro.stop()
    clock.t = 30.0
    after = ro.take_role_window()
    assert before.serving_s == {"standalone": 0.0, "hybrid": 0.0}
    assert first.serving_s == {"standalone": 10.0 - 1.0 - 2.0, "hybrid": 2.0}
    assert (first.start_s, first.end_s) == (0.0, 15.0)
    assert second.serving_s == {"standalone": 2.0, "hybrid": 0.0}
    assert (second.start_s, second.end_s) == (15.0, 17.0)
    assert after.serving_s == {"standalone": 1.0, "hybrid": 0.0}  # 17 -> 18, then syncing, then stopped
    assert first.decoded_tokens == second.decoded_tokens == {"standalone": 0, "hybrid": 0}  # held: nothing decoded


def test_a_dead_replica_stops_serving():
    clock = ManualClock(0.0)
    s = FakeReplica("s", hold=True)
    d = FakeReplica("d", role="hybrid", hold=True)
    ro, _ = make([s, d], n_prompts=4, per_replica=2, clock=clock, no_replica_timeout_s=None)
    ro.start()
    try:
        wait_for(lambda: d.in_flight == 2)
        ro.take_role_window()
        clock.t = 3.0
        d.kill()  # its requests raise ReplicaDeadError: the load balancer marks it dead
        wait_for(lambda: ro.load_balancer.replica_state("d") == "dead")
        clock.t = 4.0
        window = ro.take_role_window()
    finally:
        ro.stop()
    assert window.serving_s == {"standalone": 4.0, "hybrid": 3.0}


def test_peek_role_window_reads_the_window_so_far_without_restarting_it():
    clock = ManualClock(0.0)
    s = FakeReplica("s", token_latency=(0.0005, 0.001), seed=1)
    ro, queue = make([s], n_prompts=40, max_required=40, per_replica=4, max_tokens=8, clock=clock)
    ro.start()
    try:
        queue.get_batch(8, timeout=10)
        clock.t = 4.0
        ro.set_syncing(["s"], True)
        clock.t = 5.0
        peeked = ro.peek_role_window()
        again = ro.peek_role_window()
        ro.set_syncing(["s"], False)
        clock.t = 7.0
        taken = ro.take_role_window()
        clock.t = 8.0
        next_peek = ro.peek_role_window()
    finally:
        ro.stop()
    assert (peeked.start_s, peeked.end_s) == (0.0, 5.0)
    assert peeked.serving_s == again.serving_s == {"standalone": 4.0, "hybrid": 0.0}  # the sync is not serving
    assert 0 < peeked.decoded_tokens["standalone"] <= again.decoded_tokens["standalone"]  # generation goes on
    # the take still covers the whole window, from its start
    assert (taken.start_s, taken.end_s) == (0.0, 7.0)
    assert taken.serving_s == {"standalone": 6.0, "hybrid": 0.0}
    assert taken.decoded_tokens["standalone"] >= peeked.decoded_tokens["standalone"]
    # and only the take restarts it
    assert (next_peek.start_s, next_peek.end_s) == (7.0, 8.0)
    assert next_peek.serving_s == {"standalone": 1.0, "hybrid": 0.0}


class _CachingReplica(FakeReplica):
    """A replica whose prefix cache served the first half of every prompt."""

    async def generate(self, request_id, prompt_token_ids, sampling):  # type: ignore[no-untyped-def]
        result = await super().generate(request_id, prompt_token_ids, sampling)
        result.cached_prompt_tokens = len(prompt_token_ids) // 2
        return result


def test_windows_carry_the_prompt_tokens_and_those_the_prefix_caches_served():
    s = _CachingReplica("s", token_latency=(0.0005, 0.001), seed=1)
    ro, queue = make([s], n_prompts=40, max_required=40, per_replica=4, max_tokens=8)
    ro.start()
    try:
        queue.get_batch(16, timeout=10)
        first = ro.take_role_window()
        queue.get_batch(24, timeout=10)  # all 40 delivered: every segment is back
        second = ro.take_role_window()
    finally:
        ro.stop()
    prompts = [call.prompt_len for call in s.calls]
    assert first.prompt_tokens > 0 and first.prompt_tokens + second.prompt_tokens == sum(prompts)
    cached = first.cached_prompt_tokens + second.cached_prompt_tokens
    assert cached == sum(n // 2 for n in prompts)
    assert first.prefix_cache_hit_rate == first.cached_prompt_tokens / first.prompt_tokens
    assert RoleWindow({}, {}, 0.0, 0.0).prefix_cache_hit_rate == 0.0  # nothing came back
