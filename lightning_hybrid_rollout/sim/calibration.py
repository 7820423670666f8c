"""A fit's result (:mod:`~lightning_hybrid_rollout.sim.calibrate`): the fitted scenario and what each number rests on.

:class:`Calibration` holds the scenario fitted to a run and one :class:`FittedParameter` per number (its value,
spread, observations and source); :meth:`Calibration.scenario_for` predicts another run of the same workload.
:class:`FitLog` collects the parameters while a fit builds the scenario's sections. The two figures of the machine a
prediction across a static / dynamic swap rests on: :data:`HYBRID_SPEED_RATIO`, :data:`STANDALONE_SPEED_WITH_HYBRID`
(1.0: no slowdown assumed), or a named :class:`HostPreset` (:data:`HOST_PRESETS`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.errors import CalibrationError
from lightning_hybrid_rollout.sim.renames import HOST_PRESET_RENAMES, deprecation_message, resolve
from lightning_hybrid_rollout.sim.scenario import RunSpec, Scenario, ScenarioError

__all__ = [
    "HOST_PRESETS",
    "HYBRID_SPEED_RATIO",
    "NOT_MEASURED",
    "SHARED_2VCPU",
    "STANDALONE_SPEED_WITH_HYBRID",
    "Calibration",
    "FitLog",
    "FittedParameter",
    "HostPreset",
    "get_host_preset",
]

#: A run whose hybrid replicas never served (a static run) cannot measure their speed: their ``tokens_per_s`` is
#: assumed this fraction of the standalone replicas' (``ρ``: per replica, relative to their average rate). The
#: library default, 1.0, assumes a hybrid replica decodes as fast as a standalone one (devices of its own); a host
#: where it shares the trainer's cores names its :class:`HostPreset` (``shared_2vcpu``: 0.71) or gives its figure
#: (``calibrate(..., hybrid_speed_ratio=)``; a dynamic run's fitted ``hybrid_replica.tokens_per_s`` over
#: ``replica.tokens_per_s``, ``lhr simulate --from-run RUN --fit-only``).
HYBRID_SPEED_RATIO = 1.0
#: The standalone replicas' speed beside a busy trainer device (training, or lent to a hybrid replica) over their
#: speed beside an idle one: the factor :meth:`Calibration.scenario_for` converts their rate by between a static run
#: and one whose hybrid replicas serve, in both directions. The library default, 1.0, assumes the rollout devices
#: share nothing with the trainer's (a GPU of their own); a host where they share caches and memory bandwidth names
#: its :class:`HostPreset` (``shared_2vcpu``: 0.91) or gives its figure (``scenario_for(...,
#: standalone_speed_with_hybrid=)``).
STANDALONE_SPEED_WITH_HYBRID = 1.0
#: The source of a number the run did not record.
NOT_MEASURED = "default, not measured"


@dataclass(frozen=True)
class HostPreset:
    """A kind of host's two figures a prediction across a static / dynamic swap rests on (``--host-preset``)."""

    name: str
    """What ``lhr plan --host-preset`` and ``lhr simulate --host-preset`` call it."""
    hybrid_speed_ratio: float
    """A hybrid replica's decode rate over a standalone one's, per replica (:data:`HYBRID_SPEED_RATIO`)."""
    standalone_speed_with_hybrid: float
    """The standalone replicas' speed beside a busy trainer device over beside an idle one
    (:data:`STANDALONE_SPEED_WITH_HYBRID`)."""
    description: str = ""
    """The host the figures were measured on."""


#: A shared 2-vCPU host, the CPU miniature's (``benchmarks/cpu_miniature.py``), where the hybrid replica shares the
#: trainer's core and the standalone replica shares its caches: ρ 0.71 is the median of its 37 ``rate_matched`` runs
#: (quartiles 0.68-0.74), 0.91 the median ``replica.speed_while_training`` of its 52 static runs (quartiles 0.87-0.94;
#: docs/simulator.md, "The machine's two figures"). Its old name ``cpu_2core`` (and ``CPU_2CORE``) is a deprecated
#: alias (:data:`~lightning_hybrid_rollout.sim.renames.HOST_PRESET_RENAMES`).
SHARED_2VCPU = HostPreset(
    name="shared_2vcpu",
    hybrid_speed_ratio=0.71,
    standalone_speed_with_hybrid=0.91,
    description="2 vCPUs: the trainer and the hybrid replica on one core, the standalone replica on the other",
)
#: The named host presets.
HOST_PRESETS: dict[str, HostPreset] = {p.name: p for p in (SHARED_2VCPU,)}


