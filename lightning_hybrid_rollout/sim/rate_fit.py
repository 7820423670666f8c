"""The replicas' decode rates fitted to a run (:mod:`~lightning_hybrid_rollout.sim.calibrate`'s ``replica.*`` and
``hybrid_replica.*``): per-role throughput from the running totals, and ``replica.speed_while_training`` from the
``generated_tokens.<replica>`` counters (docs/simulator.md, "Calibrating from a real run").
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.sim.calibration import FitLog
from lightning_hybrid_rollout.sim.run_reading import Cycle, device_count
from lightning_hybrid_rollout.sim.scenario import ReplicaModel
from lightning_hybrid_rollout.trace import (
    DECODED_TOKENS,
    GENERATED_TOKENS,
    IN_FLIGHT,
    SERVING_S,
    TRAINER_TRACK,
    TraceData,
)

__all__ = ["DecodeRates", "fit_decode_rates", "occupancy"]


@dataclass(frozen=True)
class DecodeRates:
    """The fitted replica models.

    Args:
        standalone: The standalone replicas' model (the hybrid replicas' when the run had no standalone one).
        hybrid: The hybrid replicas' model, or None without hybrid replicas.
        hybrid_assumed: The ``hybrid_speed_ratio`` the hybrid rate was assumed with (None: measured, or no hybrid).
    """

    standalone: ReplicaModel
    hybrid: ReplicaModel | None
    hybrid_assumed: float | None


@dataclass(frozen=True)
class _Role:
    """One role's replicas as the fit sees them."""

    kind: str  # "standalone" or "hybrid"
    section: str  # the scenario's section: "replica" or "hybrid_replica"
    infos: list[dict[str, Any]]  # the role's replica tracks' descriptions
    template: ReplicaModel  # its defaults


def fit_decode_rates(
    trace: TraceData,
    cycles: Sequence[Cycle],
    kinds: Mapping[str, list[dict[str, Any]]],
    cap: int,
    base_standalone: ReplicaModel,
    base_hybrid: ReplicaModel,
    window: tuple[float, float],
    hybrid_speed_ratio: float,
    fit: FitLog,
) -> DecodeRates:
    """Each role's replica model (devices, ``tokens_per_s``; ``batch_slowdown`` and ``kv_cache_tokens`` kept from
    the ``base_*`` models); see the module doc. ``kinds``: the replica tracks' descriptions by kind; ``window``: the
    counted time (the trainer's first span to the last cycle's end)."""
    models: dict[str, ReplicaModel] = {}
    hybrid_assumed: float | None = None
    standalone_mix = 1.0
    for kind, template in (("standalone", base_standalone), ("hybrid", base_hybrid)):
        infos = kinds[kind]
        if not infos:
            continue
        role = _Role(kind, "replica" if kind == "standalone" else "hybrid_replica", infos, template)
        devices = device_count(infos[0].get("devices")) or template.devices
        if len({device_count(i.get("devices")) for i in infos}) > 1:
            fit.notes.append(
                f"the {kind} replicas have different device counts; the model uses the first's ({devices})"
            )
        fit.add(f"{role.section}.devices", devices, f"trace: replica/{kind}_* tracks' devices", observations=len(infos))
        beta = fit.default(f"{role.section}.batch_slowdown", template.batch_slowdown)
        speed_factor, mix = template.speed_while_training, 1.0
        if kind == "standalone":
            speed_factor = _fit_speed_while_training(trace, role, window, template, beta, fit)
            mix = _average_over_outside(trace, role, window, speed_factor, fit)
        v = _measured_rate(trace, cycles, role, cap, beta, window, fit, mix)
        if v is None and kind == "hybrid" and "standalone" in models:
            v = hybrid_speed_ratio * models["standalone"].tokens_per_s * standalone_mix
            hybrid_assumed = hybrid_speed_ratio
            fit.default(
                f"{role.section}.tokens_per_s",
                v,
                f"the hybrid replicas never served: hybrid_speed_ratio {hybrid_speed_ratio:g} x the standalone "
                "replicas' average rate (replica.tokens_per_s x info.standalone_average_over_outside_training), "
                "assumed (calibrate(hybrid_speed_ratio=...) overrides)",
            )
        elif v is None:
            v = fit.default(f"{role.section}.tokens_per_s", template.tokens_per_s, f"the {kind} replicas never served")
        models[kind] = ReplicaModel(
            devices=devices,
            tokens_per_s=v,
            batch_slowdown=beta,
            concurrency=None,
            kv_cache_tokens=_kv_cache_tokens(role, fit),
            speed_while_training=speed_factor,
        )
        if kind == "standalone":
            standalone_mix = mix
    return DecodeRates(models.get("standalone") or models["hybrid"], models.get("hybrid"), hybrid_assumed)


