"""Environments by import path (``environment: "my_env.py:MyEnv"`` + ``environment_kwargs``), one instance per
episode, behind one adapter interface for TRL's convention (``reset(**row)``, public methods as tools, optional
``get_reward()``) and Gymnasium's text-env convention (``reset(seed=, options=)`` -> ``(obs, info)``,
``step(text)`` -> ``(obs, reward, terminated, truncated, info)``); ``environment`` may name a factory function."""

from __future__ import annotations

import inspect
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_hybrid_rollout.agentic.tools import Tool, tool_from_callable
from lightning_hybrid_rollout.errors import AgentEnvironmentError, ToolError
from lightning_hybrid_rollout.rewards.loading import resolve_import_path

__all__ = [
    "EnvironmentFactory",
    "EpisodeEnvironment",
    "GymEnvironment",
    "StepResult",
    "TrlEnvironment",
    "append_to_prompt",
    "load_environment",
]

logger = logging.getLogger(__name__)

#: Methods of a TRL-style environment that are not tools.
NOT_TOOLS = frozenset({"reset", "get_reward", "close", "state_dict", "load_state_dict"})


@dataclass(frozen=True)
class StepResult:
    """What one environment step answers.

    Args:
        observation: The text the model reads next (a ``user`` message).
        reward: This step's reward.
        terminated: The task ended (success or failure).
        truncated: The environment cut the episode short.
        info: The environment's extra data.
        error: A contract breach (counted; the episode ends), else ``None``.
    """

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def done(self) -> bool:
        """True if the episode ends here."""
        return self.terminated or self.truncated or self.error is not None


class EpisodeEnvironment(ABC):
    """One episode's environment, whatever its convention.

    Attributes:
        tools: The tools the model may call in this episode (a TRL environment's public methods; none for Gym).
        kind: ``"trl"`` or ``"gym"``.
    """

    kind: str = ""
    tools: list[Tool]

    @abstractmethod
    def reset(self, row: Mapping[str, Any], seed: int | None = None) -> str | None:
        """Start the episode on a data set row: text to append to the prompt's last user message, or ``None``."""

    def step(self, action_text: str) -> StepResult:
        """Answer a model turn's text (Gym); a TRL environment answers through its tools instead."""
        raise NotImplementedError(f"a {self.kind} environment answers through its tools, not step()")

    @abstractmethod
    def reward(self) -> float | None:
        """The episode's reward from the environment (``None``: it gives none; the reward functions decide)."""

    def close(self) -> None:
        """Release the environment (calls its ``close()`` if it has one)."""
        close = getattr(getattr(self, "env", None), "close", None)
        if callable(close):
            close()


def _takes_kwargs(fn: Callable[..., Any]) -> bool:
    try:
        return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False


