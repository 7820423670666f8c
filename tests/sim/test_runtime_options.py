"""The simulator's runtime options (``overlap_sync``'s context, ``early_first_sync``, ``staged_standalone_sync``), the
standalone-sync abort, the progress-driven length model and the gap accounting. Each runtime option is off by
default and models one runtime change; ``standalone_sync_aborts`` is on by default because the runtime aborts the
standalone replicas' requests at every weight sync (docs/simulator.md, "Runtime options")."""

from __future__ import annotations

import math

import pytest

from lightning_hybrid_rollout.sim import RunSpec, get_preset, simulate
from lightning_hybrid_rollout.sim.runner import GAP_KEYS, _Run, replace_run, run_once

from .conftest import dynamic_run, tiny_scenario

_OVERLAP = {"overlap_sync": True}
_EARLY = {"overlap_sync": True, "early_first_sync": True}


def _rollout_bound_tiny(**switch):
    """Tiny scenario where hybrid replicas must help every cycle (3 trainer devices, 1 rollout device)."""
    costs = {"standalone_sync_s": 1.0, "standalone_commit_s": 0.25, "hybrid_sync_s": 0.5, "wake_s": 0.5}
    costs.update(switch)
    return tiny_scenario(
        steps=8,
        switch={**costs, "sleep_s": 0.5},
        runs=[
            dynamic_run("seq", "rate_matched", 3, 1),
            dynamic_run("overlap", "rate_matched", 3, 1, **_OVERLAP),
            dynamic_run("early", "rate_matched", 3, 1, **_EARLY),
            dynamic_run("early_staged", "rate_matched", 3, 1, **_EARLY, staged_standalone_sync=True),
            {"name": "static", "train_devices": 2, "rollout_devices": 2},
            {
                "name": "static_early_staged",
                "train_devices": 2,
                "rollout_devices": 2,
                "async_training": {"early_first_sync": True, "staged_standalone_sync": True},
            },
        ],
    )


def _execute(sc, name):
    run = _Run(sc, sc.run(name), None)
    return run, run.execute()


def test_options_default_off_and_the_seed_reference_runs_use_none():
    spec = RunSpec(name="r", train_devices=4, rollout_devices=4)
    assert spec.sequencing == "sequential" and not spec.early_first_sync and not spec.staged_standalone_sync
    assert spec.standalone_sync_aborts  # what the runtime does: on by default
    seed = get_preset("verl_32_devices")
    for name in ("dynamic_default", "dynamic_rate_matched", "static_16_16", "static_8_24"):
        r = seed.run(name)
        assert r.sequencing == "sequential" and not r.early_first_sync and not r.staged_standalone_sync, name
    assert seed.run("dynamic_default").enable_rebalance
    improved = seed.run("dynamic_rate_matched_overlap_early_staged")
    assert improved.early_first_sync and improved.staged_standalone_sync and improved.sequencing == "overlap_sync"


@pytest.mark.parametrize("preset", ["verl_32_devices", "rollout_bound", "drifting", "standalone_sufficient"])
def test_every_preset_run_models_the_runtimes_abort_at_a_standalone_sync(preset):
    assert all(r.standalone_sync_aborts for r in get_preset(preset).runs)


def test_overlap_sync_asks_the_policy_with_the_cycles_measurements():
    # the runtime builds the full context before the standalone sync: the very first activation is already
    # prepared under the sync (only add + resume + rebalance remain), not woken and synced afterwards
    sc = _rollout_bound_tiny()
    seq, overlap = run_once(sc, "seq"), run_once(sc, "overlap")
    assert overlap.activations == seq.activations > 0
    costs = sc.switch
    acts = [s["sim/activation_s"] for s in overlap.steps if s.get("sim/activation_s", 0) > 0]
    assert acts and all(a < costs.wake_s + costs.hybrid_sync_s for a in acts)
    # the one hybrid sync the trainer waits for is the start decision's (the pipeline fill): no standalone sync then
    assert overlap.breakdown_s["weight_sync_hybrid"] == pytest.approx(costs.hybrid_sync_s)
    assert seq.breakdown_s["weight_sync_hybrid"] > 2 * costs.hybrid_sync_s


def test_early_first_sync_same_micro_steps_one_more_sync():
    sc = _rollout_bound_tiny()
    m, steps = sc.trigger_parameter_sync_step, sc.steps
    base, early = run_once(sc, "static"), run_once(sc, "static_early_staged")
    assert early.consumed == base.consumed == steps * m * sc.required_samples
    assert len(base.steps) == steps and len(early.steps) == steps + 1
    assert early.breakdown_s["weight_sync_standalone"] == pytest.approx((steps + 1) * sc.switch.standalone_sync_s)
    run, _ = _execute(sc, "early")
    assert run._cycle_lengths() == [1, m - 1] + [m] * (steps - 1)