def _kv_cache_tokens(role: _Role, fit: FitLog) -> float | None:
    """The role's KV-cache capacity in tokens: the smallest its replica tracks describe (the runtime writes each
    engine's blocks x block size), else the template's (default, not measured)."""
    known = [float(i["kv_cache_tokens"]) for i in role.infos if i.get("kv_cache_tokens")]
    if not known:
        return fit.default(f"{role.section}.kv_cache_tokens", role.template.kv_cache_tokens)
    return fit.add(
        f"{role.section}.kv_cache_tokens",
        min(known),
        f"trace: replica/{role.kind}_* tracks' kv_cache_tokens (the engine's KV-cache blocks x block size; the "
        "smallest replica's)",
        values=known,
    )


def _measured_rate(
    trace: TraceData,
    cycles: Sequence[Cycle],
    role: _Role,
    cap: int,
    beta: float,
    window: tuple[float, float],
    fit: FitLog,
    mix: float = 1.0,
) -> float | None:
    """The role's ``tokens_per_s`` from its running totals (recorded in ``fit`` with its throughput and mean
    concurrency), or None when its replicas never served. ``mix``: the totals' average speed over the speed outside
    the trainer's ``training`` spans (``1 − f + r·f``, see the module doc); the rate returned is the latter."""
    kind, section, n = role.kind, role.section, len(role.infos)
    per_cycle = [c.decoded[kind] / c.serving[kind] / n for c in cycles if c.serving[kind] > 0 and c.decoded[kind] > 0]
    tokens = sum(c.decoded[kind] for c in cycles)
    serving = sum(c.serving[kind] for c in cycles)
    if not (per_cycle and serving > 0):
        return None
    x = tokens / serving / n
    outside = "" if mix == 1.0 else f", over {mix:.4g} (the speed outside the training spans)"
    tokens /= mix
    fit.add(
        f"info.{kind}_tokens_per_s_per_replica",
        x,
        f"trace: {DECODED_TOKENS}.{kind} / {SERVING_S}.{kind} / {n} replica(s), per cycle",
        per_cycle,
    )
    occupied = occupancy(trace, kind, cap, beta, window)
    if occupied is not None:
        mean_g, mean_m = occupied
        weighted_s = serving * n * mean_g  # the replicas' serving seconds x g at their load
        fit.add(
            f"info.{kind}_mean_concurrency",
            mean_m,
            f"trace: {IN_FLIGHT} / active replicas, at most cap {cap}",
            observations=1,
        )
        return fit.add(
            f"{section}.tokens_per_s",
            tokens / weighted_s,
            f"trace: {DECODED_TOKENS}.{kind} / ({SERVING_S}.{kind} x replicas x the mean m/(1+b(m-1)) over "
            f"their active spans), m from {IN_FLIGHT} (batch_slowdown {beta:g}){outside}",
            [p * tokens / weighted_s / x for p in per_cycle],
        )
    scale = cap / (1.0 + beta * (cap - 1)) * mix  # X(cap) / tokens_per_s
    return fit.add(
        f"{section}.tokens_per_s",
        x / scale,
        f"trace: that throughput / {scale:.4g} (the model's X(cap)/v at cap {cap}, "
        f"batch_slowdown {beta:g}; "
        f"no {IN_FLIGHT} counter: replicas assumed full{outside})",
        [p / scale for p in per_cycle],
    )


def _fit_speed_while_training(
    trace: TraceData, role: _Role, window: tuple[float, float], template: ReplicaModel, beta: float, fit: FitLog
) -> float:
    """``replica.speed_while_training`` from the standalone replicas' ``generated_tokens`` / ``in_flight`` counters
    (see the module doc); the template's value without them."""
    lo, hi = window
    in_training = _coverage(trace, TRAINER_TRACK, "training")
    name = f"{role.section}.speed_while_training"
    inside: list[tuple[float, float]] = []  # (tokens, served seconds x g(m)) of each stretch inside a training span
    outside: list[tuple[float, float]] = []
    tracks = 0
    for track, info in trace.tracks.items():
        if not track.startswith("replica/") or info.get("kind") != role.kind:
            continue
        replica = track.removeprefix("replica/")
        series = [c for c in trace.counter_series(f"{GENERATED_TOKENS}.{replica}") if lo <= c.t <= hi]
        if len(series) < 4:
            continue
        tracks += 1
        cap = float(info.get("concurrency") or 0)
        loads = {round(c.t, 6): c.value for c in trace.counter_series(f"{IN_FLIGHT}.{replica}")}
        in_active = _coverage(trace, track, "active")
        for a, b in itertools.pairwise(series):
            served = in_active(b.t) - in_active(a.t)
            if served <= 0 or b.value < a.value:
                continue
            ends = [loads.get(round(c.t, 6)) for c in (a, b)]
            g = 1.0
            if cap > 0 and None not in ends:
                m = [min(cap, float(x)) for x in ends if x is not None]
                if min(m) < 0.5 * cap:  # short of work (a full queue, the staleness budget): not a slow replica
                    continue
                g = sum(x / (1.0 + beta * (x - 1.0)) for x in m) / 2.0
            share = (in_training(b.t) - in_training(a.t)) / (b.t - a.t)
            if share >= 0.8:
                inside.append((b.value - a.value, served * g))
            elif share <= 0.2:
                outside.append((b.value - a.value, served * g))
    tok_in, s_in = (sum(x) for x in zip(*inside, strict=True)) if inside else (0.0, 0.0)
    tok_out, s_out = (sum(x) for x in zip(*outside, strict=True)) if outside else (0.0, 0.0)
    if not (tracks and len(inside) >= 2 and s_in > 0 and tok_in > 0 and s_out > 0 and tok_out > 0):
        why = (
            f"no {GENERATED_TOKENS}.<replica> counters in the trace"
            if not tracks
            else "too few stretches of the replicas' counters with them full, inside and outside training spans"
        )
        fit.default(name, template.speed_while_training, why)
        return template.speed_while_training
    rate_out = tok_out / s_out
    ratio = tok_in / s_in / rate_out
    fit.add(
        name,
        ratio,
        f"trace: {GENERATED_TOKENS}.<replica> counters of {tracks} {role.kind} replica(s), read at the training "
        f"spans' boundaries: tokens per served second x g(m) inside those spans over the same outside them "
        f"({len(inside)} and {len(outside)} stretches with the replica at least half full, m from "
        f"{IN_FLIGHT}.<replica>)",
        [t / s / rate_out for t, s in inside if s > 0],
    )
    return ratio


