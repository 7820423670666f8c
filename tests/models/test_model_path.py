"""The run's one model directory, from the Python API: refused in ``setup`` before Ray starts or a file is written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest

from lightning_hybrid_rollout.config import ConfigError, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.models.model_path import take_model_path


def _fit(tmp_path: Path, module: GRPOModule, model_path: str, build_model: bool) -> None:
    callback = HybridRolloutCallback(RolloutConfig(model_path=model_path), build_model=build_model)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="hybrid_single_device",
        max_steps=1,
        callbacks=[callback],
        default_root_dir=str(tmp_path / "run"),
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(module, datamodule=RolloutDataModule())


@pytest.mark.parametrize(
    ("module_path", "rollout_path", "build_model", "message"),
    [
        ("elsewhere/model", "run/model", True, "name different models"),
        (None, "/nonexistent/model/dir", False, "does not exist"),
        (None, "/nonexistent/model/dir", True, "outside the run's directory"),
    ],
    ids=["mismatch", "missing", "build_outside_run_dir"],
)
def test_a_bad_model_path_stops_the_fit_before_ray_or_any_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    module_path: str | None,
    rollout_path: str,
    build_model: bool,
    message: str,
    ray_started_by_test: Callable[[], bool],
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message) as err:
        _fit(tmp_path, GRPOModule(model_path=module_path), rollout_path, build_model)
    assert len(err.value.problems) == 1
    assert list(tmp_path.iterdir()) == [] and not Path("/nonexistent").exists()
    assert not ray_started_by_test()


def test_the_module_takes_the_rollout_model_path(tmp_path: Path) -> None:
    module = GRPOModule()
    take_model_path(module, str(tmp_path / "model"), build_model=True, run_dir=str(tmp_path), check_disk=True)
    assert module.hparams.model_path == str(tmp_path / "model")
