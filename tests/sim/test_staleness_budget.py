"""The staleness budget over the presets (issue #14.6): no run admits beyond ``max_required_samples``.

``sim/staleness_samples`` is the count the rollouter held against a version when it closed (the admission bound:
``staleness + group <= max_required_samples``), ``sim/carried_samples`` what the version carried into the next one
(queued or in flight at the sync). A cycle of ``n`` micro-steps consumes ``n × required_samples``, so it carries at
most ``max_required_samples - n × required_samples``: ``buffer_samples`` for a full cycle, whatever the policy.
"""

from __future__ import annotations

import pytest

from lightning_hybrid_rollout.sim import get_preset, simulate

PRESETS = ("seed", "rollout_bound", "drifting", "standalone_sufficient")


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
    for preset in ("seed", "rollout_bound", "drifting"):
        result = simulate(get_preset(preset))
        best = min((r for r in result.runs if r.hybrid), key=lambda r: r.time_s)
        assert best.name == "dynamic_rate_matched_overlap_early_staged_keep", preset
        assert best.time_s < result.run("dynamic_hysteresis_ratio").time_s, preset
        assert best.time_s <= result.run("dynamic_rate_matched_overlap_early_staged").time_s, preset
    sufficient = simulate(get_preset("standalone_sufficient"))
    assert sufficient.run("dynamic_rate_matched_overlap_early_staged_keep").activations == 0
