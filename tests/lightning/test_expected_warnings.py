"""Lightning's expected warnings (``lightning/expected_warnings.py``): hidden where they arise, never at import.

A plain ``Trainer.fit`` of a tiny module with a ``dataloader_iter`` training step and no validation batches raises
them from Lightning's own modules; :func:`lightning_warnings_hidden` around the fit (what ``lhr fit`` does) hides
them, the callback hides them from its ``setup`` to the end of the fit, and importing the package changes no filter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning import callback as callback_module
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.expected_warnings import (
    EXPECTED_WARNINGS,
    ExpectedWarnings,
    lightning_warnings_hidden,
)

REPO = Path(__file__).resolve().parents[2]
#: The ones a fit of ``_IterStep`` raises on every supported version (the LeafSpec one needs torch >= 2.9).
ALWAYS = ("You are using the `dataloader_iter`", "Found `dataloader_iter` argument", "Total length of `list`")


def test_importing_the_package_changes_no_warning_filter() -> None:
    code = textwrap.dedent(
        """
        import sys, warnings
        import torch, lightning.pytorch  # their own import-time filters are theirs
        callers = []
        for name in ("filterwarnings", "simplefilter"):
            real = getattr(warnings, name)
            def spy(*args, _real=real, **kwargs):
                callers.append(sys._getframe(1).f_globals.get("__name__"))
                return _real(*args, **kwargs)
            setattr(warnings, name, spy)
        before = list(warnings.filters)
        import lightning_hybrid_rollout, lightning_hybrid_rollout.lightning
        import lightning_hybrid_rollout.lightning.callback, lightning_hybrid_rollout.lightning.cli
        import lightning_hybrid_rollout.lightning.module, lightning_hybrid_rollout.lightning.data
        added = [f for f in warnings.filters if f not in before]
        removed = [f for f in before if f not in warnings.filters]
        print(len(before), len(warnings.filters), added, removed, callers)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    n_before, n_after, added, removed, callers = out.stdout.strip().rsplit("\n", 1)[-1].split(" ", 4)
    assert (n_before, added, removed, callers) == (n_after, "[]", "[]", "[]"), out.stdout


class _IterStep(L.LightningModule):
    """A ``dataloader_iter`` training step (as GRPOModule's) and an empty list of validation batches."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, dataloader_iter: Any) -> torch.Tensor:
        batch, *_ = next(dataloader_iter)
        return self.layer(batch).sum()

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)

    def val_dataloader(self) -> list[Any]:
        return []

    def validation_step(self, batch: Any) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit_warnings(tmp_path: Path, hide: bool) -> list[warnings.WarningMessage]:
    """The warnings a one-step fit of :class:`_IterStep` raises, every one shown (``always``) unless hidden."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=1,
            default_root_dir=str(tmp_path),
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        if hide:
            with lightning_warnings_hidden():
                trainer.fit(_IterStep())
        else:
            trainer.fit(_IterStep())
    return caught


def _expected(caught: list[warnings.WarningMessage]) -> list[str]:
    texts = [str(w.message) for w in caught]
    return [t for t in texts if any(t.startswith(m.replace("\\", "")) for m, _ in EXPECTED_WARNINGS)]


def test_a_fit_raises_the_expected_warnings_and_lhr_fits_block_hides_them_there_only(tmp_path: Path) -> None:
    shown = _expected(_fit_warnings(tmp_path / "plain", hide=False))
    assert all(any(t.startswith(prefix) for t in shown) for prefix in ALWAYS), shown  # they do arise
    before = list(warnings.filters)
    assert _expected(_fit_warnings(tmp_path / "hidden", hide=True)) == []
    assert warnings.filters == before  # the block's filters are gone after it


def test_the_filters_match_lightnings_modules_only_and_show_removes_exactly_them() -> None:
    message = "Total length of `list` across ranks is zero. Please make sure this was your intention."
    expected = ExpectedWarnings()
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outer = list(warnings.filters)
        expected.hide()
        warnings.filterwarnings("ignore", message="someone else's filter")  # added meanwhile: stays
        theirs = warnings.filters[0]
        for module in ("lightning.pytorch.utilities.data", "pytorch_lightning.utilities.data", "my_project.data"):
            warnings.warn_explicit(message, UserWarning, "x.py", 1, module=module, registry={})
        assert expected.hidden
        expected.show()
        expected.show()  # idempotent
        assert not expected.hidden and warnings.filters == [theirs, *outer]
        warnings.warn_explicit(message, UserWarning, "x.py", 1, module="lightning.pytorch.utilities.data", registry={})
    assert [w.filename for w in caught] == ["x.py", "x.py"]  # my_project's, then Lightning's once shown again
    assert warnings.filters == before


def test_the_callback_hides_them_from_its_setup_hook_to_its_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(callback_module, "take_model_path", lambda *args, **kwargs: None)
    cb = HybridRolloutCallback(RolloutConfig(model_path="unused"), AsyncTrainingConfig(), trace=False)
    trainer: Any = SimpleNamespace(default_root_dir=str(tmp_path), loggers=[])
    before = list(warnings.filters)
    assert not cb._expected_warnings.hidden
    cb.setup(trainer, torch.nn.Linear(1, 1), "test")  # type: ignore[arg-type]
    assert cb._expected_warnings.hidden and len(warnings.filters) == len(before) + len(EXPECTED_WARNINGS)
    cb.teardown(trainer, torch.nn.Linear(1, 1), "test")  # type: ignore[arg-type]
    assert not cb._expected_warnings.hidden and warnings.filters == before
