"""The ``agentic`` section (:class:`AgenticConfig`): multi-turn episodes, their tools or environment and budgets
(docs/agentic.md); bad values are collected into one :class:`~lightning_hybrid_rollout.errors.ConfigError`.

Example::

    >>> AgenticConfig(tools=["my_tools.py:add"], max_turns=4).enabled
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_hybrid_rollout.agentic.tool_parsers import DEFAULT_TOOL_PARSER
from lightning_hybrid_rollout.config.base import Checker, ConfigBase
from lightning_hybrid_rollout.config.fields import custom, integer, real, text

__all__ = ["DEFAULT_MAX_EPISODE_TOKENS", "AgenticConfig"]

#: An episode's token budget when neither ``max_episode_tokens`` nor ``rollout.max_model_len`` is set.
DEFAULT_MAX_EPISODE_TOKENS = 4096


def _paths_problems(key: str, value: Any) -> list[str]:
    if isinstance(value, (list, tuple)) and all((isinstance(v, str) and v.strip()) or callable(v) for v in value):
        return []
    return [f"{key} must be a list of import paths (or functions), got {value!r}. E.g. ['my_tools.py:add']."]


@dataclass
class AgenticConfig(ConfigBase):
    """The ``agentic`` section of the callback: multi-turn episodes (tools, an environment, their budgets)."""

    tools: tuple[str, ...] = custom(
        (), requirement="a list of import paths or functions", check=lambda cfg, key, value: _paths_problems(key, value)
    )
    """Tools by import path (``"my_tools.py:add"``): typed functions with a Google-style docstring."""
    environment: str | None = text(
        None, nullable=True, fix="Name it by import path, e.g. 'my_envs.py:GuessEnv' or 'gem:make'."
    )
    """An environment class or factory by import path, one instance per episode (TRL's or Gymnasium's convention)."""
    environment_kwargs: Mapping[str, Any] = custom(
        default_factory=dict,
        requirement="a mapping of constructor arguments",
        check=lambda cfg, key, value: (
            [] if isinstance(value, Mapping) else [f"{key} must be a mapping, got {value!r}."]
        ),
    )
    """Keyword arguments of the environment's constructor (or factory)."""
    tool_parser: str = text(DEFAULT_TOOL_PARSER, fix="Use a registered parser name, e.g. 'hermes'.")
    """The tool-call parser's registered name (``register_tool_parser``)."""
    max_turns: int = integer(8, at_least=1, fix="E.g. 8 model turns per episode.")
    """The most model turns of one episode."""
    max_episode_tokens: int | None = integer(
        None, at_least=1, nullable=True, fix="Use null (the engines' max_model_len) or e.g. 4096."
    )
    """The most tokens of one episode's trained sequence, prompt included. ``None``: the engines'
    ``rollout.max_model_len`` (or, with that left out too, ``DEFAULT_MAX_EPISODE_TOKENS`` or the model's own
    context where that is shorter, which the engines then take as theirs); see ``fit_episode_budget``."""
    tool_timeout_s: float = real(30.0, above=0.0, fix="E.g. 30 (seconds).")
    """The most seconds one tool call or environment call may take (past it the model reads an error)."""
    tool_workers: int = integer(16, at_least=1, fix="E.g. 16 threads.")
    """Threads running sync tools and environment calls, shared by every episode of the run."""

    SECTION: ClassVar[str] = "agentic"

    def prepare(self) -> None:
        if isinstance(self.tools, (list, tuple)):
            self.tools = tuple(self.tools)
        if self.environment_kwargs is None:
            self.environment_kwargs = {}
        elif isinstance(self.environment_kwargs, Mapping):
            self.environment_kwargs = dict(self.environment_kwargs)

    def check(self, c: Checker) -> None:
        if self.environment_kwargs and not self.environment:
            c.add(
                "environment_kwargs",
                "empty when no environment is set",
                dict(self.environment_kwargs),
                "Name the environment (agentic: {environment: ...}) or drop environment_kwargs.",
            )

    @property
    def enabled(self) -> bool:
        """True when samples are multi-turn episodes (a tool or an environment is configured)."""
        return bool(self.tools or self.environment)