def test_lengths_follow_training_progress_not_versions():
    sc = _rollout_bound_tiny()
    run, _ = _execute(sc, "early")
    m = sc.trigger_parameter_sync_step
    # version 1 after one micro-step, version v >= 2 after (v - 1) * m micro-steps
    expected = {0: 0.0, 1: 1 / m, **{v: float(v - 1) for v in range(2, sc.steps + 2)}}
    assert run.world.progress_at == pytest.approx(expected)
    run, _ = _execute(sc, "overlap")
    assert run.world.progress_at == {v: float(v) for v in range(sc.steps + 1)}


def test_staged_standalone_sync_pauses_generation_only_for_the_commit():
    sc = _rollout_bound_tiny()
    syncs = sc.steps + 1
    run, result = _execute(sc, "static_early_staged")
    paused = run.world.device_account["standalone_syncing"]
    assert paused == pytest.approx(syncs * sc.switch.standalone_commit_s * 2)  # 2 rollout devices
    # the trainer still sends the weights for the whole sync
    assert result.breakdown_s["weight_sync_standalone"] == pytest.approx(syncs * sc.switch.standalone_sync_s)
    run, _ = _execute(sc, "static")
    assert run.world.device_account["standalone_syncing"] == pytest.approx(sc.steps * sc.switch.standalone_sync_s * 2)


def test_staged_standalone_sync_also_under_overlap_sync():
    sc = _rollout_bound_tiny()
    early, staged = _execute(sc, "early")[0], _execute(sc, "early_staged")[0]
    syncs = sc.steps + 1
    assert staged.world.device_account["standalone_syncing"] == pytest.approx(syncs * sc.switch.standalone_commit_s)
    assert early.world.device_account["standalone_syncing"] == pytest.approx(syncs * sc.switch.standalone_sync_s)


def test_commit_longer_than_the_sync_is_the_whole_sync():
    sc = _rollout_bound_tiny(standalone_commit_s=5.0)
    run, _ = _execute(sc, "static_early_staged")
    assert run.world.device_account["standalone_syncing"] == pytest.approx((sc.steps + 1) * 1.0 * 2)


def test_standalone_sync_aborts_pays_the_re_prefill():
    sc = _rollout_bound_tiny()
    aborted = _execute(sc, "static")[0].world  # the default: the runtime's abort
    keep = _execute(replace_run(sc, "static", standalone_sync_aborts=False), "static")[0].world
    assert keep.device_account.get("standalone_sync_reprefill", 0.0) == 0.0 and keep.cumulative_aborts == 0
    assert aborted.device_account["standalone_sync_reprefill"] > 0 and aborted.cumulative_aborts > 0
    assert aborted.device_account.get("standalone_reprefill", 0.0) == 0.0  # the rebalance's, not the sync's


def _record_standalone_syncs(run: _Run) -> dict[str, list]:
    """Per standalone weight sync of ``run`` (before it executes): when it started, when the standalone replicas
    paused (``begin_weight_update``), when they resumed, the tokens they had decoded at the first two, and the
    aborts of their in-flight requests (time, how many)."""
    w = run.world
    log: dict[str, list] = {"start": [], "pause": [], "end": [], "aborts": []}

    def tokens() -> float:
        for r in w.standalone:
            r.advance(w.now)
        return sum(r.tokens for r in w.standalone)

    def recording(inner):
        def entered(*args):
            if not log["start"] or log["start"][-1][0] != w.now:  # _overlapped_sync may call _standalone_sync
                log["start"].append((w.now, tokens()))
            return inner(*args)

        return entered

    run._standalone_sync = recording(run._standalone_sync)
    run._overlapped_sync = recording(run._overlapped_sync)
    set_state, abort = w.set_state, w.abort

    def recording_set_state(replicas, state, **kwargs):
        if replicas is w.standalone and state == "syncing":
            log["pause"].append((w.now, tokens()))
        elif replicas is w.standalone and state == "active":
            log["end"].append(w.now)
        return set_state(replicas, state, **kwargs)

    def recording_abort(replicas, penalty=True, account=None):
        moved = abort(replicas, penalty, account)
        if account == "standalone_sync_reprefill":
            log["aborts"].append((w.now, moved))
        return moved

    w.set_state, w.abort = recording_set_state, recording_abort
    return log


@pytest.mark.parametrize(
    ("name", "staged"), [("static", False), ("static_early_staged", True), ("early", False), ("early_staged", True)]
)
def test_standalone_sync_aborts_when_the_replicas_pause_staged_at_the_commit(name, staged):
    """The runtime's sequence: the seed's sync aborts at ``begin_weight_update``, before the buckets stream (the
    whole sync is the pause); a staged sync stages every bucket while the replicas keep generating and aborts only
    at the commit, the last ``standalone_commit_s`` of the sync. Both the plain and the ``overlap_sync`` path."""
    sc = _rollout_bound_tiny()
    costs = sc.switch
    run = _Run(sc, sc.run(name), None)
    log = _record_standalone_syncs(run)
    run.execute()
    pause = costs.standalone_commit_s if staged else costs.standalone_sync_s
    assert len(log["start"]) == len(log["pause"]) == len(log["end"]) == len(log["aborts"]) == len(run.steps)
    for (t0, tok0), (tp, tokp), te, (ta, n) in zip(log["start"], log["pause"], log["end"], log["aborts"], strict=True):
        assert tp - t0 == pytest.approx(costs.standalone_sync_s - pause)
        assert te - tp == pytest.approx(pause)
        assert ta == tp  # aborted exactly when they pause
        if not staged:
            assert tokp == tok0
        elif n:
            assert tokp > tok0  # the requests aborted at the commit kept generating while the buckets were staged
    assert sum(n for _, n in log["aborts"]) > 0
    assert run.world.device_account["standalone_sync_reprefill"] > 0  # re-prefilled after the load


