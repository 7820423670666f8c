"""What a run trains on: a prompt source, how its prompts are rendered, its reward functions and its stop tokens.

A :class:`Workload` joins the user's tokenizer, prompt source and reward functions to the rollouter's two seams:
:class:`PromptFeed` (rendered, tokenized prompt items whose position is checkpointed with the rollouter) and
:class:`SampleGroupScorer` (one awaited reward-runner call per finished group, TRL's convention). See
docs/workloads.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.agentic.runtime import DEFAULT_MAX_EPISODE_TOKENS, AgenticConfig, EpisodeDriver
from lightning_hybrid_rollout.config import RolloutConfig
from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.models.context_length import model_context_length
from lightning_hybrid_rollout.rewards import GroupRewardInput, RewardConfig, RewardFunction, RewardRunner
from lightning_hybrid_rollout.rewards.loading import load_reward_functions, resolve_import_path
from lightning_hybrid_rollout.rollout.group_filter import GroupFilterFn, rewards_vary
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.rollout.vllm.tokenizer_info import ensure_pad_token, stop_token_ids
from lightning_hybrid_rollout.sources import (
    PromptRecord,
    PromptRenderer,
    PromptSource,
    SourceSpec,
    build_source,
    check_prompts_fit,
)

log = logging.getLogger(__name__)

#: The metadata key of a sample's prompt record: ``{"index", "epoch", "messages"}`` (``messages``: None if plain).
PROMPT_KEY = "lhr_prompt"
#: Metadata keys that are not data set columns (never passed to a reward function).
RESERVED_KEYS = frozenset({PROMPT_KEY, "rollout", "episode"})


class ResetPrompts(PromptSource):
    """The prompts of a run with an environment and no data set: empty rows, endlessly; each episode's prompt is
    its environment's ``reset()`` text (docs/agentic.md)."""

    name = "environment"

    def __init__(self) -> None:
        self.next = 0

    def __iter__(self) -> Iterator[PromptRecord]:
        while True:
            i, self.next = self.next, self.next + 1
            yield PromptRecord(index=i, prompt="")

    def state_dict(self) -> dict[str, Any]:
        return {"next": self.next}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.next = int(state["next"])

    @property
    def epoch(self) -> int:
        return 0


class PromptFeed:
    """The rollouter's prompt iterable over a :class:`PromptSource`: rendered, tokenized, too-long ones skipped.

    Checkpointable (``state_dict``/``load_state_dict``): its state is the source's position and the skip count.
    The source is read lazily, one record per prompt the rollouter admits, on the rollouter's loop.

    Args:
        source: The prompt source.
        renderer: Chat template + tokenization + the ``prompt_length`` rule.
    """

    def __init__(self, source: PromptSource, renderer: PromptRenderer) -> None:
        self.source = source
        self.renderer = renderer

    @property
    def skipped_too_long(self) -> int:
        """Prompts skipped since the run began because they are longer than ``prompt_length`` tokens."""
        return int(self.renderer.skipped_too_long)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for record in self.source:
            rendered = self.renderer.render(record)
            if rendered is None:
                continue
            yield {
                **record.columns,
                "prompt": rendered.text,
                "prompt_token_ids": list(rendered.token_ids),
                PROMPT_KEY: {"index": record.index, "epoch": record.epoch, "messages": rendered.messages},
            }

    def state_dict(self) -> dict[str, Any]:
        """The source's position (the next record it yields) and the skip count."""
        return {"source": self.source.state_dict(), "skipped_too_long": self.skipped_too_long}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position (before the first prompt is read)."""
        self.source.load_state_dict(state["source"])
        self.renderer.skipped_too_long = int(state.get("skipped_too_long", 0))


def last_model_turn(sample: Sample) -> list[int]:
    """An episode's last model turn (its final answer: the completion its reward functions read); a plain
    sample's whole response."""
    mask = sample.loss_mask
    if not mask:
        return list(sample.response_token_ids)
    end = len(mask)
    while end > 0 and not mask[end - 1]:
        end -= 1
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return list(sample.response_token_ids[start:end])


def cut_at_stop(token_ids: Sequence[int], stop_token_ids: Sequence[int]) -> list[int]:
    """The response's tokens before its first stop token (all of them if it has none)."""
    stops = set(stop_token_ids)
    for i, tok in enumerate(token_ids):
        if tok in stops:
            return list(token_ids[:i])
    return list(token_ids)


