"""``lhr report RUN_DIR [--out DIR] [--window START END] [--train-devices N]``: a finished run read from its trace.

Prints, per trace, the run's balance bound, its efficiency and where the trainer's time went (:mod:`.run_bound`: the
simulator's bound from the run's own measurements), then renders the trace (``RUN_DIR/trace.json``, or every
``trace*.json`` there) into the PNGs of ``lhr simulate --plot`` (default output: ``RUN_DIR/plots``) and prints their
paths, one per line. Per-step metrics come from the trace's ``step_metrics`` events or, if it has none, from
``RUN_DIR/metrics.jsonl`` (one JSON object per line with a ``"step"`` key and ``dynamic_resource/*`` keys).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_hybrid_rollout.analysis.run_bound import report_from_trace
from lightning_hybrid_rollout.trace import StepMetrics, TraceData, load_trace
from lightning_hybrid_rollout.trace_plots import render_traces

__all__ = ["report_main"]


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lhr report",
        description="Print a run's balance bound, efficiency and time breakdown from its trace (RUN_DIR/trace.json) "
        "and render the trace into the PNGs of `lhr simulate --plot`.",
    )
    p.add_argument("run_dir", help="the run folder holding trace.json (and optionally metrics.jsonl)")
    p.add_argument("--out", help="output folder (default: RUN_DIR/plots)")
    p.add_argument("--window", nargs=2, type=float, metavar=("START_S", "END_S"), help="timeline window in seconds")
    p.add_argument("--cycles", type=int, default=3, help="sync cycles in the automatic timeline window (default 3)")
    p.add_argument(
        "--train-devices",
        type=float,
        help="the trainer's devices for the balance bound (default: as the trace describes them)",
    )
    return p


def _print_bound(name: str, trace: TraceData, train_devices: float | None) -> None:
    """The run's balance bound, efficiency and breakdown (``run_bound``), three indented lines under its name."""
    try:
        report = report_from_trace(trace, name, train_devices)
    except ValueError as err:  # no trainer span: nothing to break down
        print(f"{name}: {err}")
        return
    print(f"{name}:")
    for line in report.lines():
        print(f"  {line}")


def _merge_metrics_jsonl(trace: TraceData, path: Path) -> int:
    n = 0
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{i + 1}: not JSON: {err}") from err
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}:{i + 1}: each line must be a JSON object with a 'step' key")
        metrics = {
            k: float(v)
            for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        trace.steps.append(StepMetrics(int(row["step"]), float(row.get("t", 0.0)), metrics))
        n += 1
    trace.steps.sort(key=lambda s: s.step)
    return n


def report_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lhr report RUN_DIR`` (see the module docstring). Returns the exit status.

    Args:
        argv: Arguments after ``report`` (default: ``sys.argv[1:]``).
    """
    parser = _report_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        parser.error(f"RUN_DIR {run_dir} is not a folder")
    files = [run_dir / "trace.json"] if (run_dir / "trace.json").is_file() else sorted(run_dir.glob("trace*.json"))
    if not files:
        parser.error(f"no trace.json (or trace*.json) in {run_dir}; run training with the trace enabled first")
    traces = {}
    for f in files:
        try:
            trace = load_trace(f)
        except ValueError as err:
            print(f"lhr report: {err}", file=sys.stderr)
            return 1
        name = str(trace.metadata.get("run") or (run_dir.name if f.name == "trace.json" else f.stem))
        traces[name] = trace
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for trace in traces.values():
            if not trace.steps:
                try:
                    _merge_metrics_jsonl(trace, metrics)
                except ValueError as err:
                    print(f"lhr report: {err}", file=sys.stderr)
                    return 1
    for name, trace in traces.items():
        _print_bound(name, trace, args.train_devices)
    out = Path(args.out) if args.out else run_dir / "plots"
    paths = render_traces(traces, out, window=tuple(args.window) if args.window else None, cycles=args.cycles)
    for p in paths:
        print(p)
    return 0
