"""Lightning's warnings about what this design does on purpose, hidden only while a fit runs, never process-wide.

The ``dataloader_iter`` training step (its batch is taken after ``on_train_batch_start``), an empty list of
validation batches when none is configured, and a deprecation inside Lightning itself (torch's ``LeafSpec``) are
nothing a user can act on. Each filter matches its message, its category and Lightning's own modules only (the
module a warning is attributed to), so the same text raised by any other code still shows.

:class:`ExpectedWarnings` adds the filters and later removes exactly those: :class:`HybridRolloutCallback` from its
``setup`` hook to the end of the fit (the last three arise in the fit's data and loop set-up, after ``setup``);
``lhr fit`` around the whole run (:func:`lightning_warnings_hidden`), which also covers the first one, raised by
``Trainer.fit``'s configuration checks before any callback hook. Importing the package changes no warning filter.

Example::

    with lightning_warnings_hidden():
        trainer.fit(module, datamodule=dm)
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from lightning.pytorch.utilities.warnings import PossibleUserWarning

__all__ = ["EXPECTED_WARNINGS", "LIGHTNING_MODULES", "ExpectedWarnings", "lightning_warnings_hidden"]

#: (message regex, category) of each hidden warning; the message regex matches the start of the text.
EXPECTED_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r"You are using the `dataloader_iter` step flavor", PossibleUserWarning),  # Trainer.fit's checks
    (r"Found `dataloader_iter` argument in the `training_step`", UserWarning),  # the fit loop's data fetcher
    (r"Total length of `list` across ranks is zero", UserWarning),  # no validation batches
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),  # Lightning's CombinedLoader, torch >= 2.9
)

#: The modules these warnings are attributed to: Lightning's (``lightning.pytorch``, or ``pytorch_lightning``).
LIGHTNING_MODULES = r"(lightning\.pytorch|pytorch_lightning)(\.|$)"


class ExpectedWarnings:
    """The filters of :data:`EXPECTED_WARNINGS`, from :meth:`hide` to :meth:`show` (hooks cannot hold a ``with``).

    :meth:`show` removes exactly the filters :meth:`hide` added: filters anyone else added or removed meanwhile
    stay as they are. Both are idempotent.
    """

    def __init__(self) -> None:
        self._added: list[Any] = []
        self._hidden = False

    @property
    def hidden(self) -> bool:
        """Whether the filters are in place (between :meth:`hide` and :meth:`show`)."""
        return self._hidden

    def hide(self) -> None:
        """Add the filters (in front of the others, as ``warnings.filterwarnings`` does)."""
        if self._hidden:
            return
        self._hidden = True
        for message, category in EXPECTED_WARNINGS:
            present = list(warnings.filters)
            warnings.filterwarnings("ignore", message=message, category=category, module=LIGHTNING_MODULES)
            if warnings.filters[0] not in present:  # the same filter put there by someone else stays theirs
                self._added.append(warnings.filters[0])

    def show(self) -> None:
        """Remove the filters :meth:`hide` added."""
        added, self._added, self._hidden = self._added, [], False
        for entry in added:
            with contextlib.suppress(ValueError):  # removed by someone else (e.g. warnings.resetwarnings())
                warnings.filters.remove(entry)


@contextlib.contextmanager
def lightning_warnings_hidden() -> Iterator[None]:
    """Hide :data:`EXPECTED_WARNINGS` inside the block (``lhr fit``'s run); the filters are removed after it."""
    expected = ExpectedWarnings()
    expected.hide()
    try:
        yield
    finally:
        expected.show()
