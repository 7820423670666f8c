"""Multi-turn agentic episodes (model turn, tool/environment turn, ... until done): the episode's exact token
sequence, tools and their parsers, environments in TRL's and Gymnasium's conventions, and the driver the rollouter
runs them with (docs/agentic.md)."""

from __future__ import annotations

from lightning_hybrid_rollout.agentic.environments import (
    EnvironmentFactory,
    EpisodeEnvironment,
    GymEnvironment,
    StepResult,
    TrlEnvironment,
    append_to_prompt,
    load_environment,
)
from lightning_hybrid_rollout.agentic.episode import PLAIN_CHAT_TEMPLATE, Episode, EpisodeBudget, Turn
from lightning_hybrid_rollout.agentic.runtime import AgenticConfig, EpisodeDriver, EpisodeWindow
from lightning_hybrid_rollout.agentic.tool_parsers import (
    DEFAULT_TOOL_PARSER,
    HermesToolParser,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    available_tool_parsers,
    create_tool_parser,
    register_tool_parser,
)
from lightning_hybrid_rollout.agentic.tools import (
    Tool,
    ToolResult,
    ToolRunner,
    load_tools,
    template_renders_tools,
    tool_from_callable,
    tools_system_message,
)

__all__ = [
    "DEFAULT_TOOL_PARSER",
    "PLAIN_CHAT_TEMPLATE",
    "AgenticConfig",
    "EnvironmentFactory",
    "Episode",
    "EpisodeBudget",
    "EpisodeDriver",
    "EpisodeEnvironment",
    "EpisodeWindow",
    "GymEnvironment",
    "HermesToolParser",
    "ParsedTurn",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolResult",
    "ToolRunner",
    "TrlEnvironment",
    "Turn",
    "append_to_prompt",
    "available_tool_parsers",
    "create_tool_parser",
    "load_environment",
    "load_tools",
    "register_tool_parser",
    "template_renders_tools",
    "tool_from_callable",
    "tools_system_message",
]
