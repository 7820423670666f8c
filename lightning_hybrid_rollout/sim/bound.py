"""A simulated run's balance bound: its work on its devices with perfect balance and free switching."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from lightning_hybrid_rollout.sim.scenario import ReplicaModel, RunSpec, Scenario
from lightning_hybrid_rollout.sim.world import SimSample

__all__ = [
    "balance_bound",
    "balance_term_from_pieces",
    "bound_from_pieces",
    "bound_from_terms",
    "bound_pieces",
    "bound_terms",
    "peak_tokens_per_device_s",
]


def peak_tokens_per_device_s(scenario: Scenario, model: ReplicaModel, version: float) -> float:
    """Best decode tokens/s per device a replica of ``model`` reaches at ``version`` (its KV limit then, at its
    :attr:`~lightning_hybrid_rollout.sim.scenario.ReplicaModel.best_speed`)."""
    limit = model.run_limit(scenario.cap_of(model), scenario.context_at(version))
    return model.throughput(limit, limit) * model.best_speed / model.devices


def balance_bound(
    scenario: Scenario,
    run: RunSpec,
    samples: Iterable[SimSample],
    train_device_s: float,
    progress_at: dict[int, float] | None = None,
) -> float:
    """The run's balance bound: its work on its devices with perfect balance and free switching.

    Generation work is counted in standalone device-seconds: sample ``i`` needs ``g_i = length_i / s_i`` with
    ``s_i`` the best standalone rate per device (tokens/s) over the versions it was decoded in (the KV limit follows
    the drifting mean length), or ``g_i / ρ_i`` trainer device-seconds on a hybrid replica, ``ρ_i`` its own best
    hybrid/standalone ratio over the same versions (``h_i / s_i``). Trainer devices train ``W`` device-seconds in all
    and may generate the rest of the time. The least time ``t`` with ``S·t`` standalone device-seconds and
    ``T·t − W`` hybrid ones for all of ``G = Σ g_i`` is a fractional knapsack: hybrid time goes to the samples with
    the best ratio first (:func:`bound_from_pieces`). With one ratio for every sample this is
    ``max(W/T, (G + ρ·W) / (S + ρ·T))`` (:func:`bound_from_terms`, the issue's ``(G + W) / (T + S)`` when ``ρ = 1``);
    with hybrid replicas KV-limited on long responses (``ρ_i`` smaller for later samples) it is tighter than that
    formula with the best ratio. ``progress_at`` maps a param version to the training progress the length model
    followed then (default: the version itself, see ``RunSpec.early_first_sync``).
    """
    pieces = bound_pieces(scenario, samples, progress_at)
    return bound_from_pieces(run.train_devices, run.rollout_devices, train_device_s, pieces)


def bound_from_terms(
    train_devices: float, rollout_devices: float, train_device_s: float, generation_device_s: float, rho: float = 1.0
) -> float:
    """The balance bound from its terms: ``max(W/T, (G + ρ·W) / (S + ρ·T))``, in seconds.

    The one formula of the bound, for a simulated run (:func:`balance_bound`) and a real one
    (:mod:`lightning_hybrid_rollout.analysis.run_bound`, ``lhr report``): they differ only in how the terms are
    measured.

    Args:
        train_devices: ``T``, the trainer's devices (> 0; hybrid replicas generate on them).
        rollout_devices: ``S``, the standalone replicas' devices (0: colocated).
        train_device_s: ``W``, training compute in device-seconds (wall seconds of training × ``T``).
        generation_device_s: ``G``, the trained samples' tokens in standalone device-seconds (tokens / the
            standalone rate per device).
        rho: ``ρ``, a trainer device's decode rate as a share of a standalone device's (hybrid / standalone per device).

    Example::

        >>> bound_from_terms(1, 1, 27.8, 85.0)  # (85 + 27.8) / 2
        56.4
    """
    T, S = float(train_devices), float(rollout_devices)
    if T <= 0 or S < 0 or rho < 0 or (S + rho * T) <= 0:
        raise ValueError(
            f"the balance bound needs train_devices > 0, rollout_devices >= 0, rho >= 0 and some device that "
            f"generates; got T={train_devices}, S={rollout_devices}, rho={rho}"
        )
    if train_device_s < 0 or generation_device_s < 0:
        raise ValueError(f"work must be >= 0, got W={train_device_s}, G={generation_device_s}")
    return max(train_device_s / T, (generation_device_s + rho * train_device_s) / (S + rho * T))


def bound_terms(
    scenario: Scenario, samples: Iterable[SimSample], progress_at: dict[int, float] | None = None
) -> tuple[float, float]:
    """``(G, ρ)`` of the one-ratio bound: all the work, and the best hybrid/standalone ratio of the run's versions.

    The simulator's gap accounting (``lhr simulate --gap``) counts capacity at this ``ρ``.
    """
    progress = progress_at or {v: float(v) for v in range(scenario.steps + 1)}
    rate = _rates(scenario, progress_at)
    gen = 0.0
    for smp in samples:
        last = smp.max_version if smp.max_version is not None else max(progress)
        gen += smp.length / max(rate("s", smp.admitted_version), rate("s", last))
    rho = max(rate("h", v) / rate("s", v) for v in progress)
    return gen, rho


def _rates(scenario: Scenario, progress_at: dict[int, float] | None) -> Callable[[str, int], float]:
    """``rate(kind, version)``: the peak tokens/s per device of a standalone (``"s"``) or hybrid (``"h"``) replica."""
    rates: dict[tuple[str, int], float] = {}

    def rate(kind: str, v: int) -> float:
        key = (kind, v)
        if key not in rates:
            model = scenario.replica if kind == "s" else scenario.hybrid_model
            version = progress_at.get(v, float(v)) if progress_at else float(v)
            rates[key] = peak_tokens_per_device_s(scenario, model, version)
        return rates[key]

    return rate


def _check(T: float, S: float, W: float) -> None:
    if T <= 0 or S < 0:
        raise ValueError(f"the balance bound needs train_devices > 0 and rollout_devices >= 0; got T={T}, S={S}")
    if W < 0:
        raise ValueError(f"work must be >= 0, got W={W}")


def balance_term_from_pieces(
    train_devices: float, rollout_devices: float, train_device_s: float, pieces: Sequence[tuple[float, float]]
) -> float:
    """The least ``t`` with ``S·t + R(T·t − W) >= G``: the balance term of :func:`bound_from_pieces`, in seconds.

    ``R(H)``: the standalone device-seconds that ``H`` hybrid device-seconds take off the standalone replicas when
    they serve the best-ratio work first (concave, piecewise linear). May be below ``W/T`` (the trainer's own term).
    """
    T, S, W = float(train_devices), float(rollout_devices), float(train_device_s)
    _check(T, S, W)
    items = sorted(((float(r), float(g)) for r, g in pieces if g > 0), key=lambda p: -p[0])
    if any(r < 0 or g < 0 for r, g in items):
        raise ValueError(f"pieces need rho >= 0 and G >= 0, got {pieces!r}")
    total = sum(g for _, g in items)
    used = removed = 0.0  # hybrid device-seconds spent on the pieces before this one, standalone ones they saved
    for rho, g in items:
        if rho <= 0:
            break
        t = (total - removed + rho * (W + used)) / (S + rho * T)
        if T * t - W <= used + g / rho:
            return t
        used += g / rho
        removed += g
    if total - removed <= 0:
        return (W + used) / T
    if S <= 0:
        raise ValueError(
            f"the balance bound needs some device that generates: no standalone device (S={S}) and {total - removed} "
            "device-seconds of work no hybrid replica can serve (rho 0)"
        )
    return max((W + used) / T, (total - removed) / S)


def bound_from_pieces(
    train_devices: float, rollout_devices: float, train_device_s: float, pieces: Sequence[tuple[float, float]]
) -> float:
    """The balance bound with a hybrid/standalone ratio per piece of work: ``max(W/T, least t)``, in seconds.

    ``pieces`` are ``(ρ_k, G_k)``: ``G_k`` standalone device-seconds of generation that a trainer device serves at
    ``ρ_k`` standalone device-seconds per second. The least ``t`` with ``S·t`` standalone and ``T·t − W`` hybrid
    device-seconds for all the work is a fractional knapsack (hybrid time to the best ratio first); no schedule can
    beat it, as each piece's ratio is the best its samples reach. One piece is :func:`bound_from_terms`.

    Example::

        >>> bound_from_pieces(1, 1, 27.8, [(1.0, 85.0)])  # one ratio: (85 + 27.8) / 2
        56.4
        >>> bound_from_pieces(1, 1, 10.0, [(1.0, 20.0), (0.25, 60.0)])  # one ratio 1.0 would say (80 + 10) / 2 = 45
        54.0
    """
    term = balance_term_from_pieces(train_devices, rollout_devices, train_device_s, pieces)  # checks the arguments
    return max(float(train_device_s) / float(train_devices), term)


def bound_pieces(
    scenario: Scenario, samples: Iterable[SimSample], progress_at: dict[int, float] | None = None
) -> list[tuple[float, float]]:
    """``[(ρ_k, G_k)]`` of :func:`balance_bound`: the trained samples' standalone device-seconds by their own ratio."""
    rate = _rates(scenario, progress_at)
    progress = progress_at or {v: float(v) for v in range(scenario.steps + 1)}
    pieces: dict[float, float] = {}
    for smp in samples:
        last = smp.max_version if smp.max_version is not None else max(progress)
        a = smp.admitted_version
        s_best = max(rate("s", a), rate("s", last))
        rho = max(rate("h", a), rate("h", last)) / s_best
        pieces[rho] = pieces.get(rho, 0.0) + smp.length / s_best
    return sorted(pieces.items(), reverse=True)
