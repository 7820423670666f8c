"""The one "did you mean" of every error message in the package: the closest valid name to a wrong one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["closest", "did_you_mean"]


def closest(value: Any, choices: Iterable[str]) -> str | None:
    """The valid name closest to ``value`` (``difflib``'s ratio of at least 0.6), or None."""
    close = difflib.get_close_matches(str(value), list(choices), n=1)
    return close[0] if close else None


def did_you_mean(value: Any, choices: Iterable[str], otherwise: str = "") -> str:
    """``" Did you mean 'x'?"`` for the closest valid name, else ``otherwise``.

    Example::

        >>> did_you_mean("promt_column", ["path", "prompt_column"])
        " Did you mean 'prompt_column'?"
    """
    match = closest(value, choices)
    return f" Did you mean {match!r}?" if match is not None else otherwise
