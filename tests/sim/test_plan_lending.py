"""``lhr plan --partial-lending``: the plan tries ``rate_matched`` lending k of n and each row says the k its run
lent per activated cycle (``lent``), the number to configure."""

from __future__ import annotations

import json

import pytest

from lightning_hybrid_rollout.sim.cli import plan_main
from lightning_hybrid_rollout.sim.plan import candidate_runs, plan

from .conftest import tiny_scenario


def test_partial_lending_adds_a_k_of_n_rate_matched_run_where_there_are_several_hybrid_replicas() -> None:
    sc = tiny_scenario()
    plain = {r.name for r in candidate_runs(sc, 4, policies=["rate_matched"], option_sets=["defaults"])}
    runs = candidate_runs(sc, 4, policies=["rate_matched"], option_sets=["defaults"], partial_lending=True)
    added = [r for r in runs if r.name not in plain]
    # trainer splits with 2+ hybrid replicas (4+0, 3+1, 2+2) get a k-of-n twin; 1+3 has one replica
    assert sorted(r.name for r in added) == [
        "dynamic_2_2_rate_matched_k_of_n",
        "dynamic_3_1_rate_matched_k_of_n",
        "dynamic_4_0_rate_matched_k_of_n",
    ]
    assert all(r.async_training["dynamic_schedule_policy_kwargs"] == {"partial_lending": True} for r in added)


def test_each_row_says_how_many_of_its_hybrid_replicas_were_lent(lend_one: str) -> None:
    sc = tiny_scenario()
    rows = {r.name: r for r in plan(sc, 4, policies=[lend_one, "default"], option_sets=["defaults"]).rows}
    one, every = rows[f"dynamic_2_2_{lend_one}"], rows["dynamic_2_2_default"]
    assert one.hybrid_replicas == every.hybrid_replicas == 2
    assert one.lent_replicas == 1.0 and every.lent_replicas == 2.0
    assert rows["static_2_2"].hybrid_replicas == 0 and rows["static_2_2"].lent_replicas is None
    assert one.to_json()["lent_replicas"] == 1.0


def test_lhr_plan_partial_lending_prints_the_lent_column(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    import yaml

    path.write_text(yaml.safe_dump(tiny_scenario().to_dict()))
    argv = ["--scenario", str(path), "--devices", "4", "--policies", "rate_matched", "--options", "defaults"]
    assert plan_main([*argv, "--partial-lending", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    k_of_n = [r for r in rows if r["name"].endswith("_k_of_n")]
    assert k_of_n and all(r["lent_replicas"] is None or 1 <= r["lent_replicas"] <= r["hybrid_replicas"] for r in rows)
    assert plan_main([*argv, "--partial-lending", "--markdown"]) == 0
    assert "| lent |" in capsys.readouterr().out
