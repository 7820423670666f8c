"""Multi-turn agentic episodes in the simulator (issue #39 item 6): turns, tool waits, the ``agentic`` preset."""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.schedule import available_policies, create_policy
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateScheduleContext
from lightning_hybrid_rollout.sim import RolloutWorld, Scenario, ScenarioError, get_preset, simulate
from tests.sim.conftest import dynamic_run, tiny_scenario

AGENTIC = {
    "min_turns": 2,
    "max_turns": 4,
    "tool_latency_median_s": 2.0,
    "tool_latency_sigma": 0.3,
    "tool_output_tokens": 50,
}


def _static(**agentic: float) -> Scenario:
    """Standalone replicas only, with a staleness budget (336 samples) no test here reaches."""
    at = {"mini_batch_size": 8, "trigger_parameter_sync_step": 2, "staleness_threshold": 20.0}
    sc = tiny_scenario(agentic={**AGENTIC, **agentic}, async_training=at)
    return sc.with_runs([sc.run("static_2_2")])


def test_agentic_block_is_checked_and_off_by_default():
    assert not tiny_scenario().multi_turn
    with pytest.raises(ScenarioError, match="max_turns"):
        tiny_scenario(agentic={"min_turns": 3, "max_turns": 2})
    with pytest.raises(ScenarioError, match="agentic has no key 'turns'"):
        tiny_scenario(agentic={"turns": 3})


def test_an_episode_alternates_turns_and_tool_waits_off_the_replica():
    sc = _static()
    world = RolloutWorld(sc, sc.runs[0])
    world.start()
    seen_waiting = False
    while world.generated < 40:
        world.advance_to(world.now + 0.5)
        for s in world.tool_waiting.values():
            seen_waiting = True
            assert s.replica is None and all(s.sid not in r.members for r in world.replicas)
            assert s.turn >= 1 and s.remaining == s.turns[s.turn]  # the next turn waits whole
    assert seen_waiting
    for s in world.queue:
        assert 2 <= len(s.turns) <= 4 and s.length == sum(s.turns)
        assert len(s.tool_s) == len(s.turns) - 1 and all(t > 0 for t in s.tool_s)
        assert s.extra_tokens == 50 * (len(s.turns) - 1)
        # an episode takes at least its tool calls
        assert s.finished_t - s.admitted_t >= sum(s.tool_s)


def test_episodes_are_the_same_in_every_run():
    sc = _static()
    a, b = RolloutWorld(sc, sc.runs[0]), RolloutWorld(sc, sc.runs[0])
    for w in (a, b):
        w.start()
        w.run_until(lambda w=w: w.generated >= 16, "16 episodes")
    first = {s.sid: (s.turns, s.tool_s) for s in a.queue}
    assert all(first[s.sid] == (s.turns, s.tool_s) for s in b.queue if s.sid in first)


def test_tool_waits_slow_generation_down():
    fast, slow = _static(tool_latency_median_s=0.0), _static(tool_latency_median_s=20.0)
    times = []
    for sc in (fast, slow):
        w = RolloutWorld(sc, sc.runs[0])
        w.start()
        times.append(w.run_until(lambda w=w: w.generated >= 32, "32 episodes"))
    assert times[1] > times[0] * 1.2


def test_rate_matched_predicts_episodes_per_second_while_replicas_idle_on_tools():
    """'A sample' is an episode: decoded tokens per serving second over tokens per episode (all turns) is the
    episodes per second the replicas deliver, tool waits included (docs/policies.md)."""
    sc = _static(tool_latency_median_s=8.0)
    w = RolloutWorld(sc, sc.runs[0])
    w.start()
    w.run_until(lambda: w.generated >= 16, "warm-up")
    w.take_window()
    w.run_until(lambda: w.generated >= 300, "episodes")
    win = w.take_window()
    ctx = RateScheduleContext(
        required_samples=sc.required_samples,
        trigger_parameter_sync_step=sc.trigger_parameter_sync_step,
        standalone_serving_s=win.serving_s["standalone"],
        standalone_decoded_tokens=win.tokens["standalone"],
        cycle_train_compute_s=10.0,
        cycle_trained_samples=win.delivered,
        cycle_trained_tokens=win.delivered_tokens,
    )
    forecast = create_policy("rate_matched").forecast(ctx)
    measured = win.delivered / win.serving_s["standalone"]
    assert forecast is not None
    assert forecast.standalone_rate == pytest.approx(measured, rel=0.1)


def test_every_registered_policy_runs_on_agentic_episodes():
    runs = [dynamic_run(f"dyn_{p}", p) for p in available_policies()]
    result = simulate(tiny_scenario(agentic=AGENTIC, runs=runs))
    for r in result.runs:
        assert r.time_s > 0 and sum(r.breakdown_s.values()) == pytest.approx(r.time_s), r.name
        assert 0 < r.efficiency <= 1.0 + 1e-9 and r.time_s >= r.work_bound_s, r.name


@pytest.mark.parametrize("latency_s", [0.0, 2.0, 7.3])
def test_the_gap_accounts_for_every_decoded_token_of_an_episode(latency_s):
    """Re-prefill after an abort covers the whole context (earlier turns too); the drain still books exactly what
    was decoded and never trained, so the gap's parts add up (``residual`` ~ 0)."""
    sc = tiny_scenario(agentic={"min_turns": 2, "max_turns": 4, "tool_latency_median_s": latency_s})
    for r in simulate(sc).runs:
        assert abs(r.gap_s["residual"]) < 1e-9 * r.time_s, r.name


def test_agentic_preset_runs_every_policy_and_rate_matched_beats_verl_v1():
    sc = get_preset("agentic")
    assert sc.multi_turn and (sc.agentic.min_turns, sc.agentic.max_turns) == (2, 6)
    assert {r.policy for r in sc.runs if r.hybrid} == set(available_policies())
    result = simulate(sc)
    verl = result.run("dynamic_hysteresis_ratio")
    # the policy alone (same sequencing), then our best registered policy with the runtime options
    assert result.run("dynamic_rate_matched").efficiency > verl.efficiency
    best = max((r for r in result.runs if r.hybrid), key=lambda r: r.efficiency)
    assert best.policy == "rate_matched" and best.efficiency > verl.efficiency
