"""The simulator's renamed names (``sim/renames.py``): each old name still works for one release, mapped to the new
one with one deprecation line; the new names warn nothing."""

from __future__ import annotations

import logging
import warnings

import pytest
import yaml

from lightning_hybrid_rollout.sim import calibration
from lightning_hybrid_rollout.sim.calibration import SHARED_2VCPU, FitLog, get_host_preset
from lightning_hybrid_rollout.sim.cli import _plan_parser, _simulate_parser, simulate_main
from lightning_hybrid_rollout.sim.plan import candidate_runs
from lightning_hybrid_rollout.sim.presets import get_preset, preset_names
from lightning_hybrid_rollout.sim.scenario import SEQUENCINGS, RunSpec
from lightning_hybrid_rollout.sim.workload_fit import fit_run_options

from .conftest import tiny_scenario


def test_the_new_names_say_what_they_are_and_the_old_ones_are_gone_from_the_lists() -> None:
    assert SEQUENCINGS == ("sequential", "overlap_sync")
    assert RunSpec("r", 4, 4, hybrid=True).sequencing == "sequential"
    assert "verl_32_devices" in preset_names() and "seed" not in preset_names()
    assert SHARED_2VCPU.name == "shared_2vcpu" and set(calibration.HOST_PRESETS) == {"shared_2vcpu"}


def test_the_new_names_warn_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_preset("verl_32_devices").name == "verl_32_devices"
        assert get_host_preset("shared_2vcpu") is SHARED_2VCPU
        candidate_runs(tiny_scenario(runs=[]), 2, policies=["default"], option_sets=["defaults"])


def test_the_old_preset_name_is_the_new_preset_with_a_deprecation_warning() -> None:
    with pytest.deprecated_call(match="preset 'seed' is deprecated, use 'verl_32_devices'"):
        old = get_preset("seed")
    assert old.to_dict() == get_preset("verl_32_devices").to_dict()


def test_the_old_host_preset_name_and_constant_are_the_new_host_preset_with_a_deprecation_warning() -> None:
    with pytest.deprecated_call(match="host preset 'cpu_2core' is deprecated, use 'shared_2vcpu'"):
        assert get_host_preset("cpu_2core") is SHARED_2VCPU
    with pytest.deprecated_call(match="name 'CPU_2CORE' is deprecated, use 'SHARED_2VCPU'"):
        assert calibration.CPU_2CORE is SHARED_2VCPU
    with pytest.raises(AttributeError):
        calibration.NO_SUCH_HOST  # noqa: B018


def test_the_old_option_set_name_is_the_defaults_set_with_a_deprecation_warning() -> None:
    sc = tiny_scenario(runs=[])
    new = candidate_runs(sc, 2, policies=["default"], option_sets=["defaults"])
    with pytest.deprecated_call(match="option set 'seed' is deprecated, use 'defaults'"):
        old = candidate_runs(sc, 2, policies=["default"], option_sets=["seed"])
    assert [(r.name, r.async_training) for r in old] == [(r.name, r.async_training) for r in new]


def test_the_command_line_takes_the_old_names_and_logs_one_line_each(caplog, capsys) -> None:
    """A command line shows no library DeprecationWarning by default, so the CLI logs the deprecation itself."""
    with caplog.at_level(logging.WARNING, logger="lightning_hybrid_rollout.sim.cli"):
        args = _simulate_parser().parse_args(["--preset", "seed", "--host-preset", "cpu_2core"])
        assert (args.preset, args.host_preset) == ("verl_32_devices", "shared_2vcpu")
        args = _plan_parser().parse_args(["--preset", "seed", "--devices", "4", "--options", "all, seed"])
        assert (args.preset, args.options) == ("verl_32_devices", "all,defaults")
        assert simulate_main(["--dump-preset", "seed"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["name"] == "verl_32_devices"
    assert [r.getMessage() for r in caplog.records] == [
        "preset 'seed' is deprecated, use 'verl_32_devices'",
        "host preset 'cpu_2core' is deprecated, use 'shared_2vcpu'",
        "preset 'seed' is deprecated, use 'verl_32_devices'",
        "option set 'seed' is deprecated, use 'defaults'",
        "preset 'seed' is deprecated, use 'verl_32_devices'",
    ]


@pytest.mark.parametrize(
    ("sequencing", "overlap"), [("seed", False), ("sequential", False), ("overlap_sync", True)], ids=str
)
def test_a_simulator_trace_written_before_the_rename_still_fits(sequencing: str, overlap: bool) -> None:
    """A trace of an older ``lhr simulate --plot`` says ``"sequencing": "seed"``: it reads as ``sequential``."""
    meta = {"source": "simulator", "policy": "default", "sequencing": sequencing}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a record of a past run: nothing for its reader to change
        changes = fit_run_options(None, meta, "trace.json", FitLog())
    assert changes["overlap_sync"] is overlap and changes["dynamic_schedule_policy"] == "default"