def _names(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class TrlEnvironment(EpisodeEnvironment):
    """TRL's convention: ``reset(**row)`` returns ``None`` or text for the prompt, its public methods are tools.

    Args:
        env: The environment instance.
        spec: Its ``environment`` item, for messages.
    """

    kind = "trl"

    def __init__(self, env: Any, spec: str) -> None:
        self.env = env
        self.spec = spec
        self.tools = []
        for name, member in inspect.getmembers(env, predicate=inspect.ismethod):
            if name.startswith("_") or name in NOT_TOOLS:
                continue
            try:
                self.tools.append(tool_from_callable(member, f"{spec}.{name}"))
            except ToolError as err:
                raise AgentEnvironmentError(
                    f"environment {spec!r}: public method {name!r} is not a tool: {err}"
                ) from err

    def reset(self, row: Mapping[str, Any], seed: int | None = None) -> str | None:
        reset = self.env.reset
        kwargs = dict(row) if _takes_kwargs(reset) else {k: v for k, v in row.items() if _names(reset, k)}
        out = reset(**kwargs)
        if out is not None and not isinstance(out, str):
            raise AgentEnvironmentError(
                f"environment {self.spec!r}: reset() returned a {type(out).__name__}; return None or text to append "
                "to the prompt"
            )
        return out

    def reward(self) -> float | None:
        get_reward = getattr(self.env, "get_reward", None)
        return None if get_reward is None else float(get_reward())


class GymEnvironment(EpisodeEnvironment):
    """Gymnasium's text-env convention (GEM's): ``reset(seed=, options=row)`` and ``step(text)`` with 5 values.

    The episode's reward is the sum of its steps' rewards. ``options`` gets the data set row only where ``reset``
    names it (or takes ``**kwargs``).

    Args:
        env: The environment instance.
        spec: Its ``environment`` item, for messages.
        on_bad_step: Called once per step of the wrong shape (the factory counts them across episodes).
    """

    kind = "gym"

    def __init__(self, env: Any, spec: str, on_bad_step: Callable[[], None] | None = None) -> None:
        self.env = env
        self.spec = spec
        self.tools = []
        self.total_reward = 0.0
        self._on_bad_step = on_bad_step

    def reset(self, row: Mapping[str, Any], seed: int | None = None) -> str | None:
        reset = self.env.reset
        kwargs: dict[str, Any] = {"seed": seed} if _names(reset, "seed") or _takes_kwargs(reset) else {}
        if row and (_names(reset, "options") or _takes_kwargs(reset)):
            kwargs["options"] = dict(row)
        out = reset(**kwargs)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AgentEnvironmentError(
                f"environment {self.spec!r}: reset() returned {type(out).__name__} {out!r:.80}; a Gymnasium "
                "environment returns (observation, info)"
            )
        self.total_reward = 0.0
        return None if out[0] is None else str(out[0])

    def step(self, action_text: str) -> StepResult:
        out = self.env.step(action_text)
        if not (isinstance(out, tuple) and len(out) == 5) or not _is_number(out[1]):
            if self._on_bad_step is not None:
                self._on_bad_step()
            shape = f"{len(out)}-tuple" if isinstance(out, tuple) else type(out).__name__
            error = (
                f"environment {self.spec!r}: step() returned a {shape} ({out!r:.80}); a Gymnasium environment returns "
                "(observation, reward, terminated, truncated, info); the episode ends"
            )
            logger.warning(error)
            return StepResult(observation="", error=error)
        obs, reward, terminated, truncated, info = out
        self.total_reward += float(reward)
        return StepResult(
            observation="" if obs is None else str(obs),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=dict(info) if isinstance(info, Mapping) else {"info": info},
        )

    def reward(self) -> float | None:
        return self.total_reward


def _is_number(value: Any) -> bool:
    try:
        return not isinstance(value, (bool, str)) and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def append_to_prompt(prompt: str | list[dict[str, Any]], text: str | None) -> str | list[dict[str, Any]]:
    """The prompt with a reset's text appended to its last user message (a plain prompt: to its text)."""
    if not text:
        return prompt
    if isinstance(prompt, str):
        return f"{prompt}\n\n{text}" if prompt else text
    messages = [dict(m) for m in prompt]
    for message in reversed(messages):
        if message.get("role") == "user":
            message["content"] = f"{message.get('content') or ''}\n\n{text}".lstrip()
            return messages
    return [*messages, {"role": "user", "content": text}]


class EnvironmentFactory:
    """Makes one environment per episode from an ``environment`` item (a class or a factory function).

    The convention is read from the instance: Gymnasium's if it has ``step`` and its ``reset`` names ``seed``
    (``reset(seed=..., options=...)``), else TRL's (where a public ``step(message: str)`` is just another tool).

    Args:
        spec: ``"my_env.py:MyEnv"``, ``"pkg.module:MyEnv"``, or a factory such as ``"gem:make"``.
        kwargs: ``environment_kwargs``: the constructor's (or factory's) keyword arguments.
        convention: ``"auto"`` (read from the instance), ``"trl"`` or ``"gym"``.

    Attributes:
        made: Environments made. bad_steps: Gym steps of the wrong shape (each ended its episode).
    """

    def __init__(self, spec: str, kwargs: Mapping[str, Any] | None = None, convention: str = "auto") -> None:
        if convention not in ("auto", "trl", "gym"):
            raise AgentEnvironmentError(f"environment convention must be auto, trl or gym, got {convention!r}")
        self.spec = str(spec)
        self.kwargs = dict(kwargs or {})
        self.convention = convention
        self.target = resolve_import_path(self.spec, kind="environment", error=AgentEnvironmentError)
        if not callable(self.target):
            raise AgentEnvironmentError(
                f"environment {self.spec!r} is a {type(self.target).__name__}, not a class or factory function"
            )
        if inspect.isclass(self.target) and not callable(getattr(self.target, "reset", None)):
            raise AgentEnvironmentError(f"environment {self.spec!r} has no reset() method; define reset(self, **row)")
        self.made = 0
        self.bad_steps = 0

    def make(self) -> EpisodeEnvironment:
        """A new environment for one episode."""
        try:
            env = self.target(**self.kwargs)
        except Exception as err:
            text = " ".join(str(err).split())[:300]
            raise AgentEnvironmentError(
                f"environment {self.spec!r} cannot be built with environment_kwargs {self.kwargs!r}: "
                f"{type(err).__name__}: {text}; fix environment_kwargs"
            ) from err
        if not callable(getattr(env, "reset", None)):
            raise AgentEnvironmentError(
                f"environment {self.spec!r} made a {type(env).__name__} without a reset() method; an environment "
                "defines reset()"
            )
        self.made += 1
        if self._is_gym(env):
            return GymEnvironment(env, self.spec, on_bad_step=self._count_bad_step)
        return TrlEnvironment(env, self.spec)

    def _count_bad_step(self) -> None:
        self.bad_steps += 1

    def _is_gym(self, env: Any) -> bool:
        if self.convention != "auto":
            return self.convention == "gym"
        return callable(getattr(env, "step", None)) and _names(env.reset, "seed")


def load_environment(
    spec: str, kwargs: Mapping[str, Any] | None = None, convention: str = "auto"
) -> EnvironmentFactory:
    """The factory for an ``environment`` item, checked now (path, callable, ``reset``), so a bad one fails before the
    run starts.

    Raises:
        AgentEnvironmentError: One line: path not found, not callable, no ``reset``.
    """
    return EnvironmentFactory(spec, kwargs, convention)
