"""Stand-ins for what the callback reads of a Lightning ``Trainer`` in hook-level tests (rank 0, one device)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch


def fake_trainer() -> Any:
    """A single-device rank-0 trainer at step 0, with no loggers."""
    return SimpleNamespace(
        global_step=0,
        is_global_zero=True,
        world_size=1,
        strategy=SimpleNamespace(root_device=torch.device("cpu"), barrier=lambda *a: None),
        lightning_module=torch.nn.Linear(2, 2),
        loggers=[],
        callback_metrics={},
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
    )
