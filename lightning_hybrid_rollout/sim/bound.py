"""A simulated run's balance bound: its work on its devices with perfect balance and free switching."""

from __future__ import annotations

from collections.abc import Iterable

from lightning_hybrid_rollout.sim.scenario import ReplicaModel, RunSpec, Scenario
from lightning_hybrid_rollout.sim.world import SimSample

__all__ = ["balance_bound", "bound_from_terms", "bound_terms", "peak_tokens_per_device_s"]


def peak_tokens_per_device_s(scenario: Scenario, model: ReplicaModel, version: float) -> float:
    """Best decode tokens/s per device a replica of ``model`` reaches at ``version`` (its KV limit then)."""
    limit = model.run_limit(scenario.cap_of(model), scenario.lengths.context_at(version))
    return model.throughput(limit, limit) / model.devices


def balance_bound(
    scenario: Scenario,
    run: RunSpec,
    samples: Iterable[SimSample],
    train_device_s: float,
    progress_at: dict[int, float] | None = None,
) -> float:
    """The run's balance bound: its work on its devices with perfect balance and free switching.

    Generation work is counted in standalone device-seconds, ``G = Σ length_i / s_i`` with ``s_i`` the best
    standalone rate per device (tokens/s) over the versions sample ``i`` was decoded in (the KV limit follows the
    drifting mean length). Trainer devices train ``W`` device-seconds in all and may generate, like hybrid replicas,
    at ``ρ`` standalone device-seconds per second (``ρ`` = the best hybrid/standalone speed ratio of the run's
    versions). No schedule can beat ``max(W/T, (G + ρ·W) / (S + ρ·T))`` (``T``/``S`` trainer/rollout devices).
    With hybrid replicas as fast as standalone ones (``ρ = 1``) this is the issue's ``(G + W) / (T + S)``.
    ``progress_at`` maps a param version to the training progress the length model followed then (default: the
    version itself, see ``RunSpec.early_first_sync``).
    """
    gen, rho = bound_terms(scenario, samples, progress_at)
    return bound_from_terms(run.train_devices, run.rollout_devices, train_device_s, gen, rho)


def bound_from_terms(
    train_devices: float, rollout_devices: float, train_device_s: float, generation_device_s: float, rho: float = 1.0
) -> float:
    """The balance bound from its terms: ``max(W/T, (G + ρ·W) / (S + ρ·T))``, in seconds.

    The one formula of the bound, for a simulated run (:func:`balance_bound`) and a real one
    (:mod:`lightning_hybrid_rollout.run_bound`, ``lhr report``): they differ only in how the terms are measured.

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
    """``(G, ρ)`` of :func:`balance_bound`."""
    progress = progress_at or {v: float(v) for v in range(scenario.steps + 1)}
    rates: dict[tuple[str, int], float] = {}

    def rate(kind: str, v: int) -> float:
        key = (kind, v)
        if key not in rates:
            model = scenario.replica if kind == "s" else scenario.hybrid_model
            rates[key] = peak_tokens_per_device_s(scenario, model, progress.get(v, float(v)))
        return rates[key]

    gen = 0.0
    for smp in samples:
        last = smp.max_version if smp.max_version is not None else max(progress)
        gen += smp.length / max(rate("s", smp.admitted_version), rate("s", last))
    rho = max(rate("h", v) / rate("s", v) for v in progress)
    return gen, rho
