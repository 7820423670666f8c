"""Compare the scheduling policies on the simulator's presets; the last line is ``speedup: X``.

``X`` = dynamic_default time / rate_matched time on the ``verl_32_devices`` preset, both with the ``sequential``
sequencing (the policy alone). The table also shows the ``overlap_sync`` sequencing (a runtime change, see
docs/simulator.md) and each run's efficiency against the balance bound, and per preset our best run with hybrid
replicas against verl v1's switch rule (``dynamic_hysteresis_ratio``), both efficiencies.

Usage::

    python benchmarks/simulated_policies.py \\
        [--presets verl_32_devices,rollout_bound,drifting,standalone_sufficient,agentic]
"""

from __future__ import annotations

import argparse
import time

from lightning_hybrid_rollout.sim import get_preset, preset_names, simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(preset_names()), help="comma-separated preset names")
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    if "verl_32_devices" not in presets:
        presets.append("verl_32_devices")
    speedup = None
    for name in presets:
        start = time.perf_counter()
        result = simulate(get_preset(name))
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