def __getattr__(name: str) -> Any:
    """``CPU_2CORE``: the deprecated name of :data:`SHARED_2VCPU` (one release)."""
    if name == "CPU_2CORE":
        warnings.warn(deprecation_message("name", name, "SHARED_2VCPU"), DeprecationWarning, stacklevel=2)
        return SHARED_2VCPU
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_host_preset(name: str) -> HostPreset:
    """The host preset called ``name`` (an old name of
    :data:`~lightning_hybrid_rollout.sim.renames.HOST_PRESET_RENAMES`: its new one, with a :class:`DeprecationWarning`).

    Raises:
        CalibrationError: No such preset.
    """
    try:
        return HOST_PRESETS[resolve("host preset", name, HOST_PRESET_RENAMES)]
    except KeyError:
        raise CalibrationError(
            f"unknown host preset {name!r}; known: {', '.join(sorted(HOST_PRESETS))} (or give the figures: "
            "--hybrid-speed-ratio R --standalone-speed-with-hybrid F)"
        ) from None


@dataclass(frozen=True)
class FittedParameter:
    """One fitted scenario number.

    Args:
        name: Its place in the scenario (``replica.tokens_per_s``, ``switch.wake_s``, ``async_training.X``, ...), or
            a measurement that is not a scenario number (``info.*``: shown, not written).
        value: The value written into the scenario.
        spread: Interquartile range of the per-observation values (same unit; None with fewer than two).
        observations: How many values it rests on (0: not measured).
        source: Where it came from (``default, not measured`` when the run did not record it).
    """

    name: str
    value: Any
    spread: float | None
    observations: int
    source: str

    @property
    def measured(self) -> bool:
        """Whether the run recorded it (the value is not a default)."""
        return self.observations > 0


