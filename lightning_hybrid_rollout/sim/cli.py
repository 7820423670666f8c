"""``lhr simulate`` and ``lhr plan``: the simulator and the planner on the command line (options and the ``--json``
schema: docs/simulator.md and docs/choosing_a_split.md).

Example::

    from lightning_hybrid_rollout.sim.cli import simulate_main

    simulate_main(["--preset", "verl_32_devices", "--json"])
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lightning_hybrid_rollout.sim.calibration import (
    HOST_PRESETS,
    HYBRID_SPEED_RATIO,
    STANDALONE_SPEED_WITH_HYBRID,
    Calibration,
)
from lightning_hybrid_rollout.sim.presets import get_preset, preset_names
from lightning_hybrid_rollout.sim.renames import (
    HOST_PRESET_RENAMES,
    OPTION_SET_RENAMES,
    PRESET_RENAMES,
    deprecation_message,
)
from lightning_hybrid_rollout.sim.runner import (
    BREAKDOWN_HELP,
    BREAKDOWN_KEYS,
    GAP_HELP,
    GAP_KEYS,
    RunResult,
    ScenarioResult,
    simulate,
)
from lightning_hybrid_rollout.sim.scenario import Scenario, ScenarioError
from lightning_hybrid_rollout.sim.world import SimulationError

logger = logging.getLogger(__name__)

__all__ = ["plan_main", "simulate_main"]


def _renamed(kind: str, renames: Mapping[str, str]) -> Callable[[str], str]:
    """An argparse ``type``: the value (comma-separated names) with each old name of ``renames`` replaced by its new
    one, logged as deprecated (a command line does not show a library's :class:`DeprecationWarning`)."""

    def convert(value: str) -> str:
        names = []
        for name in value.split(","):
            new = renames.get(name.strip())
            if new is not None:
                logger.warning(deprecation_message(kind, name.strip(), new))
            names.append(new or name)
        return ",".join(names)

    convert.__name__ = kind  # argparse's "invalid <type> value" names it
    return convert


def _simulate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lhr simulate",
        description="Simulate runs of a scenario (device split x policy x sequencing) on a virtual clock with the "
        "real controller and policies; report time, efficiency against the balance bound and where the time went.",
    )
    p.add_argument("scenario", nargs="?", help="scenario YAML file (or use --preset)")
    p.add_argument(
        "--preset", type=_renamed("preset", PRESET_RENAMES), help=f"a built-in scenario: {', '.join(preset_names())}"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--gap", action="store_true", help="also print where the time beyond the balance bound went")
    p.add_argument("--plot", metavar="DIR", help="write traces and PNGs into DIR")
    p.add_argument("--runs", help="comma-separated run names to simulate (default: all)")
    p.add_argument("--steps", type=int, help="override the scenario's number of param versions")
    p.add_argument("--seed", type=int, help="override the scenario's random seed")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    p.add_argument(
        "--dump-preset", metavar="NAME", type=_renamed("preset", PRESET_RENAMES), help="print a preset as YAML and exit"
    )
    p.add_argument(
        "--from-run",
        metavar="RUN_DIR",
        help="fit a scenario to a real run (RUN_DIR/trace.json, metrics.csv, config.yaml), print the fitted "
        "parameters with their spread, then simulate it",
    )
    p.add_argument("--write-scenario", metavar="FILE", help="with --from-run: write the fitted scenario YAML to FILE")
    p.add_argument("--fit-only", action="store_true", help="with --from-run: fit and print, do not simulate")
    _add_host_preset(p)
    return p


def _add_host_preset(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host-preset",
        type=_renamed("host preset", HOST_PRESET_RENAMES),
        choices=sorted(HOST_PRESETS),
        help="with --from-run: the figures of the host the run ran on where none is given (hybrid_speed_ratio, "
        "standalone_speed_with_hybrid; default: 1.0 each, no slowdown assumed): "
        + "; ".join(
            f"{h.name}: {h.hybrid_speed_ratio:g} / {h.standalone_speed_with_hybrid:g}, {h.description}"
            for h in HOST_PRESETS.values()
        ),
    )


def _from_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Scenario:
    """The scenario fitted to ``--from-run`` (:mod:`lightning_hybrid_rollout.sim.calibrate`); prints the fit."""
    from lightning_hybrid_rollout.sim.calibrate import CalibrationError, calibrate_run

    if args.scenario or args.preset:
        parser.error("--from-run replaces the scenario: give no scenario file and no --preset")
    try:
        fit = calibrate_run(args.from_run, host=args.host_preset)
    except CalibrationError as err:
        parser.error(str(err))
    out = sys.stderr if args.json else sys.stdout  # --json: stdout holds only the JSON object
    print(
        f"fitted to {args.from_run} (value, interquartile range over the observations, where it came from):", file=out
    )
    for line in fit.lines():
        print(f"  {line}", file=out)
    if args.write_scenario:
        print(f"wrote {fit.write_yaml(args.write_scenario)}", file=out)
    return fit.scenario


def _load(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Scenario:
    if bool(args.scenario) == bool(args.preset):
        parser.error("give a scenario YAML file or --preset NAME (exactly one)")
    try:
        sc = get_preset(args.preset) if args.preset else Scenario.from_yaml(args.scenario)
    except KeyError as err:
        parser.error(str(err.args[0]))
    except (ScenarioError, OSError) as err:
        parser.error(str(err))
    changes = {}
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.seed is not None:
        changes["seed"] = args.seed
    if changes:
        try:
            sc = Scenario.from_dict({**sc.to_dict(), **changes})
        except ScenarioError as err:
            parser.error(str(err))
    return sc


_GAP_TITLE = (
    "beyond each run's one-ratio balance term (G + ρ·W)/(S + ρ·T): where the time went (seconds; sum = total; "
    "total - hybrid_ratio_below_rho_unavoidable = beyond the bound)"
)
_RUN_COLUMNS = ("run", "policy", "train+rollout", "hybrid", "time (h)", "efficiency", "utilization", "faster than 1st")


def _run_rows(result: ScenarioResult) -> list[list[str]]:
    first = result.runs[0].time_s
    return [
        [
            r.name,
            r.policy or "-",
            f"{r.train_devices}+{r.rollout_devices}",
            "yes" if r.hybrid else "no",
            f"{r.time_s / 3600:.2f}",
            f"{r.efficiency:.3f}",
            f"{r.resource_utilization:.3f}",
            f"{(1 - r.time_s / first) * 100:+.1f}%",
        ]
        for r in result.runs
    ]


def _breakdown_keys(result: ScenarioResult) -> list[str]:
    return [k for k in BREAKDOWN_KEYS if any(r.breakdown_s.get(k, 0) > 0 for r in result.runs)]


def _gap_keys(result: ScenarioResult) -> list[str]:
    return [k for k in GAP_KEYS if any(abs(r.gap_s.get(k, 0.0)) >= 0.5 for r in result.runs)]


def _seconds(x: float) -> str:
    return f"{x:.0f}" if round(x) != 0 else "0"


def _gap_row(r: RunResult, keys: list[str]) -> list[str]:
    return [r.name, _seconds(r.gap_s.get("total", 0.0)), *(_seconds(r.gap_s.get(k, 0.0)) for k in keys)]


def _markdown(header: Sequence[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _print_markdown(result: ScenarioResult, gap: bool) -> None:
    print(f"scenario {result.scenario}: balance bound {result.balance_bound_s / 3600:.2f} h\n")
    print(_markdown(_RUN_COLUMNS, _run_rows(result)) + "\n")
    keys = _breakdown_keys(result)
    rows = [[r.name, *(f"{100 * r.breakdown_s.get(k, 0.0) / r.time_s:.1f}%" for k in keys)] for r in result.runs]
    print("where the time went (% of each run's time)\n")
    print(_markdown(["run", *keys], rows) + "\n")
    if gap:
        keys = _gap_keys(result)
        print(f"{_GAP_TITLE}\n")
        columns = [_gap_row(r, keys) for r in result.runs]  # one column per run
        names = ["total", *keys]
        rows = [[name, *(col[i + 1] for col in columns)] for i, name in enumerate(names)]
        print(_markdown(["seconds", *(r.name for r in result.runs)], rows))


def _print_table(result: ScenarioResult, gap: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))
    table = Table(title=f"scenario {result.scenario}: balance bound {result.balance_bound_s / 3600:.2f} h")
    for col in _RUN_COLUMNS:
        table.add_column(col, justify="left" if col in ("run", "policy") else "right", no_wrap=col == "run")
    for row in _run_rows(result):
        table.add_row(*row)
    console.print(table)
    keys = _breakdown_keys(result)
    bt = Table(title="where the time went (% of each run's time)")
    bt.add_column("run", no_wrap=True)
    for k in keys:
        bt.add_column(k.replace("_", " "), justify="right")
    for r in result.runs:
        bt.add_row(r.name, *(f"{100 * r.breakdown_s.get(k, 0.0) / r.time_s:.1f}" for k in keys))
    console.print(bt)
    for k in keys:
        console.print(f"  [bold]{k}[/bold]: {BREAKDOWN_HELP[k]}", highlight=False)
    if gap:
        keys = _gap_keys(result)
        gt = Table(title=_GAP_TITLE)
        gt.add_column("seconds", no_wrap=True)
        for r in result.runs:
            gt.add_column(r.name, justify="right")
        columns = [_gap_row(r, keys) for r in result.runs]
        for i, name in enumerate(["total", *keys]):
            gt.add_row(name, *(col[i + 1] for col in columns))
        console.print(gt)
        for k in keys:
            console.print(f"  [bold]{k}[/bold]: {GAP_HELP[k]}", highlight=False)


def simulate_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lhr simulate`` (see the module docstring). Returns the exit status.

    Args:
        argv: Arguments after ``simulate`` (default: ``sys.argv[1:]``).
    """
    parser = _simulate_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.list_presets:
        for name in preset_names():
            print(f"{name}: {get_preset(name).description}")
        return 0
    if args.dump_preset:
        import yaml

        try:
            print(yaml.safe_dump(get_preset(args.dump_preset).to_dict(), sort_keys=False), end="")
        except KeyError as err:
            parser.error(str(err.args[0]))
        return 0
    if (args.write_scenario or args.fit_only or args.host_preset) and not args.from_run:
        parser.error("--write-scenario, --fit-only and --host-preset go with --from-run RUN_DIR")
    if args.from_run:
        sc = _from_run(args, parser)
        if args.fit_only:
            return 0
        if args.steps is not None or args.seed is not None:
            sc = Scenario.from_dict(
                {
                    **sc.to_dict(),
                    **({"steps": args.steps} if args.steps else {}),
                    **({"seed": args.seed} if args.seed is not None else {}),
                }
            )
    else:
        sc = _load(args, parser)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()] if args.runs else None
    try:
        result = simulate(sc, runs=runs, trace_dir=args.plot)
    except KeyError as err:
        parser.error(str(err.args[0]))
    except SimulationError as err:
        print(f"lhr simulate: {err}", file=sys.stderr)
        return 1
    if args.plot:
        paths = _plot_result(result, Path(args.plot))
        for p in paths:
            logger.info("wrote %s", p)
    if args.json:
        print(json.dumps(result.to_json()))
    elif args.markdown:
        _print_markdown(result, args.gap)
    else:
        _print_table(result, args.gap)
        if args.plot:
            print(f"plots and traces written to {args.plot}")
    return 0


def _plot_result(result: ScenarioResult, out: Path) -> list[Path]:
    from lightning_hybrid_rollout.trace import load_trace
    from lightning_hybrid_rollout.trace_plots import plot_breakdown, render_traces

    traces = {r.name: load_trace(r.trace_path) for r in result.runs if r.trace_path}
    paths = render_traces(traces, out)
    paths.append(
        plot_breakdown({r.name: r.breakdown_s for r in result.runs}, out / "breakdown.png", result.balance_bound_s)
    )
    return paths


# -------------------------------------------------------------------------------------------------------- plan


def _plan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lhr plan",
        description="Simulate every split of N devices, with and without hybrid replicas, every registered policy "
        "and the runtime options; print them ranked by predicted time, with efficiency, speedup over the best "
        "static split, where the time went and the staleness (docs/choosing_a_split.md, 'Plan from a pilot run').",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-run", metavar="RUN_DIR", help="fit the workload to a real run (lhr simulate --from-run)"
    )
    source.add_argument("--scenario", metavar="FILE", help="a scenario YAML file (its runs: are ignored)")
    source.add_argument(
        "--preset", type=_renamed("preset", PRESET_RENAMES), help=f"a built-in scenario: {', '.join(preset_names())}"
    )
    p.add_argument("--devices", type=int, required=True, metavar="N", help="devices to split (trainer + rollout)")
    p.add_argument("--top", type=int, metavar="K", help="show the K fastest (table default 10; --json default all)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--plot", metavar="DIR", help="write the best plan's (and the best static split's) traces and PNGs")
    p.add_argument("--jobs", type=int, default=1, metavar="J", help="simulate in J worker processes (default 1)")
    p.add_argument("--policies", help="comma-separated policies to try with hybrid replicas (default: all registered)")
    p.add_argument(
        "--options",
        type=_renamed("option set", OPTION_SET_RENAMES),
        help="comma-separated runtime-option sets (default: all of sim.plan.OPTION_SETS)",
    )
    p.add_argument("--steps", type=int, help="override the scenario's number of param versions (sync cycles)")
    p.add_argument("--model-gb", type=float, help="with --sync-gbps: standalone weight sync = model-gb x 8 / sync-gbps")
    p.add_argument("--sync-gbps", type=float, help="trainer -> standalone replica bandwidth, Gbit/s (with --model-gb)")
    p.add_argument(
        "--partial-lending",
        action="store_true",
        help="also try rate_matched lending k of n hybrid replicas (runs ..._k_of_n); the 'lent' column is the k "
        "each run lent (docs/policies.md)",
    )
    p.add_argument(
        "--lora",
        type=float,
        metavar="FRACTION",
        help="train a LoRA adapter of FRACTION of the weights' bytes: syncs move only it and hybrid replicas keep "
        "their base weights (the scenario's lora: section, enabled; docs/choosing_a_split.md)",
    )
    p.add_argument(
        "--hybrid-speed-ratio",
        type=float,
        metavar="R",
        help="with --from-run: a static pilot's assumed hybrid / standalone decode rate (default "
        f"--host-preset's, else {HYBRID_SPEED_RATIO:g}: a hybrid replica decodes as fast as a standalone one)",
    )
    p.add_argument(
        "--standalone-speed-with-hybrid",
        type=float,
        metavar="F",
        help="with --from-run: the standalone replicas' speed beside a busy trainer device over beside an idle one, "
        f"converting the pilot's rate for candidates of the other kind (default --host-preset's, else "
        f"{STANDALONE_SPEED_WITH_HYBRID:g}: the rollout devices share nothing with the trainer's; static candidates "
        "take a given F as their speed_while_training too)",
    )
    _add_host_preset(p)
    return p


def _plan_scenario(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Scenario | Calibration:
    """The plan's workload: a pilot run's :class:`Calibration` (``--from-run``: each candidate gets the pilot's
    standalone rate converted for it), or a scenario (``--scenario``, ``--preset``); ``--steps`` applied."""
    from lightning_hybrid_rollout.sim.calibrate import CalibrationError, calibrate_run
    from lightning_hybrid_rollout.sim.plan import base_scenario, with_base_scenario

    out = sys.stderr if args.json else sys.stdout
    source: Scenario | Calibration
    try:
        given = (args.hybrid_speed_ratio, args.standalone_speed_with_hybrid, args.host_preset)
        if given != (None, None, None) and not args.from_run:
            parser.error(
                "--hybrid-speed-ratio, --standalone-speed-with-hybrid and --host-preset convert a pilot run: use "
                "--from-run"
            )
        for flag, value in (
            ("--hybrid-speed-ratio", args.hybrid_speed_ratio),
            ("--standalone-speed-with-hybrid", args.standalone_speed_with_hybrid),
        ):
            if value is not None and not (value > 0 and math.isfinite(value)):
                parser.error(f"{flag} must be a finite number > 0, got {value}")
        if args.from_run:
            source = calibrate_run(args.from_run, hybrid_speed_ratio=args.hybrid_speed_ratio, host=args.host_preset)
            source = dataclasses.replace(source, standalone_factor=args.standalone_speed_with_hybrid)
            print(
                f"workload fitted to {args.from_run} (`lhr simulate --from-run {args.from_run} --fit-only` prints "
                "every number with its spread and source)",
                file=out,
            )
            print(_conversion_line(source, ratio_given=args.hybrid_speed_ratio is not None), file=out)
        elif args.preset:
            source = get_preset(args.preset)
        else:
            source = Scenario.from_yaml(args.scenario)
        if args.steps is not None:
            steps = Scenario.from_dict({**base_scenario(source).to_dict(), "steps": args.steps})
            source = with_base_scenario(source, steps)
    except KeyError as err:
        parser.error(str(err.args[0]))
    except (CalibrationError, ScenarioError, OSError) as err:
        parser.error(str(err))
    return source


def _conversion_line(fit: Calibration, ratio_given: bool = False) -> str:
    """The machine's figures a pilot's plan converts its rates by for candidates of the other kind (static or
    serving), and how to give another machine's."""
    f = fit.standalone_speed_with_hybrid()
    parts = [
        f"standalone_speed_with_hybrid {f:g} ("
        + (
            "given; static candidates' speed_while_training too"
            if fit.standalone_factor is not None
            else f"host preset {fit.host.name}"
            if fit.host is not None
            else "default: no slowdown assumed"
        )
        + ")"
    ]
    if fit.hybrid_speed_ratio is not None:  # a pilot whose hybrid replicas never served: their rate is assumed
        parts.append(
            f"hybrid_speed_ratio {fit.hybrid_speed_ratio:g} ("
            + ("given" if ratio_given else f"host preset {fit.host.name}" if fit.host is not None else "default")
            + ")"
        )
    elif ratio_given:
        parts.append("the hybrid rate the pilot measured (--hybrid-speed-ratio ignored: its hybrid replicas served)")
    return (
        "candidates of the other kind than the pilot convert its standalone rate by "
        + " and ".join(parts)
        + "; for your machine pass --standalone-speed-with-hybrid F --hybrid-speed-ratio R, or --host-preset NAME "
        f"({', '.join(sorted(HOST_PRESETS))}; 1.0 each where the replicas have devices of their own; "
        "docs/choosing_a_split.md, 'Scaling rules')"
    )


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN: a candidate that failed
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


_PLAN_COLUMNS = (
    "#",
    "run",
    "split",
    "policy",
    "options",
    "time",
    "efficiency",
    "vs static",
    "train",
    "hybrid gen",
    "wait",
    "switch+sync",
    "lent",
    "stale max/mean/budget",
    "carried",
    "lag mean/max",
)


def _plan_rows(result: object, top: int) -> list[list[str]]:
    from lightning_hybrid_rollout.sim.plan import Plan, breakdown_groups

    assert isinstance(result, Plan)
    rows = []
    for r in result.rows[:top]:
        if r.error is not None:
            head = [str(r.rank), r.name, r.split, r.policy or "-", r.options]
            rows.append([*head, "failed", r.error[:60], *([""] * (len(_PLAN_COLUMNS) - len(head) - 2))])
            continue
        g = breakdown_groups(r)
        st = r.staleness
        assert st is not None
        rows.append(
            [
                str(r.rank),
                r.name,
                r.split,
                r.policy or "-",
                r.options,
                _duration(r.time_s),
                f"{r.efficiency:.3f}",
                f"x{r.speedup_vs_static:.3f}" if r.speedup_vs_static is not None else "-",
                *(f"{100 * g[k]:.1f}%" for k in ("train", "hybrid gen", "wait", "switch+sync")),
                f"{r.lent_replicas:.1f}/{r.hybrid_replicas}" if r.lent_replicas is not None else "-",
                f"{st.max_samples:.0f}/{st.mean_samples:.0f}/{st.budget_samples}",
                f"{st.carried_mean_samples:.0f}",
                f"{st.version_lag_mean:.2f}/{st.version_lag_max}",
            ]
        )
    return rows


def _plan_title(result: object) -> str:
    from lightning_hybrid_rollout.sim.plan import Plan

    assert isinstance(result, Plan)
    best = result.best
    line = (
        f"plan for {result.devices} devices, scenario {result.scenario}: {len(result.rows)} candidates simulated in "
        f"{result.wall_s:.0f} s; balance bound {_duration(result.balance_bound_s)}; best {best.name} "
        f"{_duration(best.time_s)}"
    )
    if result.best_static is not None and best.speedup_vs_static is not None:
        static = result.row(result.best_static)
        line += f", x{best.speedup_vs_static:.3f} over the best static split {static.name} ({_duration(static.time_s)})"
    return line


_PLAN_NOTES = (
    "efficiency = the plan's balance bound (the best split's) / time; vs static = the best static split's time / "
    "time; train, hybrid gen, wait, switch+sync = the trainer's time; lent = hybrid replicas lent per activated "
    "cycle (mean) / hybrid replicas of the split: the k to configure; staleness = samples counted against a version "
    "per cycle (max/mean) and the budget max_required_samples; carried = mean samples queued or in flight at a sync "
    "(generated partly under older weights); lag = param versions between the weights a trained sample was first "
    "generated under and the weights it trained (mean/max: a real run's train/staleness_mean/max)"
)


def _plot_plan(source: Scenario | Calibration, result: object, out: Path) -> list[Path]:
    """The best plan's (and the best static split's) traces and PNGs in ``out`` (as ``lhr simulate --plot``)."""
    from lightning_hybrid_rollout.sim.plan import Plan, base_scenario, candidate_scenario
    from lightning_hybrid_rollout.sim.runner import run_once

    assert isinstance(result, Plan)
    names = [result.best.name]
    if result.best_static is not None and result.best_static not in names:
        names.append(result.best_static)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for name in names:
        one = candidate_scenario(source, result.row(name).spec())
        run = run_once(one, one.runs[0], out / f"trace_{name}.json")
        run.efficiency = result.balance_bound_s / run.time_s
        runs.append(run)
    return _plot_result(ScenarioResult(base_scenario(source).name, result.balance_bound_s, runs), out)


def plan_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lhr plan`` (:mod:`lightning_hybrid_rollout.sim.plan`). Returns the exit status.

    ``lhr plan (--from-run RUN_DIR | --scenario FILE | --preset NAME) --devices N [--top K] [--json | --markdown]
    [--plot DIR] [--jobs J] [--policies a,b] [--options a,b] [--steps N] [--model-gb GB --sync-gbps GBPS]
    [--partial-lending] [--lora FRACTION] [--standalone-speed-with-hybrid F] [--hybrid-speed-ratio R]``;
    ``--json`` prints exactly one JSON object (:meth:`Plan.to_json`)::

        {"scenario": str, "devices": int, "balance_bound_s": float, "best_static": str | null, "candidates": int,
         "rows": [{"rank", "name", "train_devices", "rollout_devices", "hybrid", "policy", "options",
                   "async_training", "time_s", "efficiency", "speedup_vs_static", "breakdown_s",
                   "staleness": {"max_samples", "mean_samples", "budget_samples", "carried_mean_samples",
                                 "step_samples", "version_lag_mean", "version_lag_max"}, "activations",
                   "hybrid_replicas", "lent_replicas", "error"}]}

    Bad input (fewer than 2 devices, no split fitting the replica size, an unknown preset or policy, a run dir
    without a trace) is one line on stderr and exit status 2.

    Args:
        argv: Arguments after ``plan`` (default: ``sys.argv[1:]``).
    """
    from lightning_hybrid_rollout.errors import PlanError
    from lightning_hybrid_rollout.sim.plan import base_scenario, plan, scale_sync, with_base_scenario, with_lora

    parser = _plan_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.getLogger("lightning_hybrid_rollout.schedule").setLevel(logging.WARNING)  # one note per candidate
    if (args.model_gb is None) != (args.sync_gbps is None):
        parser.error("--model-gb and --sync-gbps go together (the standalone sync = model bytes / bandwidth)")
    if args.top is not None and args.top < 1:
        parser.error(f"--top must be >= 1, got {args.top}")
    sc = _plan_scenario(args, parser)

    def names(value: str | None) -> list[str] | None:
        return [n.strip() for n in value.split(",") if n.strip()] if value else None

    try:
        if args.model_gb is not None:
            sc = with_base_scenario(sc, scale_sync(base_scenario(sc), args.model_gb, args.sync_gbps))
        if args.lora is not None:
            sc = with_base_scenario(sc, with_lora(base_scenario(sc), args.lora))
        result = plan(
            sc,
            args.devices,
            jobs=args.jobs,
            policies=names(args.policies),
            option_sets=names(args.options),
            partial_lending=args.partial_lending,
        )
    except PlanError as err:
        parser.error(str(err))
    paths = _plot_plan(sc, result, Path(args.plot)) if args.plot else []
    for p in paths:
        logger.info("wrote %s", p)
    if args.json:
        print(json.dumps(result.to_json(args.top)))
        return 0
    top = args.top or 10
    rows = _plan_rows(result, top)
    if args.markdown:
        print(_plan_title(result) + "\n")
        print(_markdown(_PLAN_COLUMNS, rows) + "\n")
        print(_PLAN_NOTES)
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=max(Console().width, 220))
        table = Table(title=_plan_title(result))
        for col in _PLAN_COLUMNS:
            table.add_column(col, justify="left" if col in ("run", "policy", "options") else "right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        console.print(_PLAN_NOTES, highlight=False)
    if len(result.rows) > top:
        print(f"({len(result.rows) - top} more: --top {len(result.rows)})")
    for p in paths:
        print(p)
    return 0
