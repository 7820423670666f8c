"""The scenario's ``lora`` section (issue #40 item 3): adapter-only syncs and base-keeping hybrid replicas make the
simulated switches and syncs cheaper, and can change ``lhr plan``'s best split (docs/choosing_a_split.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lightning_hybrid_rollout.errors import PlanError
from lightning_hybrid_rollout.sim import ScenarioError, SwitchCosts, simulate
from lightning_hybrid_rollout.sim.cli import plan_main
from lightning_hybrid_rollout.sim.plan import with_lora
from lightning_hybrid_rollout.sim.scenario import LoraModel
from tests.sim.conftest import tiny_scenario

DOC = Path(__file__).resolve().parents[2] / "docs" / "choosing_a_split.md"
MARKER = "<!-- tests/sim/test_lora_costs.py"
SWITCH_KEYS = ("hybrid_switching", "weight_sync_hybrid", "weight_sync_standalone")


def test_lora_scales_sync_and_switch_costs():
    full = SwitchCosts(standalone_sync_s=20.0, standalone_commit_s=5.0, hybrid_sync_s=10.0, wake_s=12.0, sleep_s=8.0)
    assert LoraModel().apply(full) == full  # off by default
    lora = LoraModel(enabled=True, adapter_fraction=0.05, adapter_load_s=0.5, kv_fraction=0.25).apply(full)
    assert lora.standalone_sync_s == pytest.approx(1.5) and lora.hybrid_sync_s == pytest.approx(1.0)
    assert lora.standalone_commit_s == pytest.approx(0.75)
    assert (lora.wake_s, lora.sleep_s) == (3.0, 2.0)  # KV cache only: the base weights stay on the devices
    reload = LoraModel(enabled=True, adapter_fraction=0.05, keep_base=False).apply(full)
    assert (reload.wake_s, reload.sleep_s) == (12.0, 8.0)
    with pytest.raises(ScenarioError, match="adapter_fraction"):
        tiny_scenario(lora={"enabled": True, "adapter_fraction": 2.0})


def test_lora_lowers_switch_and_sync_time_in_a_simulated_run():
    full = tiny_scenario(steps=8)
    lora = with_lora(tiny_scenario(steps=8, lora={"adapter_load_s": 0.02}), 0.02)  # the tiny syncs take 0.5-1 s
    assert lora.lora.enabled and lora.lora.adapter_load_s == 0.02  # --lora keeps the section's other fields
    assert lora.costs.hybrid_sync_s < full.costs.hybrid_sync_s and full.costs == full.switch
    for name in ("static_2_2", "dynamic_rate_matched_overlap"):
        a, b = simulate(full.with_runs([full.run(name)])).runs[0], simulate(lora.with_runs([lora.run(name)])).runs[0]
        spent_full = sum(a.breakdown_s[k] for k in SWITCH_KEYS)
        spent_lora = sum(b.breakdown_s[k] for k in SWITCH_KEYS)
        assert spent_lora < 0.8 * spent_full, name  # add/resume/remove/abort calls cost the same
        assert b.time_s < a.time_s, name
    with pytest.raises(PlanError, match="--lora"):
        with_lora(full, 1.5)


def _doc_commands() -> list[list[str]]:
    """The ``lhr plan`` lines of the bash block after the marker, as argument lists."""
    after = DOC.read_text().split(MARKER, 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].split()[2:] for line in block.splitlines() if line.startswith("lhr plan")]


def _doc_claims() -> list[tuple[str, float]]:
    """The best rows the prose after the block names: ``best `NAME` (T h)``, without LoRA then with it."""
    after = DOC.read_text().split(MARKER, 1)[1]
    return [(m[0], float(m[1])) for m in re.findall(r"best `(\w+)` \(([\d.]+) h", after)[:2]]


def test_the_docs_lora_plans_best_rows_hold_and_lora_cuts_every_runs_switching(capsys):
    commands, claims = _doc_commands(), _doc_claims()
    assert len(commands) == 2 and "--lora" in commands[1] and len(claims) == 2
    rows = []
    for argv in commands:
        assert plan_main([*argv, "--json"]) == 0
        rows.append(json.loads(capsys.readouterr().out)["rows"])
    for plan_rows, (name, hours) in zip(rows, claims):
        assert plan_rows[0]["name"] == name
        assert plan_rows[0]["time_s"] / 3600 == pytest.approx(hours, abs=0.006)

    def spent(row: dict) -> float:
        return sum(row["breakdown_s"][k] for k in SWITCH_KEYS)

    by_name = {r["name"]: r for r in rows[1]}
    assert all(spent(by_name[r["name"]]) < spent(r) for r in rows[0] if r["name"] in by_name and spent(r) > 0)
