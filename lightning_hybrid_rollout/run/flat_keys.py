"""The callback's flat reward and multi-turn keys of earlier releases, folded into their sections.

``reward_funcs=...`` or ``max_turns=...`` given to ``HybridRolloutCallback`` directly still work for one release,
with one deprecation line; their place is now the ``rewards`` (:class:`~lightning_hybrid_rollout.rewards.RewardConfig`)
and ``agentic`` (:class:`~lightning_hybrid_rollout.agentic.runtime.AgenticConfig`) sections. A YAML file using them
gets one line naming the new key (``lhr``'s config check, :func:`moved_key_hint`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
from lightning_hybrid_rollout.config import ConfigError
from lightning_hybrid_rollout.rewards import RewardConfig

__all__ = ["FLAT_KEYS", "fold_flat_keys", "moved_key_hint", "section"]

#: Each flat key of earlier releases and the section it lives in now.
FLAT_KEYS: dict[str, str] = {
    **{f.name: "rewards" for f in dataclasses.fields(RewardConfig)},
    **{f.name: "agentic" for f in dataclasses.fields(AgenticConfig)},
}


def section(cls: type, value: Any) -> Any:
    """``value`` as a ``cls`` section: an instance as it is, a mapping through its keys, None as the defaults."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        if hasattr(cls, "from_dict"):
            return cls.from_dict(value)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ConfigError([f"{cls.__name__} has no key {', '.join(map(repr, unknown))}; valid: {sorted(names)}"])
        return cls(**value)
    raise ConfigError([f"expected a {cls.__name__} or a mapping of its keys, got {value!r}"])


def fold_flat_keys(
    rewards: RewardConfig | Mapping[str, Any] | None,
    agentic: AgenticConfig | Mapping[str, Any] | None,
    flat: Mapping[str, Any],
) -> tuple[RewardConfig, AgenticConfig]:
    """The ``rewards`` and ``agentic`` sections (objects, mappings or None: the defaults) with the flat keys of
    ``flat`` set in them (a deprecation line naming each).

    Raises:
        TypeError: A key that is neither a flat key of an earlier release nor an argument (Python's own message).
    """
    rewards, agentic = section(RewardConfig, rewards), section(AgenticConfig, agentic)
    unknown = [k for k in flat if k not in FLAT_KEYS]
    if unknown:
        raise TypeError(f"HybridRolloutCallback() got an unexpected keyword argument {unknown[0]!r}")
    if not flat:
        return rewards, agentic
    warnings.warn(
        "HybridRolloutCallback: "
        + "; ".join(moved_key_hint(k) for k in flat)
        + " (the flat keys go in a later release)",
        FutureWarning,
        stacklevel=3,
    )
    by = {s: {k: v for k, v in flat.items() if FLAT_KEYS[k] == s} for s in ("rewards", "agentic")}
    if by["rewards"]:
        rewards = dataclasses.replace(rewards, **by["rewards"])
    if by["agentic"]:
        agentic = dataclasses.replace(agentic, **by["agentic"])
    return rewards, agentic


def moved_key_hint(key: str) -> str:
    """``"`max_turns` moved into the `agentic:` section (agentic: {max_turns: ...})"`` for a flat key."""
    where = FLAT_KEYS[key]
    return f"`{key}` moved into the `{where}:` section ({where}: {{{key}: ...}})"
