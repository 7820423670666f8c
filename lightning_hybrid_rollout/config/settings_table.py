"""``lhr settings``: a section's keys as a table (key, default, what it accepts, meaning), written from the same field
declarations the checks run on (:mod:`~lightning_hybrid_rollout.config.fields`), so the table cannot drift from
what a config is refused for."""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_hybrid_rollout.config.base import field_docs
from lightning_hybrid_rollout.config.fields import field_rule

__all__ = ["settings_table"]


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "(a section)" if dataclasses.is_dataclass(value) else repr(value)
    if f.default is dataclasses.MISSING:
        return "(required)"
    return "null" if f.default is None else repr(f.default).lower() if isinstance(f.default, bool) else repr(f.default)


def settings_table(cls: type) -> str:
    """A Markdown table of ``cls``'s keys: ``| key | default | accepts | meaning |``, one row per field."""
    docs = field_docs(cls)
    rows = ["| key | default | accepts | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        rule = field_rule(f)
        accepts = rule.requirement() if rule is not None else ""
        meaning = " ".join(docs.get(f.name, "").split()).replace("``", "`").replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{_default(f)}` | {accepts} | {meaning} |")
    return "\n".join(rows)
