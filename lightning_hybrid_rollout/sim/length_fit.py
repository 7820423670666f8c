"""The response-length model fitted to a run (:mod:`~lightning_hybrid_rollout.sim.calibrate`'s ``lengths.*``).

:func:`fit_lengths`: ``prompt_tokens`` from the trained prompt tokens per sample; a line (:func:`fit_line`) through
the mean trained length per cycle (or ``metrics.csv``'s per-step mean with fewer than three cycles) gives
``mean_tokens`` and ``drift_per_step``; ``sigma`` from the within-cycle spread. The model's log-normal is clipped at
one token and ``rollout.response_length``, so its ``mean_tokens`` (and ``sigma``) are chosen so that the clipped
draws have the measured mean (and spread): :func:`fit_lognormal`, on :func:`clipped_moments`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_hybrid_rollout.sim.calibration import FitLog
from lightning_hybrid_rollout.sim.run_reading import Cycle
from lightning_hybrid_rollout.sim.scenario import LengthModel
from lightning_hybrid_rollout.trace import TRAINED_PROMPT_TOKENS, TRAINED_SAMPLES, TRAINED_TOKENS, TRAINED_TOKENS_SQ

__all__ = ["clipped_moments", "fit_lengths", "fit_line", "fit_lognormal"]


def fit_lengths(
    cycles: Sequence[Cycle],
    metrics_rows: Sequence[Mapping[str, float]] | None,
    workload: Mapping[str, Any],
    rollout: Mapping[str, Any],
    base: LengthModel,
    config_name: str,
    fit: FitLog,
) -> LengthModel:
    """The length model: ``base`` with what the run measured (see the module doc); records each number in ``fit``.

    Args:
        cycles: The trace's sync cycles.
        metrics_rows: ``metrics.csv``'s rows, or None.
        workload: The fitted ``async_training`` workload (its ``trigger_parameter_sync_step``).
        rollout: The saved config's ``rollout`` section (its ``response_length``), or empty.
        base: The defaults.
        config_name: How the report names the config.
        fit: Where the fitted numbers go.
    """
    lengths = dataclasses.replace(base)
    lengths.prompt_tokens = _prompt_tokens(cycles, lengths, fit)
    points, source = _mean_points(cycles, metrics_rows, workload)
    if "response_length" in rollout:
        lengths.max_tokens = fit.add(
            "lengths.max_tokens",
            int(rollout["response_length"]),
            f"{config_name}: rollout.response_length",
            observations=1,
        )
    else:
        fit.default("lengths.max_tokens", lengths.max_tokens)
    # a fitted model clips only where the run did: at one token and at the response limit
    lengths.min_tokens = fit.default("lengths.min_tokens", 1, "a response has at least one token")
    if points:
        _fit_mean_and_spread(cycles, points, source, lengths, fit)
    else:
        fit.default("lengths.mean_tokens", lengths.mean_tokens, "no trained samples counted")
        fit.default("lengths.drift_per_step", lengths.drift_per_step)
        fit.default("lengths.sigma", lengths.sigma, "no trained samples counted")
    lengths.mean_schedule = []
    return lengths


def _prompt_tokens(cycles: Sequence[Cycle], lengths: LengthModel, fit: FitLog) -> Any:
    """``prompt_tokens``: the trained prompt tokens per trained sample."""
    with_prompts = [c for c in cycles if c.prompt_tokens is not None and c.samples > 0]
    if with_prompts:
        return fit.add(
            "lengths.prompt_tokens",
            max(0, round(sum(c.prompt_tokens or 0.0 for c in with_prompts) / sum(c.samples for c in with_prompts))),
            f"trace: {TRAINED_PROMPT_TOKENS} / {TRAINED_SAMPLES}",
            [(c.prompt_tokens or 0.0) / c.samples for c in with_prompts],
        )
    return fit.default(
        "lengths.prompt_tokens", lengths.prompt_tokens, f"the trace has no {TRAINED_PROMPT_TOKENS} counter"
    )


def _mean_points(
    cycles: Sequence[Cycle], metrics_rows: Sequence[Mapping[str, float]] | None, workload: Mapping[str, Any]
) -> tuple[list[tuple[float, float]], str]:
    """The mean trained length per version ``(version, mean)`` the line goes through, and where they came from."""
    means = [(i, c.tokens / c.samples) for i, c in enumerate(cycles) if c.samples > 0]
    points: list[tuple[float, float]] = []
    source = ""
    if len(means) >= 3:
        # a cycle trains what was admitted during it and the version before: half a version earlier on average
        points = [(i - 0.5, m) for i, m in means[1:]]
        source = (
            f"trace: {TRAINED_TOKENS} / {TRAINED_SAMPLES} per cycle (first left out; admitted half a version earlier), "
            "a line over the cycles"
        )
    elif metrics_rows:
        trigger = int(workload["trigger_parameter_sync_step"])
        for row in metrics_rows:
            if "train/response_length_mean" in row and "step" in row:
                points.append((float(int(row["step"]) // trigger), row["train/response_length_mean"]))
        source = "metrics.csv: train/response_length_mean per step, a line over the versions"
    elif means:
        points = [(float(i), m) for i, m in means]
        source = f"trace: {TRAINED_TOKENS} / {TRAINED_SAMPLES} per cycle"
    return points, source


def _spread(cycles: Sequence[Cycle]) -> tuple[float | None, list[float]]:
    """The lengths' coefficient of variation within a cycle (the variance from the squared lengths, pooled over the
    cycles; None without them) and each cycle's own."""
    with_sq = [c for c in cycles if c.tokens_sq is not None and c.samples > 1 and c.tokens > 0]
    if not with_sq:
        return None, []
    variance = sum(max(0.0, (c.tokens_sq or 0.0) - c.tokens**2 / c.samples) for c in with_sq)
    spread_cv = math.sqrt(variance / sum(c.samples for c in with_sq)) / (
        sum(c.tokens for c in with_sq) / sum(c.samples for c in with_sq)
    )
    per_cycle_cv = [
        math.sqrt(max(0.0, (c.tokens_sq or 0.0) / c.samples - (c.tokens / c.samples) ** 2)) / (c.tokens / c.samples)
        for c in with_sq
    ]
    return spread_cv, per_cycle_cv


