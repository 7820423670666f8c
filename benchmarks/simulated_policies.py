"""Compare the scheduling policies on the simulator's presets; the last line is ``speedup: X``.

``X`` = dynamic_default time / rate_matched time on the ``verl_32_devices`` preset, both with the ``sequential``
sequencing (the policy alone). The table also shows the ``overlap_sync`` sequencing (a runtime change, see
docs/simulator.md) and each run's efficiency against the balance bound, and per preset our best run with hybrid
replicas against verl v1's switch rule (``dynamic_hysteresis_ratio``), both efficiencies.

Usage::

    python benchmarks/simulated_policies.py \\
        [--presets verl_32_devices,rollout_bound,drifting,standalone_sufficient,agentic] \\
        [--partial-lending] [--changed-fraction 0.0485] [--sync-per-replica 0.5]

``--partial-lending`` lets every ``rate_matched`` run lend k of n hybrid replicas; ``--changed-fraction`` makes every
sync a delta of that share of the elements (bf16: 2-byte values, 4-byte indices; SmolLM2's measured share is
0.0485, ``benchmarks/weight_sync.py --delta``); ``--sync-per-replica`` is the share of the hybrid sync paid once per
lent replica (the scenario's ``lending:`` section, docs/simulator.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from lightning_hybrid_rollout.sim import get_preset, preset_names, simulate
from lightning_hybrid_rollout.sim.lending import LendingModel
from lightning_hybrid_rollout.sim.scenario import Scenario


def with_lending(sc: Scenario, *, partial: bool, changed: float | None, per_replica: float) -> Scenario:
    """``sc`` with k-of-n lending for its ``rate_matched`` runs and the given delta and per-replica sync model."""
    runs = []
    for run in sc.runs:
        changes = dict(run.async_training)
        if partial and run.hybrid and run.policy == "rate_matched":
            kwargs = dict(changes.get("dynamic_schedule_policy_kwargs") or {})
            changes["dynamic_schedule_policy_kwargs"] = {**kwargs, "partial_lending": True}
        runs.append(dataclasses.replace(run, async_training=changes))
    lending = LendingModel(sync_per_replica_fraction=per_replica, changed_fraction=changed)
    return dataclasses.replace(sc.with_runs(runs), lending=lending)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(preset_names()), help="comma-separated preset names")
    parser.add_argument("--partial-lending", action="store_true", help="rate_matched runs lend k of n")
    parser.add_argument("--changed-fraction", type=float, default=None, help="delta syncs of this changed share")
    parser.add_argument("--sync-per-replica", type=float, default=0.0, help="hybrid sync share paid per replica")
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    if "verl_32_devices" not in presets:
        presets.append("verl_32_devices")
    speedup = None
    for name in presets:
        start = time.perf_counter()
        scenario = get_preset(name)
        if args.partial_lending or args.changed_fraction is not None or args.sync_per_replica:
            scenario = with_lending(
                scenario,
                partial=args.partial_lending,
                changed=args.changed_fraction,
                per_replica=args.sync_per_replica,
            )
        result = simulate(scenario)
        elapsed = time.perf_counter() - start
        default = result.run("dynamic_default")
        print(f"\n{name}: balance bound {result.balance_bound_s / 3600:.2f} h (simulated in {elapsed:.1f} s)")
        print(f"  {'run':32s} {'time (h)':>9s} {'eff':>6s} {'vs default':>11s} {'activations':>12s}")
        for r in result.runs:
            vs = default.time_s / r.time_s - 1
            print(f"  {r.name:32s} {r.time_s / 3600:9.2f} {r.efficiency:6.3f} {vs * 100:+10.2f}% {r.activations:12d}")
        verl = next((r for r in result.runs if r.policy == "hysteresis_ratio"), None)
        if verl is not None:
            best = max((r for r in result.runs if r.hybrid), key=lambda r: r.efficiency)
            print(
                f"  best: {best.name} ({best.policy}) eff {best.efficiency:.3f} vs verl v1's rule "
                f"({verl.name}) eff {verl.efficiency:.3f}"
            )
        if name == "verl_32_devices":
            speedup = default.time_s / result.run("dynamic_rate_matched").time_s
            closed = (result.run("dynamic_rate_matched_overlap").efficiency - default.efficiency) / (
                1 - default.efficiency
            )
            print(f"  gap to the bound closed by rate_matched + overlap_sync: {closed * 100:.1f}%")
    print(f"speedup: {speedup:.4f}")


if __name__ == "__main__":
    main()