def test_peek_window_does_not_restart_the_window():
    sc = _rollout_bound_tiny()
    run = _Run(sc, sc.run("static"), None)
    w = run.world
    w.start()
    w.advance_to(30.0)
    a = w.peek_window()
    b = w.peek_window()
    assert a.tokens == b.tokens and a.serving_s == b.serving_s and a.tokens["standalone"] > 0
    taken = w.take_window()
    assert taken.tokens["standalone"] == pytest.approx(a.tokens["standalone"])
    assert w.peek_window().tokens["standalone"] == pytest.approx(0.0, abs=1e-9)


def test_gap_accounting_sums_to_the_time_beyond_the_balance_term():
    result = simulate(_rollout_bound_tiny())
    for r in result.runs:
        assert set(r.gap_s) == {*GAP_KEYS, "total"}
        parts = sum(v for k, v in r.gap_s.items() if k != "total")
        assert math.isclose(parts, r.gap_s["total"], rel_tol=1e-9, abs_tol=1e-6), r.name
        assert r.time_s - r.gap_s["total"] <= r.work_bound_s * (1 + 1e-9), r.name
        assert r.gap_s["trainer_waiting_idle"] >= 0 and r.gap_s["standalone_paused_for_sync"] > 0


def test_seed_gap_diagnosis_of_the_improvements():
    """The mechanisms remove what they say they remove (docs/simulator.md, "Where the gap goes")."""
    seed = simulate(get_preset("verl_32_devices"))
    before = seed.run("dynamic_rate_matched_overlap").gap_s
    early = seed.run("dynamic_rate_matched_overlap_early").gap_s
    staged = seed.run("dynamic_rate_matched_overlap_early_staged").gap_s
    # the cold-start cycle's idle trainer goes with early_first_sync
    assert before["trainer_waiting_idle"] > 300 and early["trainer_waiting_idle"] < 50
    # rebalance off: no standalone re-prefill from the rebalance
    assert before["reprefill_after_standalone_aborts"] > 50 and early["reprefill_after_standalone_aborts"] == 0
    # the runtime's abort at every standalone sync stays (staged: at the commit), about as costly either way
    for gap in (before, early, staged):
        assert gap["reprefill_after_standalone_sync_aborts"] > 50
    assert staged["reprefill_after_standalone_sync_aborts"] == pytest.approx(
        early["reprefill_after_standalone_sync_aborts"], rel=0.2
    )
    # staged sync: standalone replicas pause for 5 of the 20 s
    assert staged["standalone_paused_for_sync"] == pytest.approx(early["standalone_paused_for_sync"] / 4, rel=0.01)
    # keep mode: the same pause, no abort and so no re-prefill at the standalone syncs
    keep = seed.run("dynamic_rate_matched_overlap_early_keep").gap_s
    assert keep["reprefill_after_standalone_sync_aborts"] == 0
    assert keep["standalone_paused_for_sync"] == pytest.approx(early["standalone_paused_for_sync"], rel=0.01)


def test_standalone_sync_mode_keep_is_the_runs_config_key_for_the_no_abort_pause():
    sc = _rollout_bound_tiny()
    static = next(r for r in sc.runs if r.name == "static")
    keep = replace_run(sc, "static", async_training={**static.async_training, "standalone_sync_mode": "keep"})
    spec = next(r for r in keep.runs if r.name == "static")
    assert spec.standalone_sync_aborts and not spec.sync_aborts  # the config key wins, as in the runtime
    world = _execute(keep, "static")[0].world
    assert world.device_account.get("standalone_sync_reprefill", 0.0) == 0.0 and world.cumulative_aborts == 0


def test_replace_run_keeps_the_other_runs():
    sc = _rollout_bound_tiny()
    changed = replace_run(sc, "static", async_training={"early_first_sync": True})
    assert changed.run("static").early_first_sync and not sc.run("static").early_first_sync
    assert changed.run("seq") == sc.run("seq")
    # a run's changes replace its own async_training; merging them keeps the ones it had
    early = sc.run("early_staged").async_training
    merged = replace_run(sc, "early_staged", async_training={**early, "dynamic_schedule_enable_rebalance": False})
    run = merged.run("early_staged")
    assert run.early_first_sync and run.staged_standalone_sync and not run.enable_rebalance
    assert run.config.staleness_threshold == sc.staleness_threshold  # the scenario's workload, not the defaults
