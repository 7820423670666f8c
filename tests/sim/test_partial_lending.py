"""The simulator lends k of n hybrid replicas through the real controller and policy: only the lent replicas serve,
the metric counts them, and the sync cost follows ``Scenario.lending`` (per replica, delta bytes)."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ScenarioError
from lightning_hybrid_rollout.schedule.cycle import ACTIVE_HYBRID_REPLICAS
from lightning_hybrid_rollout.sim.lending import LendingModel
from lightning_hybrid_rollout.sim.runner import _Run

from .conftest import dynamic_run, tiny_scenario


@pytest.mark.parametrize("overlap", [False, True])
def test_only_the_lent_replica_serves_and_the_metric_counts_it(lend_one, overlap):
    runs = [dynamic_run("lend_one", lend_one, train=2, overlap_sync=overlap)]
    sc = tiny_scenario(runs=runs)
    run = _Run(sc, sc.runs[0], None)
    assert run.controller is not None and run.controller.num_hybrid_replicas == 2
    result = run.execute()
    hybrid = run.world.hybrid
    assert hybrid[0].tokens > 0 and hybrid[1].tokens == 0
    active = [s[ACTIVE_HYBRID_REPLICAS] for s in result.steps]
    assert set(active) <= {0.0, 1.0} and 1.0 in active and result.activations > 0


def test_all_or_nothing_runs_count_every_hybrid_replica():
    sc = tiny_scenario(runs=[dynamic_run("d", "default", train=2)])
    result = _Run(sc, sc.runs[0], None).execute()
    assert {s[ACTIVE_HYBRID_REPLICAS] for s in result.steps} <= {0.0, 2.0}
    assert 2.0 in {s[ACTIVE_HYBRID_REPLICAS] for s in result.steps}


def _hybrid_sync_s(lend_one: str | None, lending: dict[str, Any]) -> float:
    runs = [dynamic_run("r", lend_one or "default", train=2)]
    sc = tiny_scenario(runs=runs, lending=lending)
    return _Run(sc, sc.runs[0], None).execute().breakdown_s["weight_sync_hybrid"]


def test_the_hybrid_sync_follows_the_replicas_synced_only_with_a_per_replica_share(lend_one):
    parallel = _hybrid_sync_s(lend_one, {})
    serial = _hybrid_sync_s(lend_one, {"sync_per_replica_fraction": 1.0})
    assert parallel > 0 and serial == pytest.approx(parallel / 2)  # 1 of 2 replicas, every sync
    assert _hybrid_sync_s(None, {"sync_per_replica_fraction": 1.0}) == pytest.approx(_hybrid_sync_s(None, {}))


def test_lending_model_costs_and_delta_bytes():
    lending = LendingModel()
    assert lending.hybrid_sync_s(10.0, replicas=1, of=4) == lending.hybrid_sync_s(10.0, replicas=4, of=4) == 10.0
    serial = LendingModel(sync_per_replica_fraction=0.5)
    assert serial.hybrid_sync_s(10.0, replicas=2, of=4) == pytest.approx(7.5)
    delta = LendingModel(changed_fraction=0.02)
    assert delta.bytes_fraction(1) == pytest.approx(0.06)  # (4 + 2) / 2 bytes per changed element
    assert delta.bytes_fraction(3) == pytest.approx((1 - 0.98**3) * 3)
    assert delta.bytes_fraction(100) == 1.0 and delta.bytes_fraction(None) == 1.0 and delta.bytes_fraction(0) == 0
    with pytest.raises(ScenarioError, match=r"lending.changed_fraction must be null or a number in \[0, 1\], got 1.5"):
        LendingModel(changed_fraction=1.5)


def test_a_delta_scenario_pays_less_sync_and_keeps_weights_through_sleep():
    sc_full = tiny_scenario()
    sc_delta = tiny_scenario(lending={"changed_fraction": 0.02})
    assert sc_delta.costs.standalone_sync_s == pytest.approx(sc_full.costs.standalone_sync_s * 0.06)
    full = _hybrid_sync_s(None, {})
    delta = _hybrid_sync_s(None, {"changed_fraction": 0.02})
    assert 0 < delta < full / 2  # the first sync is full, later ones a delta from the kept version
