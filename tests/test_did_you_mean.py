"""The package's one "did you mean": every error message suggests the closest valid name through it."""

from __future__ import annotations

from pathlib import Path

from lightning_hybrid_rollout.did_you_mean import closest, did_you_mean

PKG = Path(__file__).resolve().parents[1] / "lightning_hybrid_rollout"


def test_the_closest_valid_name_is_suggested_and_nothing_when_none_is_close() -> None:
    assert did_you_mean("promt_column", ["path", "prompt_column"]) == " Did you mean 'prompt_column'?"
    assert did_you_mean("zzz", ["path", "prompt_column"]) == ""
    assert did_you_mean("zzz", ["path"], otherwise=" See the docs.") == " See the docs."
    assert closest(3, ["3", "4"]) == "3"


def test_no_module_but_did_you_mean_computes_a_suggestion_itself() -> None:
    spelled = sorted(
        str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if "get_close_matches" in p.read_text(encoding="utf-8")
    )
    assert spelled == ["did_you_mean.py"]
