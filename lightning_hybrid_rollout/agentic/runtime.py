"""Multi-turn episodes in the rollouter: :class:`EpisodeDriver` is the rollouter's
:class:`~lightning_hybrid_rollout.rollout.partial_rollout.EpisodeRunner`. It renders each episode's prompt (tools
described, the environment's reset text appended), bounds each model turn, and after a finished turn runs its tool
calls or the environment's step off the rollouter's event loop (async tools awaited, sync ones and every
environment call in one bounded worker pool, each under a timeout) and appends their tokens as the chat template
renders them; :class:`AgenticConfig` holds the callback's keys and :class:`EpisodeWindow` the per-cycle metrics.
Each tool call and environment reset/step is handed, once it ended, to an optional :data:`SpanRecorder` (the run's
trace: its ``tools`` lanes)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.agentic.config import DEFAULT_MAX_EPISODE_TOKENS, AgenticConfig
from lightning_hybrid_rollout.agentic.environments import (
    EnvironmentFactory,
    EpisodeEnvironment,
    GymEnvironment,
    append_to_prompt,
    load_environment,
)
from lightning_hybrid_rollout.agentic.episode import PLAIN_CHAT_TEMPLATE, Episode, EpisodeBudget
from lightning_hybrid_rollout.agentic.tool_parsers import create_tool_parser
from lightning_hybrid_rollout.agentic.tools import (
    ToolResult,
    ToolRunner,
    load_tools,
    template_renders_tools,
    tools_system_message,
)
from lightning_hybrid_rollout.errors import AgentEnvironmentError, ConfigError

__all__ = ["DEFAULT_MAX_EPISODE_TOKENS", "AgenticConfig", "EpisodeDriver", "EpisodeWindow", "SpanRecorder"]

logger = logging.getLogger(__name__)

#: ``(name, start, end, args)`` of one ended tool call or environment call: ``time.monotonic()`` seconds, and
#: ``args`` with ``kind`` (``tool``/``environment``), ``episode``, ``turn``, ``status`` (``ok``/``error``/``timeout``)
#: and, on an error, ``error`` (its kind or text).
SpanRecorder = Callable[[str, float, float, Mapping[str, Any]], None]


@dataclass
class EpisodeWindow:
    """What the episodes finished (and their tool/environment calls) since the window was last taken."""

    episodes: int = 0
    turns_total: int = 0
    turns_max: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    env_time_s: float = 0.0
    episode_tokens: int = 0
    model_tokens: int = 0
    response_tokens: int = 0
    episodes_restarted: int = 0

    def metrics(self) -> dict[str, float]:
        """The ``rollout/*`` metrics of the window (means over its finished episodes; 0 without any)."""
        n = max(self.episodes, 1)
        return {
            "rollout/turns_mean": self.turns_total / n,
            "rollout/turns_max": float(self.turns_max),
            "rollout/tool_calls": float(self.tool_calls),
            "rollout/tool_errors": float(self.tool_errors),
            "rollout/env_time_s": self.env_time_s,
            "rollout/episode_tokens_mean": self.episode_tokens / n,
            "rollout/model_token_fraction": self.model_tokens / max(self.response_tokens, 1),
            "rollout/episodes_restarted": float(self.episodes_restarted),
        }


@dataclass
class _Live:
    """One running episode's objects (not plain data: a checkpoint cannot keep them)."""

    episode: Episode
    env: EpisodeEnvironment | None
    runner: ToolRunner
    uid: str = ""
    tool_calls: int = 0
    tool_errors: int = 0
    env_time_s: float = 0.0
    last_reason: str = "stop"


class EpisodeDriver:
    """Runs the rollouter's samples as multi-turn episodes (see the module docstring and docs/agentic.md).

    Args:
        config: The multi-turn keys; tools and the environment are loaded and checked here (one line each).
        tokenizer: The model's tokenizer (its chat template renders prompts and tool/environment turns).
        max_turn_tokens: The most tokens one model turn may have (``rollout.response_length``).
        chat_template: A template instead of the tokenizer's (:data:`PLAIN_CHAT_TEMPLATE` when it has none).
        prompt_key: The metadata key of a sample's prompt record (its ``messages``, None for a plain prompt).
        reserved_keys: Metadata keys that are not data set columns (never passed to ``reset``).
        on_span: Gets each ended tool call and environment reset/step (:data:`SpanRecorder`; the runtime sets the
            attribute when the run writes a trace).

    Raises:
        ToolError, AgentEnvironmentError, ConfigError: bad input, one line.
    """

    def __init__(
        self,
        config: AgenticConfig,
        tokenizer: Any,
        *,
        max_turn_tokens: int,
        chat_template: str | None = None,
        prompt_key: str = "lhr_prompt",
        reserved_keys: Sequence[str] = ("lhr_prompt", "rollout", "episode"),
        on_span: SpanRecorder | None = None,
    ) -> None:
        if not config.enabled:
            raise ConfigError("an EpisodeDriver needs tools or an environment")
        self.config = config
        self.tokenizer = tokenizer
        self.max_turn_tokens = int(max_turn_tokens)
        self.chat_template = chat_template or (
            None if getattr(tokenizer, "chat_template", None) else PLAIN_CHAT_TEMPLATE
        )
        self.prompt_key = prompt_key
        self.reserved_keys = frozenset(reserved_keys)
        self.tools = load_tools(list(config.tools))
        self.factory: EnvironmentFactory | None = (
            load_environment(config.environment, config.environment_kwargs) if config.environment else None
        )
        self.parser = create_tool_parser(config.tool_parser)
        episode_tokens = DEFAULT_MAX_EPISODE_TOKENS if config.max_episode_tokens is None else config.max_episode_tokens
        self.budget = EpisodeBudget(config.max_turns, episode_tokens)
        self._pool = ThreadPoolExecutor(max_workers=config.tool_workers, thread_name_prefix="lhr-env")
        self._live: dict[str, _Live] = {}
        self._renders_tools: dict[tuple[str, ...], bool] = {}
        self._lock = threading.Lock()  # the window is taken from the trainer's thread
        self._window = EpisodeWindow()
        #: Episodes restarted from their prompt since the run began (in flight at a checkpoint or a lost driver).
        self.episodes_restarted = 0
        self.on_span = on_span
        self._span_failed = False

    # ---------------------------------------------------------------------------------------- EpisodeRunner

    async def begin(self, st: Any, group: Any) -> None:
        """Start ``st``'s episode: make and reset its environment, render its prompt into ``st.prompt_ids``.

        An episode restored from a checkpoint continues at its current turn when its saved state is whole: the
        episode's turns, and its environment's ``state_dict()`` (loaded into a new instance with
        ``load_state_dict``) when it has an environment. Otherwise (an environment without ``state_dict``, one whose
        ``state_dict`` or ``load_state_dict`` raised, or a checkpoint taken while its tool ran) it restarts from its
        prompt, counted in ``rollout/episodes_restarted``.
        """
        if st.uid in self._live:
            return
        if st.episode is not None and await self._resume(st, st.episode):
            return
        if st.episode is not None or st.tokens:
            st.turn_start = st.turn_version_start = 0
            st.drop_segments()
            st.episode = None
            self.episodes_restarted += 1
            with self._lock:
                self._window.episodes_restarted += 1
            logger.info("episode %s restarted from its prompt (its checkpoint cannot continue it)", st.uid)
        env = None
        reset_text = None
        if self.factory is not None:
            row = {k: v for k, v in group.metadata.items() if k not in self.reserved_keys}
            t0 = None
            try:
                env = await self._offload(self.factory.make)
                t0 = time.monotonic()
                reset_text = await self._offload(env.reset, row, st.seed)
                self._span("env.reset", "environment", t0, st.uid, 0)
            except Exception as err:  # without a reset there is no episode: the run stops, one line
                if t0 is not None:
                    self._span("env.reset", "environment", t0, st.uid, 0, err)
                if isinstance(err, AgentEnvironmentError):
                    raise
                raise AgentEnvironmentError(
                    f"environment {self.factory.spec!r}: reset() failed for episode {st.uid}: "
                    f"{_describe(err, self)}; fix the environment"
                ) from err
        tools = [*self.tools, *(env.tools if env is not None else [])]
        record = group.metadata.get(self.prompt_key) or {}
        episode = self.first_turn(record.get("messages") or group.prompt, [t.schema for t in tools], reset_text)
        ids = episode.prompt_token_ids
        if episode.done:
            raise AgentEnvironmentError(
                f"episode {st.uid}: its prompt has {len(ids)} tokens, not under max_episode_tokens="
                f"{self.budget.max_episode_tokens}; raise max_episode_tokens or shorten the prompt"
            )
        runner = ToolRunner(tools, timeout_s=self.config.tool_timeout_s, pool=self._pool)
        live = _Live(episode, env, runner, uid=st.uid)
        self._live[st.uid] = live
        st.prompt_ids = ids
        st.loss_mask = []
        st.start_turn()
        st.episode = await self._checkpoint_summary(live)

    def first_turn(
        self, prompt: str | Sequence[Mapping[str, Any]], schemas: list[dict[str, Any]], reset_text: str | None = None
    ) -> Episode:
        """An episode at its first model turn: the prompt with the tools (in the template, or described in a system
        message where the template ignores them) and the environment's reset text, rendered and tokenized.

        Args:
            prompt: The data set's prompt: its chat messages, or plain text (one user message).
            schemas: The episode's tool schemas (the run's tools and its environment's).
            reset_text: The environment's ``reset()`` text, appended to the last user message (None: none).
        """
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        renders = self._template_renders(schemas)
        if schemas and not renders:
            messages = tools_system_message(messages, schemas, self.parser)
        messages = append_to_prompt(messages, reset_text)
        template_tools = schemas if schemas and renders else None
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=template_tools,
            chat_template=self.chat_template,
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return Episode(messages, ids, self.tokenizer, self.budget, self.chat_template, template_tools)

    def check_tools_fit(self, prompt: str | Sequence[Mapping[str, Any]]) -> None:
        """Refuse, before anything starts, tools whose descriptions leave a data set prompt no room for a model turn.

        Args:
            prompt: A data set prompt (the first one), as :meth:`first_turn` takes it.

        Raises:
            ConfigError: the prompt with the tools is not under ``max_episode_tokens``, one line.
        """
        if not self.tools:
            return
        schemas = [t.schema for t in self.tools]
        episode = self.first_turn(prompt, schemas)
        if episode.done:
            budget = self.budget.max_episode_tokens
            plain = len(self.first_turn(prompt, []).prompt_token_ids)
            raise ConfigError(
                f"agentic.tools: the first prompt renders to {len(episode.prompt_token_ids)} tokens with the "
                f"descriptions of {len(schemas)} tool{'s' if len(schemas) > 1 else ''} ({plain} without), not under "
                f"agentic.max_episode_tokens={budget}; raise max_episode_tokens and rollout.max_model_len where the "
                f"model's context allows, or use fewer tools or shorter docstrings, or a model with a longer context"
            )

    def turn_limit(self, st: Any) -> int:
        """The current turn's room: ``max_turn_tokens`` per turn, within the episode's token budget."""
        live = self._live.get(st.uid)
        if live is None or live.episode.done:
            return 0
        in_turn = len(st.tokens) - st.turn_start
        return max(0, min(self.max_turn_tokens - in_turn, live.episode.remaining_tokens - in_turn))

    async def after_turn(self, st: Any, reason: str) -> str | None:
        """Record the finished model turn; run its tool calls or the environment's step; append their tokens.

        Returns ``None`` when the next model turn follows, else the sample's finish reason (the last turn's).
        """
        live = self._live[st.uid]
        episode = live.episode
        live.last_reason = reason
        # a checkpoint taken from here until the next turn starts finds the turn ended: such an episode restarts
        st.episode = {**(st.episode or {}), "turn_ended": True}
        v0 = st.turn_version_start
        if len(st.versions) > v0:  # a turn with at least one engine segment
            ids, logprobs = st.tokens[st.turn_start :], st.logprobs[st.turn_start :]
            starts = [s - st.turn_start for s in st.segment_starts[v0:]]
            episode.add_model_turn(ids, logprobs, st.versions[v0:], starts)
        else:
            episode.finish("max_episode_tokens")
        text = episode.messages[-1].get("content") or ""
        if episode.done:
            if episode.stop_reason == "max_turns" and isinstance(live.env, GymEnvironment):
                await self._answer(live, text)  # the last action is stepped too (its reward counts), nothing appended
            return await self._end(st, live)
        messages = await self._answer(live, text)
        if episode.done or not messages:
            return await self._end(st, live)
        appended = episode.add_messages(messages)
        if appended is None:
            return await self._end(st, live)
        st.add_env_tokens(appended)
        st.episode = await self._checkpoint_summary(live)
        return None

    async def _checkpoint_summary(self, live: _Live) -> dict[str, Any]:
        """The summary plus what a checkpoint needs to continue the episode: its state and its environment's
        (``state_dict()``, if the environment has one; a Gymnasium episode's reward so far)."""
        summary = self._summary(live)
        summary["state"] = live.episode.state_dict()
        if live.env is not None:
            save = getattr(live.env.env, "state_dict", None)
            summary["env_state"] = None
            if callable(save):
                try:
                    summary["env_state"] = await self._offload(save)
                except Exception as err:  # no saved state: a checkpoint restarts this episode, the run goes on
                    logger.warning("the environment's state_dict() failed: %s", _describe(err, self))
            summary["env_reward_so_far"] = getattr(live.env, "total_reward", None)
        return summary

    async def _resume(self, st: Any, saved: dict[str, Any]) -> bool:
        """Continue a checkpointed episode at its current turn; False when its saved state cannot do it."""
        state = saved.get("state")
        if state is None or saved.get("turn_ended") or st.prompt_ids is None:
            return False
        episode = Episode.from_state_dict(state, self.tokenizer)
        if episode.prompt_token_ids != st.prompt_ids or episode.response_token_ids != st.tokens[: st.turn_start]:
            return False  # the saved turns are not the saved tokens: nothing to continue from
        env = None
        if self.factory is not None:
            if saved.get("env_state") is None:
                return False
            env = await self._offload(self.factory.make)
            load = getattr(env.env, "load_state_dict", None)
            try:
                if not callable(load):
                    raise TypeError("the environment has no load_state_dict()")
                await self._offload(load, saved["env_state"])
            except Exception as err:  # like a failed state_dict(): the episode restarts, counted; the run goes on
                logger.warning(
                    "episode %s: the environment cannot load its saved state (%s); it restarts from its prompt",
                    st.uid,
                    _describe(err, self),
                )
                await self._close_quietly(st, env)
                return False
            if isinstance(env, GymEnvironment) and saved.get("env_reward_so_far") is not None:
                env.total_reward = float(saved["env_reward_so_far"])
        tools = [*self.tools, *(env.tools if env is not None else [])]
        runner = ToolRunner(tools, timeout_s=self.config.tool_timeout_s, pool=self._pool)
        self._live[st.uid] = _Live(
            episode,
            env,
            runner,
            uid=st.uid,
            tool_calls=int(saved.get("tool_calls", 0)),
            tool_errors=int(saved.get("tool_errors", 0)),
            env_time_s=float(saved.get("env_time_s", 0.0)),
        )
        logger.debug("episode %s continues at turn %d from its checkpoint", st.uid, episode.num_model_turns + 1)
        return True

    # ---------------------------------------------------------------------------------------------- internals

    async def _answer(self, live: _Live, text: str) -> list[dict[str, Any]]:
        """The messages answering a model turn (the episode is finished instead when nothing answers it)."""
        episode = live.episode
        if isinstance(live.env, GymEnvironment):
            t0 = time.monotonic()
            turn = episode.num_model_turns
            try:
                result = await self._offload(live.env.step, text)
            except Exception as err:  # a raising or hanging step: the model reads it, the run goes on
                live.tool_errors += 1
                self._span("env.step", "environment", t0, live.uid, turn, err)
                return [{"role": "user", "content": f"Error: the environment failed: {_describe(err, self)}"}]
            finally:
                live.env_time_s += time.monotonic() - t0
            self._span("env.step", "environment", t0, live.uid, turn, result.error)
            live.tool_calls += 1
            if result.error is not None:
                live.tool_errors += 1
                episode.finish("error")
                return []
            if result.done:
                episode.finish("environment_done")
                return []
            return [{"role": "user", "content": result.observation}]
        malformed_before = self.parser.malformed
        parsed = self.parser.parse(text)
        if not parsed.wants_tools:
            episode.finish("no_tool_call")
            return []
        live.tool_errors += self.parser.malformed - malformed_before
        answers: list[dict[str, Any]] = [{"role": "tool", "content": error} for error in parsed.errors]
        for call in parsed.calls:
            t0 = time.monotonic()
            result: ToolResult = await live.runner.run(call)
            live.env_time_s += time.monotonic() - t0
            self._span(call.name, "tool", t0, live.uid, episode.num_model_turns, result.error)
            live.tool_calls += 1
            live.tool_errors += result.error is not None
            answers.append(result.message)
        return answers

    async def _end(self, st: Any, live: _Live) -> str:
        """Close the episode: its environment's reward, its summary in ``st.episode``, the window's counts."""
        self._live.pop(st.uid, None)
        episode = live.episode
        env_reward = None
        if live.env is not None:
            try:
                env_reward = await self._offload(live.env.reward)
            except Exception as err:  # the environment's fault: counted, the episode keeps no reward of its own
                live.tool_errors += 1
                logger.warning("episode %s: the environment's reward failed: %s", st.uid, _describe(err, self))
            await self._close_quietly(st, live.env)
        st.episode = self._summary(live)
        st.episode["env_reward"] = env_reward
        model = sum(st.loss_mask or [])
        with self._lock:
            w = self._window
            w.episodes += 1
            w.turns_total += episode.num_model_turns
            w.turns_max = max(w.turns_max, episode.num_model_turns)
            w.tool_calls += live.tool_calls
            w.tool_errors += live.tool_errors
            w.env_time_s += live.env_time_s
            w.episode_tokens += len(st.prompt_ids or []) + len(st.tokens)
            w.model_tokens += model
            w.response_tokens += len(st.tokens)
        return live.last_reason

    async def _close_quietly(self, st: Any, env: EpisodeEnvironment) -> None:
        """Close an episode's environment; a failing ``close()`` is logged, the run goes on."""
        try:
            await self._offload(env.close)
        except Exception as err:
            logger.warning("episode %s: the environment's close() failed: %s", st.uid, _describe(err, self))

    def _summary(self, live: _Live) -> dict[str, Any]:
        episode = live.episode
        return {
            "turns": episode.num_model_turns,
            "tool_calls": live.tool_calls,
            "tool_errors": live.tool_errors,
            "env_time_s": live.env_time_s,
            "stop_reason": episode.stop_reason,
            "messages": [dict(m) for m in episode.messages],
            "weight_versions": episode.weight_versions,
            "template_fallbacks": episode.template_fallbacks,
        }

    def _span(
        self, name: str, kind: str, t0: float, uid: str, turn: int, error: BaseException | str | None = None
    ) -> None:
        """Hand one ended call (from ``t0`` to now) to :attr:`on_span`; a failing recorder never stops an episode."""
        if self.on_span is None:
            return
        args: dict[str, Any] = {"kind": kind, "episode": uid, "turn": turn, "status": "ok"}
        if error is not None:
            timed_out = error == "timeout" or isinstance(error, TimeoutError)
            args["status"] = "timeout" if timed_out else "error"
            args["error"] = _describe(error, self) if isinstance(error, BaseException) else str(error)[:300]
        try:
            self.on_span(name, t0, time.monotonic(), args)
        except Exception as err:  # the trace is a view of the run, not part of it
            if not self._span_failed:
                self._span_failed = True
                logger.warning("recording a tool span failed (further failures are not logged): %s", err)

    def _template_renders(self, schemas: list[dict[str, Any]]) -> bool:
        key = tuple(sorted(s["function"]["name"] for s in schemas))
        if key not in self._renders_tools:
            self._renders_tools[key] = self.chat_template is None and template_renders_tools(self.tokenizer, schemas)
        return self._renders_tools[key]

    async def _offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the worker pool under ``tool_timeout_s`` (the rollouter's loop keeps serving)."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, functools.partial(fn, *args))
        return await asyncio.wait_for(future, self.config.tool_timeout_s)

    def take_window(self) -> EpisodeWindow:
        """The window's counts, and a new window (called once per cycle from the trainer's thread)."""
        with self._lock:
            window, self._window = self._window, EpisodeWindow()
        return window

    @property
    def live_episodes(self) -> int:
        """Episodes started and not yet finished."""
        return len(self._live)

    def close(self) -> None:
        """Stop the worker pool (calls still running finish on their own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _describe(err: BaseException, driver: EpisodeDriver) -> str:
    if isinstance(err, TimeoutError):
        return f"no answer within {driver.config.tool_timeout_s:g} s"
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
