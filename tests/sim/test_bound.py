"""The simulator's balance bound: the per-sample (knapsack) form, its one-ratio special case, and its validity."""

from __future__ import annotations

import random

import pytest

from lightning_hybrid_rollout.sim import get_preset, simulate
from lightning_hybrid_rollout.sim.bound import (
    balance_term_from_pieces,
    bound_from_pieces,
    bound_from_terms,
    bound_pieces,
    bound_terms,
)
from lightning_hybrid_rollout.sim.results import GAP_KEYS
from lightning_hybrid_rollout.sim.runner import _Run

from .conftest import tiny_scenario


def _feasible(T: float, S: float, W: float, pieces: list[tuple[float, float]], t: float) -> bool:
    """Independent check: can ``t`` seconds serve the work? (greedy hybrid time to the best ratio first)."""
    hybrid = T * t - W
    if hybrid < 0:
        return False
    removed = 0.0
    for rho, g in sorted(pieces, reverse=True):
        if hybrid <= 0 or rho <= 0:
            break
        h = min(hybrid, g / rho)
        removed += rho * h
        hybrid -= h
    return S * t + removed >= sum(g for _, g in pieces) - 1e-9


def test_one_ratio_is_the_one_formula_bound():
    rng = random.Random(0)
    for _ in range(500):
        T, S = rng.choice([1, 2, 16]), rng.choice([0, 1, 8, 24])
        W, G, rho = rng.uniform(0, 100), rng.uniform(0, 300), rng.uniform(0.05, 1.5)
        assert bound_from_pieces(T, S, W, [(rho, G)]) == pytest.approx(bound_from_terms(T, S, W, G, rho), rel=1e-12)


def test_the_bound_is_the_least_feasible_time_of_the_knapsack():
    rng = random.Random(1)
    for _ in range(500):
        T, S = rng.choice([1, 2, 16]), rng.choice([0, 1, 8])
        W = rng.uniform(0, 50)
        pieces = [(rng.uniform(0.05 if S == 0 else 0.0, 1.2), rng.uniform(0, 80)) for _ in range(rng.randint(1, 6))]
        t = bound_from_pieces(T, S, W, pieces)
        assert _feasible(T, S, W, pieces, t * (1 + 1e-9) + 1e-9)
        assert t <= W / T + 1e-9 or not _feasible(T, S, W, pieces, t * (1 - 1e-6))


def test_slower_samples_on_hybrid_replicas_raise_the_bound_above_the_best_ratio_formula():
    # one ratio 1.0 would give (80 + 10) / 2 = 45; 60 of the 80 device-seconds run at a quarter speed on hybrid
    pieces = [(1.0, 20.0), (0.25, 60.0)]
    assert bound_from_terms(1, 1, 10.0, 80.0, 1.0) == 45.0
    assert bound_from_pieces(1, 1, 10.0, pieces) == pytest.approx(54.0)
    assert balance_term_from_pieces(4, 0, 1.0, [(1.0, 2.0)]) == pytest.approx(0.75)  # colocated: (W + G/rho) / T


def test_no_generating_device_is_refused():
    with pytest.raises(ValueError, match="no standalone device"):
        bound_from_pieces(1, 0, 1.0, [(0.0, 5.0)])
    with pytest.raises(ValueError, match="train_devices > 0"):
        bound_from_pieces(0, 1, 1.0, [(1.0, 5.0)])


def test_a_kv_limited_hybrid_replica_gets_a_ratio_per_sample_and_the_gap_counts_it():
    # hybrid replicas with a small KV cache and lengths drifting up: later (longer) samples run slower on them
    sc = tiny_scenario(
        steps=8,
        lengths={"mean_tokens": 200, "sigma": 0.3, "max_tokens": 4000, "prompt_tokens": 20, "drift_per_step": 0.3},
        hybrid_replica={"devices": 1, "tokens_per_s": 40.0, "batch_slowdown": 0.05, "kv_cache_tokens": 900},
    )
    r = _Run(sc, sc.run("dynamic_rate_matched"), None)  # kept: the result does not carry the trained samples
    run = r.execute()
    pieces = bound_pieces(sc, r.trained, dict(r.world.progress_at))
    gen, rho = bound_terms(sc, r.trained, dict(r.world.progress_at))
    assert len(pieces) > 1 and max(p for p, _ in pieces) == pytest.approx(rho)
    assert sum(g for _, g in pieces) == pytest.approx(gen)
    assert run.gap_s["hybrid_ratio_below_rho_unavoidable"] > 0
    T, S = run.train_devices, run.rollout_devices
    w = run.breakdown_s["training_compute"] * T
    assert run.work_bound_s > bound_from_terms(T, S, w, gen, rho) * (1 + 1e-6)  # tighter than the one-ratio formula
    parts = sum(run.gap_s[k] for k in GAP_KEYS)
    assert parts == pytest.approx(run.gap_s["total"], rel=1e-6)
    assert run.time_s >= run.work_bound_s


def test_the_best_seed_run_reaches_0_97_of_its_bound_and_beats_the_verl_v1_rule():
    result = simulate(get_preset("verl_32_devices"))
    best = max((r for r in result.runs if r.hybrid), key=lambda r: r.efficiency)
    assert best.efficiency >= 0.97, (best.name, best.efficiency)  # measured: 0.9708 (..._staged_keep)
    assert best.time_s < result.run("dynamic_hysteresis_ratio").time_s
