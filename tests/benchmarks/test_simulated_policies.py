"""``benchmarks/simulated_policies.py --partial-lending --changed-fraction``: the scenario it simulates lends k of n
in its ``rate_matched`` runs only and makes every sync a delta of the given share."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from lightning_hybrid_rollout.sim import get_preset

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "simulated_policies.py"


def _bench():
    spec = importlib.util.spec_from_file_location("simulated_policies_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_partial_lending_reaches_the_rate_matched_runs_only_and_deltas_every_sync() -> None:
    base = get_preset("verl_32_devices")
    sc = _bench().with_lending(base, partial=True, changed=0.0485, per_replica=0.5)
    assert [r.name for r in sc.runs] == [r.name for r in base.runs]
    for run in sc.runs:
        partial = run.policy_kwargs.get("partial_lending", False)
        assert partial == (run.hybrid and run.policy == "rate_matched"), run.name
    assert sc.lending.changed_fraction == 0.0485 and sc.lending.sync_per_replica_fraction == 0.5
    # a delta of 4.85% of bf16 elements with int32 indices: 3 x 0.0485 of the bytes for the standalone sync
    assert abs(sc.costs.standalone_sync_s - base.costs.standalone_sync_s * 3 * 0.0485) < 1e-9
