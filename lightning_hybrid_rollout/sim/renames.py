"""The simulator's renamed names: each old name is accepted for one release as a deprecated alias of the new one.

Example::

    import warnings

    from lightning_hybrid_rollout.sim.renames import PRESET_RENAMES, resolve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve("preset", "seed", PRESET_RENAMES) == "verl_32_devices"
    assert str(caught[0].message) == "preset 'seed' is deprecated, use 'verl_32_devices'"
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

__all__ = [
    "HOST_PRESET_RENAMES",
    "OPTION_SET_RENAMES",
    "PRESET_RENAMES",
    "SEQUENCING_RENAMES",
    "deprecation_message",
    "resolve",
]

#: :attr:`~lightning_hybrid_rollout.sim.scenario.RunSpec.sequencing`: the standalone sync, then the activation's
#: wake and hybrid sync, one after another (a trace's ``sequencing`` written before the rename reads as the new name).
SEQUENCING_RENAMES: dict[str, str] = {"seed": "sequential"}
#: ``lhr simulate --preset`` / :func:`~lightning_hybrid_rollout.sim.presets.get_preset`: verl's 32-device experiment.
PRESET_RENAMES: dict[str, str] = {"seed": "verl_32_devices"}
#: ``--host-preset`` / ``calibrate_run(..., host=)``: a 2-vCPU host whose replicas share the trainer's cores.
HOST_PRESET_RENAMES: dict[str, str] = {"cpu_2core": "shared_2vcpu"}
#: ``lhr plan --options`` / :data:`~lightning_hybrid_rollout.sim.plan.OPTION_SETS`: no runtime option on, the
#: config's defaults.
OPTION_SET_RENAMES: dict[str, str] = {"seed": "defaults"}


def deprecation_message(kind: str, old: str, new: str) -> str:
    """The one line a deprecated name is reported with."""
    return f"{kind} {old!r} is deprecated, use {new!r}"


def resolve(kind: str, name: str, renames: Mapping[str, str], *, stacklevel: int = 3) -> str:
    """``name``, or its new name with a :class:`DeprecationWarning` when ``renames`` holds it as an old one.

    Args:
        kind: What the name names (``preset``, ``host preset``, ...), for the message.
        name: The name given.
        renames: Old name -> new name.
        stacklevel: Passed to :func:`warnings.warn` (the default points at the caller of the function calling this).
    """
    new = renames.get(name)
    if new is None:
        return name
    warnings.warn(deprecation_message(kind, name, new), DeprecationWarning, stacklevel=stacklevel)
    return new
