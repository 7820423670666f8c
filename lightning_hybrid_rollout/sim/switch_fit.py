"""The switch costs fitted to a run (:mod:`~lightning_hybrid_rollout.sim.calibrate`'s ``switch.*``).

:func:`fit_switch`: the trainer's ``weight_sync`` spans (``standalone_sync_s``; ``hybrid_sync_s`` when it has its
own), its ``switching`` spans by ``args.op`` (the simulator's one per pool method, :data:`OP_COSTS`), or, for the
runtime's one ``activate`` / ``deactivate`` span, split by the hybrid replica's own spans inside it (wake until its
``syncing`` span, the hybrid sync, ``add`` + ``resume`` after; remove + abort until its ``switching`` span, sleep
after); ``standalone_commit_s``: the standalone replicas' ``syncing`` spans of a staged sync. A cost the run never
paid is its default scaled as the measured ``standalone_sync_s`` is (the defaults' proportions at this run's speed:
an assumption). :func:`fit_offload_info`: the offload / onload seconds inside ``wake_s`` / ``sleep_s`` (shown only).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from lightning_hybrid_rollout.sim.calibration import FitLog
from lightning_hybrid_rollout.sim.scenario import SwitchCosts
from lightning_hybrid_rollout.trace import TRAINER_TRACK, Span, TraceData

__all__ = ["OP_COSTS", "fit_offload_info", "fit_switch"]

#: The simulator's pool methods (its trainer spans' ``args.op``) and the switch cost each one charges.
OP_COSTS: dict[str, str] = {
    "wake_up_replicas": "wake_s",
    "sync_weights": "hybrid_sync_s",
    "add_replicas": "add_s",
    "resume_generation_replicas": "resume_s",
    "remove_replicas": "remove_s",
    "abort_replicas": "abort_s",
    "sleep_replicas": "sleep_s",
    "rebalance_requests": "rebalance_s",
}


def fit_switch(
    trace: TraceData,
    spans: list[Span],
    base: SwitchCosts,
    fit: FitLog,
    staged: bool,
) -> SwitchCosts:
    """The switch costs from the trainer's spans (by op), or the runtime's activate/deactivate split by the hybrid
    replica's spans; see the module doc. ``spans``: the trainer track's; ``staged``: the run staged its standalone
    sync (its commit is measured)."""
    seen: dict[str, list[float]] = {f.name: [] for f in dataclasses.fields(SwitchCosts)}
    where: dict[str, str] = {}
    _trainer_ops(spans, seen, where)
    _runtime_switches(trace, spans, seen, where)
    if staged:
        for t, info in trace.tracks.items():
            if t.startswith("replica/") and info.get("kind") == "standalone":
                commits = [r.end_s - r.start_s for r in trace.spans_of(t) if r.name == "syncing"]
                seen["standalone_commit_s"] += commits
                where["standalone_commit_s"] = "trace: the standalone replicas' syncing spans (staged sync's commit)"
    values = {}
    # what the run never did costs the default scaled by the one sync it did measure (the standalone weight sync):
    # the defaults' proportions, at this run's speed
    sync = seen["standalone_sync_s"]
    scale = statistics.fmean(sync) / base.standalone_sync_s if sync and base.standalone_sync_s > 0 else None
    for f in dataclasses.fields(SwitchCosts):
        obs = seen[f.name]
        if obs:
            values[f.name] = fit.add(f"switch.{f.name}", statistics.fmean(obs), where[f.name] + ", mean", obs)
        elif scale is not None and f.name != "resume_prefill_ratio":
            values[f.name] = fit.default(
                f"switch.{f.name}",
                getattr(base, f.name) * scale,
                f"{getattr(base, f.name):g} s x {scale:.4g}: the default scaled as the measured standalone_sync_s is",
            )
        else:
            values[f.name] = fit.default(f"switch.{f.name}", getattr(base, f.name))
    values["standalone_commit_s"] = (
        min(values["standalone_commit_s"], values["standalone_sync_s"]) if staged else values["standalone_commit_s"]
    )
    return SwitchCosts(**values)


def _trainer_ops(spans: list[Span], seen: dict[str, list[float]], where: dict[str, str]) -> None:
    """The trainer's ``weight_sync`` spans and its ``switching`` spans of one pool method (the simulator's)."""
    for s in spans:
        seconds = s.end_s - s.start_s
        if s.name == "weight_sync":
            key = "hybrid_sync_s" if s.args.get("target") == "hybrid" else "standalone_sync_s"
            seen[key].append(seconds)
            where[key] = f"trace: {TRAINER_TRACK} weight_sync spans (target {s.args.get('target', 'standalone')})"
        elif s.name == "switching" and s.args.get("op") in OP_COSTS:
            key = OP_COSTS[str(s.args["op"])]
            seen[key].append(seconds)
            where[key] = f"trace: {TRAINER_TRACK} switching spans (op {s.args['op']})"


def _runtime_switches(trace: TraceData, spans: list[Span], seen: dict[str, list[float]], where: dict[str, str]) -> None:
    """The runtime's ``activate`` / ``deactivate`` spans, split at the hybrid replica's own spans inside them."""
    hybrid_tracks = [t for t, info in trace.tracks.items() if t.startswith("replica/") and info.get("kind") == "hybrid"]
    replica_spans = trace.spans_of(hybrid_tracks[0]) if hybrid_tracks else []
    for s in spans:
        if s.name != "switching" or s.args.get("op") not in ("activate", "deactivate"):
            continue
        inside = [r for r in replica_spans if s.start_s - 1e-6 <= r.start_s and r.end_s <= s.end_s + 1e-6]
        if s.args["op"] == "activate":
            sync = next((r for r in inside if r.name == "syncing"), None)
            if sync is None:
                continue
            seen["wake_s"].append(sync.start_s - s.start_s)
            seen["hybrid_sync_s"].append(sync.end_s - sync.start_s)
            half = (s.end_s - sync.end_s) / 2
            seen["add_s"].append(half)
            seen["resume_s"].append(half)
            split = "trace: activate spans split at the hybrid replica's syncing span"
            for key in ("wake_s", "hybrid_sync_s"):
                where[key] = split
            for key in ("add_s", "resume_s"):
                where[key] = split + " (after it, halved between add and resume)"
        else:
            sleep = next((r for r in inside if r.name == "switching"), None)
            if sleep is None:
                continue
            seen["sleep_s"].append(s.end_s - sleep.start_s)
            half = (sleep.start_s - s.start_s) / 2
            seen["remove_s"].append(half)
            seen["abort_s"].append(half)
            split = "trace: deactivate spans split at the hybrid replica's switching span"
            where["sleep_s"] = split
            for key in ("remove_s", "abort_s"):
                where[key] = split + " (before it, halved between remove and abort)"


def fit_offload_info(trace: TraceData, metrics_rows: Sequence[Mapping[str, float]] | None, fit: FitLog) -> None:
    """``info.offload_s`` / ``info.onload_s``: the mean offload / onload per cycle (the trace's step series, else
    ``metrics.csv``'s), inside ``wake_s`` / ``sleep_s``; not scenario numbers."""
    for metric, label in (("dynamic_resource/offload_s", "offload_s"), ("dynamic_resource/onload_s", "onload_s")):
        _, values = trace.step_series(metric)
        if not values and metrics_rows:
            values = [r[metric] for r in metrics_rows if metric in r]
        values = [v for v in values if v > 0]
        if values:
            fit.add(f"info.{label}", statistics.fmean(values), f"{metric} per cycle (inside wake_s / sleep_s)", values)
