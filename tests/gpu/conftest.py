"""Fixtures of the CUDA checks (``pytest -m gpu``; ``scripts/gpu_checks.sh`` runs them on a GPU machine)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gpu.gpu_report import RECORD_KEY


@pytest.fixture
def gpu_record(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A dict the test fills with its figures (``*_mib``, ``*_s``, ``note``), attached to the test's report.

    It is the test's ``user_properties`` entry ``gpu_check`` (so JUnit XML carries it too); the ``gpu_report``
    plugin writes it into the per-test JSON record. Fill it before asserting: a failed check keeps its figures.
    """
    record: dict[str, Any] = {}
    request.node.user_properties.append((RECORD_KEY, record))
    return record
