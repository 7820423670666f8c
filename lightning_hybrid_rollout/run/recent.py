"""RecentList: a list that keeps only its newest items, so a record appended once per step or cycle stays bounded."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["RecentList"]

_T = TypeVar("_T")


class RecentList(list[_T]):
    """A list that keeps only its last ``maxlen`` items as :meth:`append` adds to them (the oldest dropped first).

    To every reader it is a plain list (slices, ``count``, ``==``, JSON); only :meth:`append` is bounded, the one
    way the callback's records grow.

    Args:
        maxlen: How many of the newest items to keep (>= 1).
        items: Items to start with (only the last ``maxlen`` are kept).
    """

    def __init__(self, maxlen: int, items: Iterable[_T] = ()) -> None:
        if maxlen < 1:
            raise ValueError(f"RecentList maxlen must be >= 1, got {maxlen}")
        super().__init__(items)
        self.maxlen = maxlen
        del self[:-maxlen]

    def append(self, item: _T) -> None:
        super().append(item)
        if len(self) > self.maxlen:
            del self[0]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.maxlen, list(self)))