def _fit_mean_and_spread(
    cycles: Sequence[Cycle], points: list[tuple[float, float]], source: str, lengths: LengthModel, fit: FitLog
) -> None:
    """``drift_per_step``, ``sigma`` and ``mean_tokens`` of ``lengths`` from the line through ``points``."""
    spread_cv, per_cycle_cv = _spread(cycles)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    a, b = fit_line(xs, ys) if len(set(xs)) >= 2 else (statistics.fmean(ys), 0.0)
    a = max(a, 1.0)
    if len(set(xs)) >= 2:
        residuals = [y - (a + b * x) for x, y in points]
        drift = fit.add("lengths.drift_per_step", b / a, source + " (slope / intercept)", [r / a for r in residuals])
    else:
        drift = fit.default("lengths.drift_per_step", lengths.drift_per_step, "one version only")
    # the model's mean is before its clip: choose it (and sigma, when measured) so that the clipped log-normal
    # has the measured mean (and coefficient of variation)
    lo, hi = float(lengths.min_tokens), float(lengths.max_tokens)
    if spread_cv is not None:
        unclipped, sigma = fit_lognormal(a, spread_cv * a, lo, hi)
        lengths.sigma = fit.add(
            "lengths.sigma",
            sigma,
            f"trace: {TRAINED_TOKENS_SQ}: the lengths' coefficient of variation within a cycle "
            f"({spread_cv:.3g}, pooled), as a log-normal clipped at [{lo:g}, {hi:g}]",
            per_cycle_cv,
        )
    else:
        unclipped = fit_lognormal(a, None, lo, hi, sigma=lengths.sigma)[0]
        fit.default("lengths.sigma", lengths.sigma, f"the trace has no {TRAINED_TOKENS_SQ} counter: no spread")
    clip_note = "" if math.isclose(unclipped, a, rel_tol=1e-3) else f"; {unclipped:.4g} before the clip"
    lengths.mean_tokens = fit.add(
        "lengths.mean_tokens", unclipped, source + f" (intercept at version 0: {a:.4g}{clip_note})", ys
    )
    lengths.drift_per_step = max(drift, -1.0)


#: Standard-normal quadrature nodes ``(z, weight)`` on [-6, 6] for the clipped log-normal's moments.
_NODES: list[tuple[float, float]] = []
for _i in range(240):
    _z = -6.0 + 12.0 * (_i + 0.5) / 240
    _NODES.append((_z, math.exp(-0.5 * _z * _z)))
_NODES = [(z, w / sum(w for _, w in _NODES)) for z, w in _NODES]


def clipped_moments(mean: float, sigma: float, lo: float, hi: float) -> tuple[float, float]:
    """Mean and standard deviation of ``clip(mean·exp(σz − σ²/2), lo, hi)``, ``z`` standard normal (the length
    model's draw, :class:`~lightning_hybrid_rollout.sim.scenario.LengthModel`)."""
    m = m2 = 0.0
    for z, w in _NODES:
        x = min(hi, max(lo, mean * math.exp(sigma * z - 0.5 * sigma * sigma)))
        m += w * x
        m2 += w * x * x
    return m, math.sqrt(max(0.0, m2 - m * m))


def fit_lognormal(mean: float, sd: float | None, lo: float, hi: float, sigma: float = 0.0) -> tuple[float, float]:
    """``(unclipped mean, sigma)`` of the length model whose clipped draws have ``mean`` (and ``sd``, when given;
    else ``sigma`` is kept): bisection on each (the clipped mean rises with the unclipped one, the spread with σ)."""
    if not lo < mean < hi:
        return mean, sigma if sd is None else 0.0

    def unclipped(sig: float) -> float:
        a, b = math.log(lo) - 10.0, math.log(hi) + 10.0
        for _ in range(50):
            mid = 0.5 * (a + b)
            if clipped_moments(math.exp(mid), sig, lo, hi)[0] < mean:
                a = mid
            else:
                b = mid
        return math.exp(0.5 * (a + b))

    if sd is None:
        return unclipped(sigma), sigma
    a, b = 0.0, 3.0
    for _ in range(40):
        mid = 0.5 * (a + b)
        if clipped_moments(unclipped(mid), mid, lo, hi)[1] < sd:
            a = mid
        else:
            b = mid
    sig = 0.5 * (a + b)
    return unclipped(sig), sig


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b·x``: ``(a, b)``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b