@dataclass
class Calibration:
    """A fitted scenario and what each of its numbers rests on.

    Args:
        scenario: The scenario: one run, the measured run's split and options.
        parameters: One :class:`FittedParameter` per fitted number, in the scenario's order.
        notes: What the run did not record and other caveats, one line each.
    """

    scenario: Scenario
    parameters: list[FittedParameter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hybrid_served: bool = False
    hybrid_speed_ratio: float | None = None
    #: The conversion factor :meth:`scenario_for` uses when given none (None: the host's); ``lhr plan --from-run
    #: RUN_DIR --standalone-speed-with-hybrid F`` sets it.
    standalone_factor: float | None = None
    #: The host the pilot ran on (``--host-preset``): its figure is the conversion factor where none is given (None:
    #: :data:`STANDALONE_SPEED_WITH_HYBRID`).
    host: HostPreset | None = None

    def scenario_for(
        self,
        run: Mapping[str, Any] | RunSpec,
        *,
        standalone_speed_with_hybrid: float | None = None,
        hybrid_speed_ratio: float | None = None,
    ) -> Scenario:
        """The fitted scenario with ``run`` instead of the measured run: a prediction of another run of the same
        workload on the same machine (another policy, static instead of dynamic, other options, another split).

        The standalone replicas' rate is converted between a run whose hybrid replicas serve and one where they
        never do (``run`` is static, or its policy is ``static_fully_async``), by ``f`` =
        ``standalone_speed_with_hybrid`` (default: the host's, a figure of the machine): in
        the serving run the trainer's device is busy nearly all the time (training, or lending itself to a hybrid
        replica), in the static run only while it trains. So:

        - from a static fit to a serving run: the fitted rate (beside an idle trainer device) × ``f`` throughout,
          its ``speed_while_training`` 1.0 (not slowed again while training);
        - from a serving fit to a static run: the fitted rate / ``f`` beside an idle trainer device, its
          ``speed_while_training`` ``f`` (back to the serving run's rate while the trainer trains).

        The static fit's own ``replica.speed_while_training`` is kept for static runs (it is that run's
        measurement) and is not the default ``f``: on the CPU miniature it does not carry over to another run. A
        given ``f`` (or the calibration's ``standalone_factor``) is a machine's figure for every run, so a static run
        from a static fit then takes it as its ``speed_while_training`` too (1.0: replicas on devices of their own).

        Where the fitted run never measured the hybrid replicas, their rate is ``hybrid_speed_ratio`` (default: the
        fit's: the host's, else :data:`HYBRID_SPEED_RATIO`) × the converted standalone rate.

        Args:
            run: The run to predict (a :class:`~lightning_hybrid_rollout.sim.scenario.RunSpec` or its mapping:
                ``name``, ``train_devices``, ``rollout_devices``, ``hybrid``, ``async_training`` of
                :data:`~lightning_hybrid_rollout.sim.scenario.RUN_KEYS`).
            standalone_speed_with_hybrid: The conversion factor (0 < f); None: :meth:`standalone_speed_with_hybrid`.
            hybrid_speed_ratio: ``ρ`` when the fit did not measure it (ignored when it did).

        Raises:
            CalibrationError: A factor that is not > 0, or a run the scenario refuses.
        """
        f = self.standalone_speed_with_hybrid(standalone_speed_with_hybrid)
        rho = self.hybrid_speed_ratio if hybrid_speed_ratio is None else float(hybrid_speed_ratio)
        if not f > 0 or (rho is not None and not rho > 0):
            raise CalibrationError(
                f"standalone_speed_with_hybrid and hybrid_speed_ratio must be > 0, got {f} and {rho}"
            )
        data = self.scenario.to_dict()
        data["runs"] = [dataclasses.asdict(run) if isinstance(run, RunSpec) else dict(run)]
        try:
            probe = Scenario.from_dict(data)
        except ScenarioError as err:
            raise CalibrationError(f"the run to predict is not valid here: {err}") from None
        spec = probe.runs[0]
        serves = spec.hybrid and spec.policy != "static_fully_async"
        v = self.scenario.replica.tokens_per_s
        average = self.standalone_average_over_outside  # the standalone replicas' average over their rate outside
        given = standalone_speed_with_hybrid is not None or self.standalone_factor is not None
        if self.hybrid_served and not serves:  # beside an idle trainer device / f, back to the fitted rate in training
            v /= f
            data["replica"] = {**data["replica"], "speed_while_training": f}
        elif serves and not self.hybrid_served:  # slowed throughout, not again while training
            v *= f
            data["replica"] = {**data["replica"], "speed_while_training": 1.0}
            average = 1.0
        elif given and not serves:  # a static run on the machine given: slowed by f while its trainer trains
            data["replica"] = {**data["replica"], "speed_while_training": f}
        data["replica"] = {**data["replica"], "tokens_per_s": v}
        if self.hybrid_speed_ratio is not None and rho is not None:  # not measured: follows the standalone rate
            hybrid = data["hybrid_replica"] or dict(data["replica"])
            data["hybrid_replica"] = {**hybrid, "tokens_per_s": rho * v * average}
        return Scenario.from_dict(data)

    def standalone_speed_with_hybrid(self, given: float | None = None) -> float:
        """The factor :meth:`scenario_for` converts the standalone replicas' rate by between a static run and a
        serving one: ``given``, else the calibration's ``standalone_factor``, else its host's, else
        :data:`STANDALONE_SPEED_WITH_HYBRID`."""
        if given is not None:
            return float(given)
        if self.standalone_factor is not None:
            return float(self.standalone_factor)
        return STANDALONE_SPEED_WITH_HYBRID if self.host is None else self.host.standalone_speed_with_hybrid

    @property
    def standalone_average_over_outside(self) -> float:
        """The standalone replicas' average speed over their speed outside the trainer's training spans (``ρ`` is
        relative to the average; 1 where the fit did not slow them while training)."""
        for p in self.parameters:
            if p.name == "info.standalone_average_over_outside_training":
                return float(p.value)
        return 1.0

    def parameter(self, name: str) -> FittedParameter:
        """The parameter called ``name``."""
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(f"no fitted parameter {name!r}; fitted: {[p.name for p in self.parameters]}")

    def lines(self) -> list[str]:
        """The fitted parameters, one line each (``name = value (IQR x, n obs; source)``), then the notes."""
        out = []
        width = max((len(p.name) for p in self.parameters), default=0)
        for p in self.parameters:
            spread = "" if p.spread is None else f"IQR {_fmt(p.spread)}, "
            obs = f"{p.observations} obs; " if p.observations else ""
            out.append(f"{p.name:<{width}} = {_fmt(p.value):>10}  ({spread}{obs}{p.source})")
        out += [f"note: {n}" for n in self.notes]
        return out

    def to_yaml(self) -> str:
        """The scenario as YAML (what ``lhr simulate FILE`` reads), with a header saying where it came from."""
        import yaml

        head = [
            f"# fitted by `lhr simulate --from-run` from run {self.scenario.runs[0].name!r}; edit and re-run.",
            "# numbers not measured by the run keep their defaults (see the fit's report).",
        ]
        return "\n".join(head) + "\n" + yaml.safe_dump(self.scenario.to_dict(), sort_keys=False)

    def write_yaml(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_yaml` to ``path``; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(), encoding="utf-8")
        return path


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None or isinstance(v, (str, int)):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _iqr(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


class FitLog:
    """Collects the parameters (in the order they are fitted) and the notes while the scenario's sections are built."""

    def __init__(self) -> None:
        self.params: list[FittedParameter] = []
        self.notes: list[str] = []

    def add(
        self, name: str, value: Any, source: str, values: Sequence[float] = (), observations: int | None = None
    ) -> Any:
        """Record a measured ``value`` (its spread over ``values``; ``observations`` defaults to their count)."""
        n = len(values) if observations is None else observations
        self.params.append(FittedParameter(name, value, _iqr(values), n, source))
        return value

    def default(self, name: str, value: Any, why: str = "") -> Any:
        """Record a ``value`` the run did not measure (a default, or an assumption: ``why`` says which)."""
        self.params.append(FittedParameter(name, value, None, 0, NOT_MEASURED + (f" ({why})" if why else "")))
        return value
