"""What a run recorded, read for a fit (:mod:`~lightning_hybrid_rollout.sim.calibrate`): its files, its trace's cycles.

* files: the saved config (:func:`find_config`; its ``async_training`` and ``rollout`` sections found anywhere in it,
  :func:`config_sections`) and ``metrics.csv``'s numbers (:func:`read_metrics`);
* the trace: one :class:`Cycle` per sync cycle (:func:`trace_cycles`): the running totals' deltas
  (``trained_*``, ``decoded_tokens.<role>``, ``serving_s.<role>``) and the trainer's spans inside it;
  :func:`device_count` reads a track's ``devices``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.config import RUN_CONFIG_FILE
from lightning_hybrid_rollout.trace import (
    DECODED_TOKENS,
    SERVING_S,
    TRAINED_PROMPT_TOKENS,
    TRAINED_SAMPLES,
    TRAINED_TOKENS,
    TRAINED_TOKENS_SQ,
    Span,
    TraceData,
)

__all__ = ["Cycle", "config_sections", "device_count", "find_config", "read_metrics", "trace_cycles"]


def find_config(run_dir: str | os.PathLike[str]) -> Path | None:
    """The run's saved config in ``run_dir``: ``config.yaml`` (the Lightning CLI's) if there, else the callback's own
    copy (:data:`~lightning_hybrid_rollout.config.RUN_CONFIG_FILE`), else None."""
    for name in ("config.yaml", RUN_CONFIG_FILE):
        path = Path(run_dir) / name
        if path.is_file():
            return path
    return None


def config_sections(doc: Any, out: dict[str, Mapping[str, Any]]) -> None:
    """The first ``async_training`` and ``rollout`` mappings anywhere in a config document, into ``out``."""
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            if key in ("async_training", "rollout") and isinstance(value, Mapping) and key not in out:
                out[key] = value
            else:
                config_sections(value, out)
    elif isinstance(doc, list):
        for item in doc:
            config_sections(item, out)


def read_metrics(path: Path) -> list[dict[str, float]]:
    """``metrics.csv``'s rows, the numbers only."""
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            parsed = {}
            for k, v in row.items():
                try:
                    parsed[k] = float(v)
                except (TypeError, ValueError):
                    continue
            rows.append(parsed)
    return rows


@dataclass
class Cycle:
    """One sync cycle's deltas of the running totals and its trainer spans."""

    start: float
    end: float
    samples: float
    tokens: float
    decoded: dict[str, float]
    serving: dict[str, float]
    train_s: float = 0.0
    train_spans: int = 0
    tokens_sq: float | None = None  # squared response lengths summed (the runtime's TRAINED_TOKENS_SQ)
    prompt_tokens: float | None = None  # their prompt tokens (TRAINED_PROMPT_TOKENS)
    untraced_s: float = 0.0  # the trainer's time in the cycle outside its spans (Lightning's loop, bookkeeping)


def _totals_at(trace: TraceData) -> tuple[list[float], dict[str, list[float]]]:
    """Cycle-end times (the ``trained_samples`` samples) and each running total's value at each."""
    ends = [c.t for c in trace.counter_series(TRAINED_SAMPLES)]
    names = {c.name for c in trace.counters}
    names = {
        n
        for n in names
        if n in (TRAINED_SAMPLES, TRAINED_TOKENS, TRAINED_TOKENS_SQ, TRAINED_PROMPT_TOKENS)
        or n.startswith((f"{DECODED_TOKENS}.", f"{SERVING_S}."))
    }
    values: dict[str, list[float]] = {}
    for n in names:
        series = trace.counter_series(n)
        out = []
        for t in ends:
            v = 0.0
            for c in series:
                if c.t <= t + 1e-9:
                    v = c.value
            out.append(v)
        values[n] = out
    return ends, values


def trace_cycles(trace: TraceData, spans: list[Span]) -> list[Cycle]:
    """The trace's sync cycles (one per ``trained_samples`` sample), the first from the trainer's first span;
    ``spans``: the trainer track's."""
    ends, values = _totals_at(trace)
    start = spans[0].start_s if spans else 0.0
    out = []
    for i, t in enumerate(ends):

        def delta(name: str, i: int = i) -> float:
            v = values.get(name)
            if v is None:
                return 0.0
            return v[i] - (v[i - 1] if i else 0.0)

        roles = ("standalone", "hybrid")
        c = Cycle(
            start,
            t,
            delta(TRAINED_SAMPLES),
            delta(TRAINED_TOKENS),
            {r: delta(f"{DECODED_TOKENS}.{r}") for r in roles},
            {r: delta(f"{SERVING_S}.{r}") for r in roles},
        )
        if TRAINED_TOKENS_SQ in values:
            c.tokens_sq = delta(TRAINED_TOKENS_SQ)
        if TRAINED_PROMPT_TOKENS in values:
            c.prompt_tokens = delta(TRAINED_PROMPT_TOKENS)
        _add_trainer_spans(c, spans)
        out.append(c)
        start = t
    return out


def _add_trainer_spans(c: Cycle, spans: list[Span]) -> None:
    """The cycle's training spans (those ending inside it) and the trainer's time in it outside every span."""
    start, t = c.start, c.end
    covered = 0.0
    for s in spans:
        if s.name == "training" and start - 1e-9 <= s.end_s <= t + 1e-9:
            c.train_s += s.end_s - s.start_s
            c.train_spans += 1
        covered += max(0.0, min(s.end_s, t) - max(s.start_s, start))
    c.untraced_s = max(0.0, (t - start) - covered)


def device_count(devices: Any) -> int:
    """A track's ``devices``: a count, or a list of device ids."""
    if isinstance(devices, (int, float)) and not isinstance(devices, bool):
        return int(devices)
    return len(devices or ())
