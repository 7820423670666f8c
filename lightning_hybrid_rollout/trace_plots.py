"""PNG renderers shared by ``lhr simulate --plot`` and ``lhr report`` (timelines, ``mq_size``, utilizations, time
breakdown): both read the same trace (:mod:`lightning_hybrid_rollout.trace`), so a simulated run and a real one draw
the same pictures. A multi-turn run's timeline adds a lane on top with its tool and environment calls.

Example::

    from lightning_hybrid_rollout.trace_plots import render_traces
    from lightning_hybrid_rollout.trace import load_trace

    paths = render_traces({"my_run": load_trace("run/trace.json")}, "run/plots")
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.trace import STEP_METRICS, TOOLS_GROUP, TRAINER_TRACK, Span, TraceData

logger = logging.getLogger(__name__)

__all__ = ["plot_breakdown", "plot_mq_size", "plot_timeline", "plot_utilization", "render_traces"]

MQ_SIZE = "dynamic_resource/mq_size"
UTILIZATIONS: tuple[tuple[str, str], ...] = (
    ("dynamic_resource/train_resource_utilization", "train utilization"),
    ("dynamic_resource/rollout_resource_utilization", "rollout utilization"),
    ("dynamic_resource/resource_utilization", "cluster utilization"),
)
COLORS: dict[str, str] = {
    "rollout": "#4C8BF5",
    "training": "#F5C542",
    "weight_sync": "#3BAA5C",
    "switching": "#9A9A9A",
    "waiting": "#E4E4E4",
    "tool": "#A15CC4",
    "tool_error": "#D64545",
}
LABELS: dict[str, str] = {
    "rollout": "rollout",
    "training": "trainer",
    "weight_sync": "weight sync",
    "switching": "switching",
    "waiting": "trainer waiting",
    "tool": "tool/env call",
    "tool_error": "tool/env error",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "run"


def _auto_window(trace: TraceData, cycles: int) -> tuple[float, float]:
    """A window of ``cycles`` sync cycles in the middle of the run (the whole run if it is shorter)."""
    ends = [s.t for s in trace.steps]
    end = trace.end_s
    if len(ends) <= cycles + 1:
        return 0.0, end
    first = max(0, len(ends) // 2 - cycles // 2 - 1)
    return ends[first], ends[min(len(ends) - 1, first + cycles)]


def _replica_rows(trace: TraceData) -> list[tuple[str, str, list[int]]]:
    """(track, kind, devices) per replica, standalone first then hybrid, by first device."""
    rows = []
    for track, info in trace.tracks.items():
        if not track.startswith("replica/"):
            continue
        kind = str(info.get("kind", "standalone"))
        devices = [int(d) for d in info.get("devices", [])] or [len(rows)]
        rows.append((track, kind, devices))
    rows.sort(key=lambda r: (r[1] != "standalone", r[2][0] if r[2] else 0))
    return rows


def _clip(spans: Sequence[Span], t0: float, t1: float) -> list[tuple[float, float, Span]]:
    out = []
    for s in spans:
        a, b = max(s.start_s, t0), min(s.end_s, t1)
        if b > a:
            out.append((a, b, s))
    return out


def plot_timeline(
    trace: TraceData,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    window: tuple[float, float] | None = None,
    cycles: int = 3,
) -> Path:
    """Draw the resource-time layout (design/scheduling.md's figure) of one run.

    Args:
        trace: The run's trace.
        path: PNG to write.
        title: Figure title (default: the run name from the trace metadata).
        window: ``(start_s, end_s)`` to draw; default: ``cycles`` sync cycles in the middle of the run.
        cycles: Sync cycles in the automatic window.
    """
    plt = _plt()
    t0, t1 = window if window is not None else _auto_window(trace, cycles)
    rows = _replica_rows(trace)
    trainer_spans = trace.spans_of(TRAINER_TRACK)
    has_hybrid = any(kind == "hybrid" for _, kind, _ in rows)
    layout: list[tuple[str, str, list[int]]] = [r for r in rows if r[1] == "standalone"]
    if has_hybrid:
        layout += [r for r in rows if r[1] == "hybrid"]
    else:
        devices = [int(d) for d in trace.tracks.get(TRAINER_TRACK, {}).get("devices", [])]
        if not devices:  # a trace without the trainer's devices: count them from the metadata, after the replicas
            n = int(trace.metadata.get("train_devices", 0) or 0) or 1
            first = max([d for _, _, ds in rows for d in ds], default=-1) + 1
            devices = list(range(first, first + n))
        layout.append((TRAINER_TRACK, "trainer", devices))
    tool_spans = _clip(trace.group_spans(TOOLS_GROUP), t0, t1)
    tool_h = 1.0 if trace.group_spans(TOOLS_GROUP) else 0.0  # the lane shows (empty) in any window of such a run
    fig_h = max(2.6, 0.45 + 0.16 * (sum(len(d) for _, _, d in layout) + tool_h))
    fig, ax = plt.subplots(figsize=(10, min(fig_h, 7.5)), dpi=100)
    y = 0.0
    yticks, ylabels = [], []
    # layer 0: the trainer's phases on its devices; layer 1: replica states, drawn on top
    segments: dict[tuple[int, float, float, str], list[tuple[float, float]]] = {}

    def bar(a: float, b: float, y0: float, h: float, what: str, layer: int) -> None:
        segments.setdefault((layer, y0, h, what), []).append((a, b - a))

    trainer_state = {
        "training": "training",
        "waiting": "waiting",
        "weight_sync": "weight_sync",
        "switching": "switching",
    }
    for track, kind, devices in reversed(layout):  # draw bottom-up: hybrid (trainer devices) at the bottom
        h = float(len(devices))
        if kind in ("hybrid", "trainer"):
            for a, b, s in _clip(trainer_spans, t0, t1):
                what = trainer_state.get(s.name)
                if what is not None:
                    bar(a, b, y, h * 0.92, what, 0)
        if kind != "trainer":
            for a, b, s in _clip(trace.spans_of(track), t0, t1):
                if s.name == "active":
                    bar(a, b, y, h * 0.92, "rollout", 1)
                elif s.name == "syncing":
                    bar(a, b, y, h * 0.92, "weight_sync", 1)
                elif s.name == "switching":
                    bar(a, b, y, h * 0.92, "switching", 1)
        short = track.split("/")[-1]
        label = f"{short}  (dev {devices[0]}–{devices[-1]})" if len(devices) > 1 else f"{short}  (dev {devices[0]})"
        yticks.append(y + h * 0.46)
        ylabels.append(label)
        y += h
    if tool_h:  # concurrent calls overlap in this one lane: each is drawn, errors and timeouts on top
        tick = (t1 - t0) / 500 if t1 > t0 else 1e-3  # a call of milliseconds in a window of minutes stays visible
        for a, b, s in tool_spans:
            failed = s.args.get("status", "ok") != "ok"
            bar(a, max(b, a + tick), y, tool_h * 0.92, "tool_error" if failed else "tool", 3 if failed else 2)
        yticks.append(y + tool_h * 0.46)
        ylabels.append("tools / environment")
        y += tool_h
    used: set[str] = set()
    for (_, y0, h, what), bars in sorted(segments.items(), key=lambda item: item[0][0]):
        ax.broken_barh(bars, (y0, h), facecolors=COLORS[what], edgecolors="none")
        used.add(what)
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.set_xlim(t0, t1 if t1 > t0 else t0 + 1)
    ax.set_ylim(0, y)
    ax.set_xlabel("time (s)")
    for s in trace.steps:
        if t0 < s.t < t1:
            ax.axvline(s.t, color="black", linewidth=0.6, linestyle=":")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in COLORS if k in used]
    ax.legend(
        handles,
        [LABELS[k] for k in COLORS if k in used],
        loc="upper center",
        ncol=min(len(handles), 7) or 1,  # one row: a second one would cover the axis label
        fontsize=7,
        bbox_to_anchor=(0.5, -0.16 if fig_h < 4 else -0.09),
        frameon=False,
    )
    run = title or str(trace.metadata.get("run", "run"))
    ax.set_title(f"{run}: resource-time layout (dotted = end of a sync cycle)", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _series(traces: Mapping[str, TraceData], metric: str) -> dict[str, tuple[list[int], list[float]]]:
    return {name: tr.step_series(metric) for name, tr in traces.items()}


def plot_mq_size(traces: Mapping[str, TraceData], path: str | os.PathLike[str]) -> Path:
    """``dynamic_resource/mq_size`` per step, one line per run.

    Args:
        traces: Run name → trace.
        path: PNG to write.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    for name, (xs, ys) in _series(traces, MQ_SIZE).items():
        if xs:
            ax.plot(xs, ys, label=name, linewidth=1.2)
    ax.set_xlabel("step (param version)")
    ax.set_ylabel("samples in the queue")
    ax.set_title("dynamic_resource/mq_size", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_utilization(traces: Mapping[str, TraceData], path: str | os.PathLike[str]) -> Path:
    """The three design/scheduling.md §4 utilizations per step (train, rollout, cluster), one panel each, one line per
    run.

    Args:
        traces: Run name → trace.
        path: PNG to write.
    """
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.0), dpi=100, sharey=True)
    for ax, (metric, label) in zip(axes, UTILIZATIONS):
        for name, (xs, ys) in _series(traces, metric).items():
            if xs:
                ax.plot(xs, ys, label=name, linewidth=1.1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("utilization")
    axes[-1].legend(fontsize=7, frameon=False, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_breakdown(
    breakdowns: Mapping[str, Mapping[str, float]], path: str | os.PathLike[str], bound_s: float | None = None
) -> Path:
    """Stacked horizontal bars: where each run's time went (hours), with the balance bound as a line.

    Args:
        breakdowns: Run name → bucket → seconds (e.g. the simulator's ``breakdown_s``).
        path: PNG to write.
        bound_s: Draw the balance bound at this time.
    """
    plt = _plt()
    names = list(breakdowns)
    keys: list[str] = []
    for b in breakdowns.values():
        keys += [k for k, v in b.items() if v > 0 and k not in keys]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * max(1, len(names))), dpi=100)
    cmap = plt.get_cmap("tab10")
    left = [0.0] * len(names)
    for i, key in enumerate(keys):
        widths = [breakdowns[n].get(key, 0.0) / 3600.0 for n in names]
        ax.barh(names, widths, left=left, color=cmap(i % 10), label=key.replace("_", " "))
        left = [a + b for a, b in zip(left, widths)]
    if bound_s is not None and math.isfinite(bound_s):
        ax.axvline(bound_s / 3600.0, color="black", linestyle="--", linewidth=1, label="balance bound")
    ax.invert_yaxis()
    ax.set_xlabel("hours")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=6, frameon=False, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def render_traces(
    traces: Mapping[str, TraceData],
    out_dir: str | os.PathLike[str],
    *,
    window: tuple[float, float] | None = None,
    cycles: int = 3,
) -> list[Path]:
    """Write ``timeline_<run>.png`` per run, ``mq_size.png`` and ``utilization.png`` into ``out_dir``.

    Args:
        traces: Run name → trace (a trace without per-step metrics still gets its timeline).
        out_dir: Output folder (created).
        window: Timeline window ``(start_s, end_s)``; default: ``cycles`` sync cycles mid-run.
        cycles: Sync cycles in the automatic timeline window.

    Returns:
        The written files.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        plot_timeline(tr, out / f"timeline_{_slug(name)}.png", title=name, window=window, cycles=cycles)
        for name, tr in traces.items()
    ]
    if any(tr.steps for tr in traces.values()):
        paths.append(plot_mq_size(traces, out / "mq_size.png"))
        paths.append(plot_utilization(traces, out / "utilization.png"))
    else:
        logger.warning("no %r events in the traces: skipping mq_size.png and utilization.png", STEP_METRICS)
    return paths