def columns_of(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A sample's data set columns (its metadata without the reserved keys)."""
    return {k: v for k, v in metadata.items() if k not in RESERVED_KEYS}


def decode_completions(
    token_ids: Sequence[Sequence[int]], tokenizer: Any, stop_token_ids: Sequence[int]
) -> tuple[list[list[int]], list[str]]:
    """Each completion cut at its first stop token, and its text decoded without special tokens."""
    cut = [cut_at_stop(ids, stop_token_ids) for ids in token_ids]
    return cut, [tokenizer.decode(ids, skip_special_tokens=True) for ids in cut]


def group_reward_input(samples: Sequence[Sample], tokenizer: Any, stop_token_ids: Sequence[int]) -> GroupRewardInput:
    """One group's reward-function input, in TRL's convention.

    Each completion is decoded without special tokens, cut at its first stop token; for a chat prompt ``prompts``
    holds its message list and each completion is ``[{"role": "assistant", "content": text}]``, for a plain prompt
    both are strings. Every column is a list with one value per completion (the group shares its prompt's row).

    Args:
        samples: The finished samples of one prompt group.
        tokenizer: The model's tokenizer.
        stop_token_ids: The run's stop tokens.
    """
    first = samples[0]
    record = first.metadata.get(PROMPT_KEY) or {}
    messages = record.get("messages")
    ids, texts = decode_completions([last_model_turn(s) for s in samples], tokenizer, stop_token_ids)
    return GroupRewardInput.from_prompt(
        int(record.get("index", -1)),
        list(messages) if messages is not None else first.prompt,
        texts,
        ids,
        columns_of(first.metadata),
    )


class SampleGroupScorer:
    """The rollouter's :class:`~lightning_hybrid_rollout.rollout.production.GroupScorer` for a workload.

    Args:
        runner: Runs the reward functions (off the loop, with timeouts and the ``reward_error`` rule); ``None``
            for a run whose environment gives the reward alone.
        tokenizer: Decodes the completions.
        stop_token_ids: Where a completion ends.
    """

    def __init__(self, runner: RewardRunner | None, tokenizer: Any, stop_token_ids: Sequence[int]) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.stop_token_ids = tuple(stop_token_ids)

    async def score_group(self, samples: Sequence[Sample]) -> list[float]:
        """One reward per sample: the weighted reward functions' (TRL's convention; see :func:`group_reward_input`)
        plus the episode's environment reward, where it has one."""
        rewards = [0.0] * len(samples)
        if self.runner is not None:
            result = await self.runner.score_group(group_reward_input(samples, self.tokenizer, self.stop_token_ids))
            rewards = [float(r) for r in result.rewards]
        env = [(s.metadata.get("episode") or {}).get("env_reward") for s in samples]
        return [r + (float(e) if e is not None else 0.0) for r, e in zip(rewards, env)]


@dataclass
class Workload:
    """A run's prompts, rendering, rewards and stop tokens (built by the callback before anything starts).

    Args:
        source: Where prompts come from (a data set, a toy task, a custom source).
        renderer: Chat template, tokenization and the too-long rule.
        runner: The reward functions (``None``: the environment's reward alone).
        tokenizer: The model's tokenizer.
        stop_token_ids: Every end token of the model (tokenizer and ``generation_config.json``).
        group_filter: ``samples -> keep`` for the rollouter's dynamic sampling (``rollout.filter_groups``); None:
            every group is trained on.
        episodes: Runs each sample as a multi-turn episode (tools, an environment); None: one model turn.
    """

    source: PromptSource
    renderer: PromptRenderer
    runner: RewardRunner | None
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    group_filter: GroupFilterFn | None = None
    episodes: EpisodeDriver | None = None

    def prompt_feed(self) -> PromptFeed:
        """The rollouter's prompt iterable (one per run: it reads the source)."""
        return PromptFeed(self.source, self.renderer)

    def scorer(self) -> SampleGroupScorer:
        """The rollouter's group scorer."""
        return SampleGroupScorer(self.runner, self.tokenizer, self.stop_token_ids)

    def validation_records(self) -> list[PromptRecord]:
        """The source's held-out prompts."""
        return list(self.source.validation_records())

    def close(self) -> None:
        """Stop the reward pool and the episodes' tool pool."""
        if self.runner is not None:
            self.runner.close()
        if self.episodes is not None:
            self.episodes.close()


def _reward_functions(rewards: RewardConfig, source: PromptSource, columns: list[str]) -> list[RewardFunction]:
    """The configured reward functions (checked against the data set's columns), or the source's own."""
    if rewards.reward_funcs:
        return load_reward_functions(rewards, columns=columns)
    defaults = source.default_reward_funcs()
    if not defaults:
        raise ConfigError(
            f"the prompt source {getattr(source, 'name', type(source).__name__)!r} has no reward of its own: set "
            'reward_funcs, e.g. ["my_rewards.py:accuracy"] or the built-in "math_verify" against a solution column'
        )
    weights = rewards.weights if rewards.reward_weights is not None else [1.0] * len(defaults)
    if len(weights) != len(defaults):
        raise ConfigError(
            f"reward_weights has {len(weights)} values but the source's own reward has {len(defaults)} "
            "functions; give one weight per function or leave reward_weights unset"
        )
    return [
        RewardFunction(name=getattr(fn, "__name__", type(fn).__name__), fn=fn, weight=w, spec="(the source's own)")
        for fn, w in zip(defaults, weights)
    ]


def load_group_filter(setting: bool | str) -> GroupFilterFn | None:
    """The group filter ``rollout.filter_groups`` names: :func:`rewards_vary` for True, None for False, else the
    callable at the import path (``"package.module:function"`` or ``"path/to/file.py:function"``).

    Raises:
        ConfigError: one line when the path does not import or does not name a callable.
    """
    if setting is True:
        return rewards_vary
    if not setting:
        return None
    fn = resolve_import_path(str(setting), kind="rollout.filter_groups", error=ConfigError)
    if inspect.isclass(fn) or not callable(fn):
        raise ConfigError(
            f"rollout.filter_groups {setting!r} is not a function (it is {type(fn).__name__} {fn!r:.40}): point it "
            "at a function samples -> bool (True keeps the group)"
        )
    return fn


def build_workload(
    *,
    dataset: SourceSpec | None,
    task: str,
    task_kwargs: Mapping[str, Any] | None,
    rewards: RewardConfig,
    rollout: RolloutConfig,
    tokenizer: Any,
    agentic: AgenticConfig | None = None,
) -> Workload:
    """Build and check a run's workload before anything starts (no replica, no Ray).

    The data file is loaded and its rows checked, the prompts' lengths scanned against ``rollout.prompt_length``
    (every prompt too long is an error), the reward functions imported and their signatures checked against the
    data set's columns, the group filter (``rollout.filter_groups``) imported, the stop tokens read from the
    tokenizer and ``generation_config.json``, and a pad token set if the tokenizer has none.

    Args:
        dataset: The ``dataset:`` config (a :class:`~lightning_hybrid_rollout.sources.DatasetConfig`, its mapping,
            a ``class_path`` mapping or a source); ``None``: the toy ``task``.
        task: The toy task's name (used without ``dataset``).
        task_kwargs: The toy task's constructor arguments.
        rewards: The reward functions' settings.
        rollout: The rollout config (``seed``, ``prompt_length``, ``model_path``).
        tokenizer: The model's tokenizer.
        agentic: The multi-turn keys (tools, environment, budgets); their tools and environment are loaded and
            checked here. With an environment, ``dataset`` may be ``None`` (each prompt is the reset text) and
            ``reward_funcs`` empty (the environment's reward alone).

    Raises:
        ConfigError, DatasetError, RewardFunctionError, ToolError, AgentEnvironmentError: one line naming what is
            wrong and how to fix it.
    """
    with_env = agentic is not None and bool(agentic.environment)
    if dataset is None and with_env:
        source: PromptSource = ResetPrompts()
    else:
        source = build_source(dataset if dataset is not None else task, seed=rollout.seed, task_kwargs=task_kwargs)
    cfg = getattr(source, "config", None)
    renderer = PromptRenderer(
        tokenizer,
        prompt_length=rollout.prompt_length,
        system_prompt=getattr(cfg, "system_prompt", None),
        chat_template=getattr(cfg, "chat_template", None),
    )
    check_prompts_fit(source, renderer)
    preview = source.preview(1)
    columns = sorted(preview[0].columns) if preview else []
    env_rewards_only = with_env and not rewards.reward_funcs
    functions = [] if env_rewards_only else _reward_functions(rewards, source, columns)
    ensure_pad_token(tokenizer)
    stops = stop_token_ids(rollout.model_path, tokenizer)
    group_filter = load_group_filter(rollout.filter_groups)
    episodes = None
    if agentic is not None and agentic.enabled:
        agentic, rollout = fit_episode_budget(agentic, rollout)
        episodes = EpisodeDriver(
            agentic,
            tokenizer,
            max_turn_tokens=rollout.response_length,
            prompt_key=PROMPT_KEY,
            reserved_keys=tuple(RESERVED_KEYS),
        )
        if preview and not isinstance(source, ResetPrompts):
            text, _, messages = renderer.encode(preview[0])
            episodes.check_tools_fit(messages or text)
    runner = (
        None
        if not functions
        else RewardRunner(
            functions,
            workers=rewards.reward_workers,
            pool=rewards.reward_pool,
            timeout_s=rewards.reward_timeout_s,
            on_error=rewards.reward_error,
        )
    )
    log.debug("workload: source %r, rewards %s, stop tokens %s", source, [f.name for f in functions], stops)
    return Workload(
        source=source,
        renderer=renderer,
        runner=runner,
        tokenizer=tokenizer,
        stop_token_ids=stops,
        group_filter=group_filter,
        episodes=episodes,
    )


def fit_episode_budget(
    agentic: AgenticConfig, rollout: RolloutConfig, model_dir: str | None = None
) -> tuple[AgenticConfig, RolloutConfig]:
    """The episode budget and the engines' context made to fit each other, the one left out derived from the other.

    ``max_episode_tokens`` left out takes the engines' ``rollout.max_model_len``; ``rollout.max_model_len`` left
    out takes ``max_episode_tokens`` (so an engine holds a whole episode); both left out: both
    ``DEFAULT_MAX_EPISODE_TOKENS``, or the model's own context where that is shorter (``model_dir``'s
    ``config.json``, default ``rollout.model_path``). The log says what was chosen. Single-turn runs are returned
    unchanged.

    Raises:
        ConfigError: Both set and the episode longer than the engines' context, an episode budget not above
            ``rollout.prompt_length``, or an episode budget longer than the model's context with
            ``rollout.max_model_len`` left out (the engines would take it): one line each.
    """
    if not agentic.enabled:
        return agentic, rollout
    context = model_context_length(model_dir if model_dir is not None else rollout.model_path)
    episode = agentic.max_episode_tokens
    if episode is None:
        if rollout.max_model_len is not None:
            episode, source = rollout.max_model_len, "rollout.max_model_len"
        elif context is not None and context[0] < DEFAULT_MAX_EPISODE_TOKENS:
            episode, source = context[0], f"the model's context, config.json's {context[1]}"
        else:
            episode, source = DEFAULT_MAX_EPISODE_TOKENS, "the default"
        agentic = dataclasses.replace(agentic, max_episode_tokens=episode)
        log.info("max_episode_tokens left out: %d (%s)", episode, source)
    if episode <= rollout.prompt_length:
        raise ConfigError(
            f"max_episode_tokens ({episode}) must exceed rollout.prompt_length ({rollout.prompt_length}): an "
            "episode's prompt is part of its budget; raise max_episode_tokens or lower rollout.prompt_length"
        )
    if rollout.max_model_len is None:
        if context is not None and episode > context[0]:
            raise ConfigError(
                f"max_episode_tokens ({episode}) is longer than the model's context ({context[0]}, config.json's "
                f"{context[1]}), and rollout.max_model_len left out would take it: lower max_episode_tokens to at "
                f"most {context[0]}, or leave it out"
            )
        engines = max(episode, rollout.engine_max_model_len())
        rollout = dataclasses.replace(rollout, max_model_len=engines)
        log.info("rollout.max_model_len left out: %d (an engine holds a whole episode of max_episode_tokens)", engines)
    if episode > rollout.engine_max_model_len():
        raise ConfigError(
            f"max_episode_tokens ({episode}) exceeds the engines' max_model_len ({rollout.engine_max_model_len()}): "
            "set rollout.max_model_len to at least max_episode_tokens, or leave one of the two out"
        )
    return agentic, rollout


def load_workload(
    *,
    dataset: SourceSpec | None,
    task: str,
    task_kwargs: Mapping[str, Any] | None,
    rewards: RewardConfig,
    rollout: RolloutConfig,
    agentic: AgenticConfig | None = None,
) -> Workload:
    """:func:`build_workload` with the tokenizer of ``rollout.model_path`` (loaded here, before anything starts)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(rollout.model_path)
    return build_workload(
        dataset=dataset,
        task=task,
        task_kwargs=task_kwargs,
        rewards=rewards,
        rollout=rollout,
        tokenizer=tokenizer,
        agentic=agentic,
    )


def attach_batch_source(datamodule: Any, next_batch: Callable[[], list[Sample]], pad_token_id: int | None) -> None:
    """Let the trainer's data module take its batches from ``next_batch`` and pad with the tokenizer's pad token.

    Raises:
        ConfigError: the data module has no ``attach_source(fn)`` (e.g. none was passed to ``trainer.fit``).
    """
    if datamodule is None or not hasattr(datamodule, "attach_source"):
        raise ConfigError(
            [
                "HybridRolloutCallback needs a data module with attach_source(fn), e.g. "
                "lightning_hybrid_rollout.lightning.data.RolloutDataModule: pass datamodule=RolloutDataModule() "
                "to trainer.fit"
            ]
        )
    datamodule.attach_source(next_batch)
    if hasattr(datamodule, "pad_token_id") and pad_token_id is not None:
        datamodule.pad_token_id = pad_token_id