def _average_over_outside(
    trace: TraceData, role: _Role, window: tuple[float, float], speed_factor: float, fit: FitLog
) -> float:
    """``1 − f + r·f``: the role's average speed over its speed outside the trainer's ``training`` spans, ``f`` the
    share of its replicas' ``active`` time inside those spans (in ``window``), ``r`` = ``speed_factor``."""
    lo, hi = window
    in_training = _coverage(trace, TRAINER_TRACK, "training")
    inside = total = 0.0
    for track, info in trace.tracks.items():
        if track.startswith("replica/") and info.get("kind") == role.kind:
            for s in trace.spans_of(track):
                a, b = max(s.start_s, lo), min(s.end_s, hi)
                if s.name == "active" and b > a:
                    total += b - a
                    inside += in_training(b) - in_training(a)
    share = inside / total if total > 0 else 0.0
    mix = 1.0 - share + speed_factor * share
    if speed_factor != 1.0:
        fit.add(
            f"info.{role.kind}_average_over_outside_training",
            mix,
            f"1 - f + r x f: f = {share:.3f} of the {role.kind} replicas' active time inside the trainer's training "
            f"spans, r = {role.section}.speed_while_training",
            observations=1,
        )
    return mix


def _coverage(trace: TraceData, track: str, name: str) -> Callable[[float], float]:
    """``t -> seconds before t`` inside ``track``'s spans called ``name`` (one track's spans do not overlap), so a
    stretch's overlap is a difference of two lookups (prefix sums, bisection)."""
    spans = [(s.start_s, s.end_s) for s in trace.spans_of(track) if s.name == name]
    starts = [a for a, _ in spans]
    before = [0.0, *itertools.accumulate(b - a for a, b in spans)]

    def covered(t: float) -> float:
        i = bisect.bisect_right(starts, t)
        if i == 0:
            return 0.0
        a, b = spans[i - 1]
        return before[i - 1] + min(t, b) - a

    return covered


def occupancy(
    trace: TraceData, kind: str, cap: int, beta: float, window: tuple[float, float]
) -> tuple[float, float] | None:
    """``(mean g(m), mean m)`` over the ``active`` spans of ``kind``'s replicas inside ``window`` (the counted
    cycles: the running totals count from the trainer's first span to the last cycle's end), ``g(m) = m / (1 +
    β(m − 1))`` (the model's throughput over ``tokens_per_s``) and ``m = min(cap, in_flight / active replicas)``; the
    ``in_flight`` counter holds its first value before its first sample (the runtime samples it at cycle ends only).
    None without an ``in_flight`` counter or active time in the window."""
    series = trace.counter_series(IN_FLIGHT)
    if not series:
        return None
    lo, hi = window
    active: list[tuple[str, float, float]] = []
    for track, info in trace.tracks.items():
        if track.startswith("replica/") and info.get("kind") in ("standalone", "hybrid"):
            for s in trace.spans_of(track):
                a, b = max(s.start_s, lo), min(s.end_s, hi)
                if s.name == "active" and b > a:
                    active.append((str(info["kind"]), a, b))
    points = sorted({lo, hi} | {c.t for c in series if lo < c.t < hi} | {t for _, a, b in active for t in (a, b)})
    total = weighted = occupied = 0.0
    j, value = 0, series[0].value
    for t0, t1 in itertools.pairwise(points):
        while j < len(series) and series[j].t <= t0 + 1e-12:
            value = series[j].value
            j += 1
        mid = 0.5 * (t0 + t1)
        on = [k for k, a, b in active if a <= mid < b]
        mine = sum(1 for k in on if k == kind)
        if not mine:
            continue
        m = min(float(cap), value / len(on))
        g = m / (1.0 + beta * (m - 1.0)) if m > 0 else 0.0
        weighted += mine * g * (t1 - t0)
        occupied += mine * m * (t1 - t0)
        total += mine * (t1 - t0)
    if total <= 0 or weighted <= 0:
        return None
    return weighted / total, occupied / total
