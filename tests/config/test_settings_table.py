"""``lhr settings`` tables come from the field declarations: what a row says a key accepts is what the check refuses."""

from __future__ import annotations

import dataclasses

import pytest

from lightning_hybrid_rollout.config import ConfigError, RolloutConfig
from lightning_hybrid_rollout.config.settings_table import settings_table
from lightning_hybrid_rollout.lightning.cli import settings_main
from lightning_hybrid_rollout.sources.config import DatasetConfig


def test_each_key_is_one_row_with_its_default_and_what_it_accepts() -> None:
    rows = settings_table(RolloutConfig).splitlines()
    assert rows[0] == "| key | default | accepts | meaning |"
    assert len(rows) == 2 + len(dataclasses.fields(RolloutConfig))
    top_p = next(r for r in rows if r.startswith("| `top_p` |"))
    assert "| `1.0` | a number in (0, 1] |" in top_p
    with pytest.raises(ConfigError, match=r"must be a number in \(0, 1\]"):
        RolloutConfig(top_p=1.5)


def test_a_required_key_says_so() -> None:
    assert "| `path` | `(required)` |" in settings_table(DatasetConfig)


def test_lhr_settings_prints_the_named_sections_and_refuses_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert settings_main(["rewards", "agentic"]) == 0
    out = capsys.readouterr().out
    assert "## rewards" in out and "## agentic" in out and "| `max_turns` | `8` | an integer >= 1 |" in out
    assert settings_main(["rolout"]) == 2
    assert "no section 'rolout'. Did you mean 'rollout'?" in capsys.readouterr().err
