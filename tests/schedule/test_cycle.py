"""The per-cycle core's own rules (runtime vs simulator: tests/lightning/test_callback_matches_simulator.py)."""

from __future__ import annotations

import textwrap

from lightning_hybrid_rollout import metrics as M
from lightning_hybrid_rollout.schedule import cycle
from lightning_hybrid_rollout.schedule.cycle import CycleEnd, CycleLedger, ProductionByRole, RunShape, Totals


def _ledger(hybrid: int = 1) -> CycleLedger:
    shape = RunShape(required_samples=4, trigger_parameter_sync_step=2, num_hybrid_replicas=hybrid, hybrid_devices=2)
    return CycleLedger(shape)


def test_the_module_example_runs() -> None:
    exec(textwrap.dedent(cycle.__doc__.split("Example::")[1]), {})


def test_the_context_holds_the_cycle_so_far_and_the_next_cycle_starts_empty() -> None:
    ledger = _ledger()
    ledger.add_deactivate_wait(2.0, 3)
    ledger.add_batch(wait_s=1.0, queue_before=1, samples=4, tokens=30)
    ledger.add_compute(0.5)
    ledger.end_step(allocated_s=1.5, step_s=3.5)
    ctx = ledger.context(Totals(10, 4, 6), ProductionByRole(standalone_serving_s=3.0, hybrid_decoded_tokens=7.0))
    assert (ctx.step_wait_times, ctx.step_wait_samples, ctx.step_queue_sizes) == ([1.0], [3], [1])
    assert (ctx.cycle_trained_samples, ctx.cycle_trained_tokens, ctx.cycle_train_compute_s) == (4, 30, 0.5)
    assert (ctx.deactivate_wait_s, ctx.deactivate_wait_samples) == (2.0, 3)
    assert (ctx.standalone_serving_s, ctx.hybrid_decoded_tokens, ctx.queue_size) == (3.0, 7.0, 6)
    ledger.close(CycleEnd())
    empty = ledger.context(Totals(10, 4, 6))
    assert empty.step_wait_times == [] and empty.deactivate_wait_s == 0.0 and empty.cycle_trained_tokens == 0


def test_the_deactivate_wait_counts_as_hybrid_rollout_only_in_a_cycle_that_deactivated() -> None:
    for deactivated, expected_x in ((True, 0.5), (False, 0.0)):
        ledger = _ledger()
        ledger.add_deactivate_wait(2.0, 3)
        ledger.mark_deactivation(deactivated)
        ledger.add_batch(0.0, 4, 4, 10)
        ledger.add_compute(1.0)
        ledger.end_step(allocated_s=2.0, step_s=4.0)
        out = ledger.close(CycleEnd())
        u_train = out[M.TRAIN_RESOURCE_UTILIZATION]
        assert u_train == 0.5
        # no standalone devices: U_cluster = (1 - x) * U_train + x * U_rollout, with U_rollout = 0 (no history)
        assert out[M.RESOURCE_UTILIZATION] == (1 - expected_x) * u_train


def test_hybrid_sync_skipped_is_one_per_cycle_without_a_hybrid_push_and_the_total_counts_them() -> None:
    ledger = _ledger()
    seen = []
    for active, synced in ((False, False), (True, False), (False, True), (False, False)):
        ledger.record_sync_decision(hybrid_active=active, hybrid_synced=synced)
        out = ledger.close(CycleEnd(standalone_sync_s=1.0, hybrid_sync_s=0.5 if active or synced else 0.0))
        seen.append((out[M.HYBRID_SYNC_SKIPPED], out[M.HYBRID_SYNC_SKIPPED_TOTAL], out[M.WEIGHT_SYNC_TIME_S]))
    assert seen == [(1.0, 1.0, 1.0), (0.0, 1.0, 1.5), (0.0, 1.0, 1.5), (1.0, 2.0, 1.0)]
    restored = _ledger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.hybrid_sync_skipped_total == 2


def test_without_hybrid_replicas_no_sync_is_ever_skipped() -> None:
    ledger = _ledger(hybrid=0)
    ledger.record_sync_decision(hybrid_active=False, hybrid_synced=False)
    assert ledger.close(CycleEnd())[M.HYBRID_SYNC_SKIPPED] == 0.0


def test_the_start_decision_counts_in_the_total_but_in_no_cycle() -> None:
    ledger = _ledger()
    ledger.record_start_decision(hybrid_active=False, hybrid_synced=False)
    out = ledger.close(CycleEnd())  # a cycle that made no decision of its own (the simulator's last)
    assert (out[M.HYBRID_SYNC_SKIPPED], out[M.HYBRID_SYNC_SKIPPED_TOTAL]) == (0.0, 1.0)


def test_a_checkpoint_in_the_middle_of_a_cycle_keeps_its_measurements() -> None:
    ledger = _ledger()
    ledger.add_batch(wait_s=1.0, queue_before=2, samples=4, tokens=9)
    ledger.add_compute(0.5)
    ledger.end_step(allocated_s=1.5, step_s=1.5)
    restored = _ledger()
    restored.load_state_dict(ledger.state_dict())
    totals = Totals(8, 4, 1)
    assert restored.context(totals) == ledger.context(totals)
    assert restored.close(CycleEnd()) == ledger.close(CycleEnd())
