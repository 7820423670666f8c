"""Fixtures for the schedule tests (the doubles themselves live in doubles.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lightning_hybrid_rollout.schedule import base
from tests.schedule.doubles import FakeClock, RecordingPool


@pytest.fixture
def log() -> list[str]:
    return []


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pool(clock: FakeClock, log: list[str]) -> RecordingPool:
    return RecordingPool(clock, log)


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, type]]:
    """A private copy of the policy registry (and entry-point bookkeeping), restored after the test."""
    registry = dict(base._REGISTRY)
    monkeypatch.setattr(base, "_REGISTRY", registry)
    monkeypatch.setattr(base, "_LOADED_ENTRY_POINTS", set())
    monkeypatch.setattr(base, "_ENTRY_POINT_ERRORS", {})
    yield registry
