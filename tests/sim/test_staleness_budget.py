"""The staleness budget over the presets (issue #14.6): no run admits beyond ``max_required_samples``.

``sim/staleness_samples`` is the count the rollouter held against a version when it closed (the admission bound:
``staleness + group <= max_required_samples``), ``sim/carried_samples`` what the version carried into the next one
(queued or in flight at the sync). A cycle of ``n`` micro-steps consumes ``n × required_samples``, so it carries at
most ``max_required_samples - n × required_samples``: ``buffer_samples`` for a full cycle, whatever the policy.
"""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.sim import get_preset, simulate

PRESETS = ("verl_32_devices", "rollout_bound", "drifting", "standalone_sufficient")


@pytest.mark.parametrize("preset", PRESETS)
def test_no_run_of_a_preset_spends_more_than_the_staleness_budget(preset):
    sc = get_preset(preset)
    result = simulate(sc)
    for run in result.runs:
        spec = sc.run(run.name)
        cycles = [1, sc.trigger_parameter_sync_step - 1] if spec.early_first_sync else []
        cycles += [sc.trigger_parameter_sync_step] * (len(run.steps) - len(cycles))
        for step, n_micro in zip(run.steps, cycles):
            assert step["sim/staleness_samples"] <= sc.max_required_samples, run.name
            carried = step["sim/carried_samples"]
            assert carried <= sc.max_required_samples - n_micro * sc.required_samples, (run.name, step["sim/step"])
            if n_micro == sc.trigger_parameter_sync_step:
                assert carried <= sc.buffer_samples, (run.name, step["sim/step"])


def test_staged_keep_run_in_every_preset_and_the_best_run_beats_verl_v1s_rule():
    for preset in ("verl_32_devices", "rollout_bound", "drifting"):
        result = simulate(get_preset(preset))
        best = min((r for r in result.runs if r.hybrid), key=lambda r: r.time_s)
        assert best.name == "dynamic_rate_matched_overlap_early_staged_keep", preset
        assert best.time_s < result.run("dynamic_hysteresis_ratio").time_s, preset
        assert best.time_s <= result.run("dynamic_rate_matched_overlap_early_staged").time_s, preset
    sufficient = simulate(get_preset("standalone_sufficient"))
    assert sufficient.run("dynamic_rate_matched_overlap_early_staged_keep").activations == 1  # the pipeline fill


def _tiny(staleness: float):
    from .conftest import tiny_scenario

    at = {"mini_batch_size": 8, "trigger_parameter_sync_step": 2, "staleness_threshold": staleness}
    return tiny_scenario(async_training=at, steps=10)


def test_without_a_staleness_budget_every_trained_sample_is_of_the_trainers_own_version():
    result = simulate(_tiny(0.0))
    for run in result.runs:
        assert run.version_lag_mean == 0.0 and run.version_lag_max == 0, run.name
        assert all(step["sim/version_lag_max"] == 0.0 for step in run.steps), run.name


def test_the_version_lag_grows_with_the_staleness_budget_and_the_cycles_add_up_to_the_run():
    lags = {}
    for staleness in (0.0, 0.5, 1.0):
        sc = _tiny(staleness)
        result = simulate(sc)
        for run in result.runs:
            # each cycle trains the same number of samples: the run's mean is the mean of the cycles' means
            cycle_means = [step["sim/version_lag_mean"] for step in run.steps]
            assert run.version_lag_mean == pytest.approx(sum(cycle_means) / len(cycle_means)), run.name
            assert run.version_lag_max == max(step["sim/version_lag_max"] for step in run.steps), run.name
        lags[staleness] = result.run("static_2_2").version_lag_mean
    # a budget beyond one cycle's samples admits samples that train one or more versions later
    assert lags[0.0] == 0.0 < lags[0.5] < lags[1.0]
