"""Held-out validation of an agentic run: :class:`EpisodeValidationSet` plays each held-out prompt (or, with an
environment and no data set, each held-out seed) as one whole greedy episode against the run's own environment and
tools, and :class:`EpisodeValidationResult` keeps sums reported as ``val/episode_reward``, ``val/turns`` and the
tool counts (docs/agentic.md, "Validation"); the single-answer set it extends is :mod:`.validation`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.rewards import RewardRunner
from lightning_hybrid_rollout.run.workload import PROMPT_KEY, ResetPrompts, group_reward_input
from lightning_hybrid_rollout.sources import PromptRecord, PromptRenderer
from lightning_hybrid_rollout.validation.answers import (
    DEFAULT_VAL_SEED,
    VAL_ENV_REWARD,
    VAL_EPISODE_REWARD,
    VAL_REWARD_ERRORS,
    VAL_TOOL_CALLS,
    VAL_TOOL_ERRORS,
    VAL_TRUNCATED_FRACTION,
    VAL_TURNS,
    ValidationItem,
    ValidationSet,
    pass_at_key,
    reward_mean_key,
)

if TYPE_CHECKING:
    import torch

    from lightning_hybrid_rollout.agentic.runtime import EpisodeDriver
    from lightning_hybrid_rollout.run.workload import Workload

__all__ = ["EpisodeValidationResult", "EpisodeValidationSet"]

log = logging.getLogger(__name__)


@dataclass
class EpisodeValidationResult:
    """Sums over held-out episodes; :meth:`merge` adds two results, :meth:`metrics` gives the means.

    Args:
        num_episodes: Episodes played (one per held-out prompt).
        reward_sum: Sum of their rewards (reward functions' weighted sum plus the environment's reward).
        passed: Episodes whose reward is ``>= pass_threshold``.
        turns_sum: Sum of their model turns.
        env_reward_sum: Sum of the environment rewards of the episodes whose environment gave one.
        env_rewards: How many episodes those are.
        tool_calls: Tool calls and environment steps run.
        tool_errors: Of those, the ones answered with an error (or malformed).
        truncated: Episodes that ended at ``max_episode_tokens``.
        function_sums: Each reward function's sum over the episodes it scored (``None`` values left out).
        function_counts: How many episodes each function scored.
        reward_errors: Failed reward calls (``reward_error: zero``).
    """

    num_episodes: int = 0
    reward_sum: float = 0.0
    passed: int = 0
    turns_sum: int = 0
    env_reward_sum: float = 0.0
    env_rewards: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    truncated: int = 0
    function_sums: dict[str, float] = field(default_factory=dict)
    function_counts: dict[str, int] = field(default_factory=dict)
    reward_errors: int = 0

    @property
    def n(self) -> int:
        """Episodes per held-out prompt: always 1 (greedy)."""
        return 1

    @property
    def mean_reward(self) -> float:
        """Mean episode reward (NaN before any episode)."""
        return self.reward_sum / self.num_episodes if self.num_episodes else math.nan

    @property
    def mean_turns(self) -> float:
        """Mean model turns per episode (NaN before any episode)."""
        return self.turns_sum / self.num_episodes if self.num_episodes else math.nan

    def merge(self, other: EpisodeValidationResult) -> EpisodeValidationResult:
        """The result over both sets of episodes (sums added; neither input is changed)."""
        names = dict.fromkeys([*self.function_counts, *other.function_counts])
        sums = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("function_sums", "function_counts")
        }
        return EpisodeValidationResult(
            **sums,
            function_sums={k: self.function_sums.get(k, 0.0) + other.function_sums.get(k, 0.0) for k in names},
            function_counts={k: self.function_counts.get(k, 0) + other.function_counts.get(k, 0) for k in names},
        )

    @classmethod
    def combine(cls, results: Iterable[EpisodeValidationResult], n: int | None = None) -> EpisodeValidationResult:
        """All ``results`` merged into one (``n`` is accepted for :meth:`ValidationResult.combine`'s signature)."""
        total = cls()
        for r in results:
            total = total.merge(r)
        return total

    def metrics(self) -> dict[str, float]:
        """The metrics by name (empty before any episode): ``val/episode_reward``, ``val/turns``, ``val/pass@1``,
        ``val/truncated_fraction``, ``val/tool_calls``, ``val/tool_errors``, ``val/reward_errors``, and
        ``val/env_reward`` (with an environment) and ``val/rewards/<name>_mean`` (with reward functions)."""
        if not self.num_episodes:
            return {}
        out = {VAL_EPISODE_REWARD: self.mean_reward, VAL_TURNS: self.mean_turns}
        out[pass_at_key(1)] = self.passed / self.num_episodes
        out[VAL_TRUNCATED_FRACTION] = self.truncated / self.num_episodes
        out[VAL_TOOL_CALLS] = float(self.tool_calls)
        out[VAL_TOOL_ERRORS] = float(self.tool_errors)
        out[VAL_REWARD_ERRORS] = float(self.reward_errors)
        if self.env_rewards:
            out[VAL_ENV_REWARD] = self.env_reward_sum / self.env_rewards
        means = {name: self.function_sums[name] / c for name, c in self.function_counts.items() if c}
        return out | {reward_mean_key(name): v for name, v in means.items()}


class EpisodeValidationSet(ValidationSet):
    """An agentic run's held-out episodes, played greedily by the trainer's model against the run's environment and
    tools, and scored as the rollouter scores a training episode.

    Each held-out prompt is one episode, run by an :class:`~lightning_hybrid_rollout.agentic.runtime.EpisodeDriver`
    of its own (the training one's tools, environment, parser, chat template and budgets: ``max_turns``,
    ``max_episode_tokens``, ``rollout.response_length`` per model turn): its environment is reset with the record's
    columns and seed ``seed + record index``, each model turn is the model's greedy answer (``temperature`` 0, cut
    after its first stop token), each tool/environment turn is appended as in training, until the episode ends.
    Its reward is the run's reward functions' on its last model turn (if any) plus its environment's reward. A run
    with an environment and no data set plays ``limit`` episodes (seeds ``seed``, ``seed + 1``, ...) from the
    environment's reset text alone. The episodes of a batch advance turn by turn together (one ``generate`` call per
    turn for the batch's unfinished episodes, left-padded).

    Args:
        records: The held-out prompt records.
        renderer: The run's renderer.
        runner: The reward functions (a runner of their own), or ``None``: the environment's reward alone.
        tokenizer: The model's tokenizer.
        stop_token_ids: The run's stop tokens.
        driver: Plays the episodes (its ``max_turn_tokens`` bounds each model turn).
        seed: Record ``i``'s episode gets seed ``seed + i`` (its environment's ``reset``).
        pass_threshold: An episode passes (``val/pass@1``) when its reward is ``>=`` this.
        batch_size: Episodes per :meth:`batches` batch.
        limit: The most episodes; ``None``: every held-out record.
        owns_runner: :meth:`close` closes ``runner``.
        owns_driver: :meth:`close` closes ``driver``.

    Example::

        vs = EpisodeValidationSet.from_workload(workload, limit=16)
        result = EpisodeValidationResult.combine(vs.generate_and_score(model, b, "cpu") for b in vs.batches())
        result.metrics()  # {"val/episode_reward": 0.25, "val/turns": 2.6, ...}
    """

    def __init__(
        self,
        records: Sequence[PromptRecord],
        renderer: PromptRenderer,
        runner: RewardRunner | None,
        tokenizer: Any,
        stop_token_ids: Sequence[int],
        driver: EpisodeDriver,
        *,
        seed: int = DEFAULT_VAL_SEED,
        pass_threshold: float = 1.0,
        batch_size: int = 64,
        limit: int | None = None,
        owns_runner: bool = False,
        owns_driver: bool = False,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"validation seed must be an integer, got {seed!r}")
        super().__init__(
            records,
            renderer,
            runner,  # type: ignore[arg-type]  (None: the environment's reward alone)
            tokenizer,
            stop_token_ids,
            max_new_tokens=driver.max_turn_tokens,
            n=1,
            temperature=0,
            pass_threshold=pass_threshold,
            batch_size=batch_size,
            limit=limit,
            owns_runner=owns_runner and runner is not None,
        )
        self.driver = driver
        self.seed = seed
        self.owns_driver = owns_driver

    @classmethod
    def from_workload(  # type: ignore[override]
        cls,
        workload: Workload,
        *,
        n: int = 1,
        temperature: float | None = None,
        pass_threshold: float = 1.0,
        batch_size: int = 64,
        limit: int | None = None,
        seed: int = DEFAULT_VAL_SEED,
        max_new_tokens: int | None = None,
    ) -> EpisodeValidationSet:
        """The held-out episodes of an agentic run (its workload has an ``EpisodeDriver``).

        The episodes run in a driver of their own and the reward functions in a runner of their own (the
        workload's settings), so validation never shows in the training ``rollout/*`` or ``train/rewards/*``
        metrics; :meth:`close` shuts both down. With an environment and no data set, ``limit`` (64 when ``None``)
        episodes are played from its reset text.

        Args:
            workload: The run's workload.
            n: Samples per prompt of single-answer validation: unused (one greedy episode per prompt), logged if not 1.
            temperature: Unused likewise (episodes are greedy), logged if not ``None`` or 0.
            pass_threshold: An episode passes when its reward is ``>=`` this.
            batch_size: Episodes per batch.
            limit: The most episodes.
            seed: The first held-out episode's seed.
            max_new_tokens: Ignored: each model turn is bounded by the driver's ``rollout.response_length``.

        Raises:
            ConfigError: the workload is not agentic (``n`` / ``temperature`` other than one greedy episode are logged
                as unused: a single-answer config given an environment validates as it is).
        """
        from lightning_hybrid_rollout.agentic.runtime import EpisodeDriver

        train = workload.episodes
        if train is None:
            raise ConfigError(
                "episode validation needs an agentic run (tools or an environment); a single-turn run validates "
                "with ValidationSet"
            )
        if n != 1 or temperature not in (None, 0):  # a single-answer config given an environment still validates
            log.info(
                "validation of an agentic run plays one greedy episode per held-out prompt: val_n=%r and "
                "val_temperature=%r are for single answers and left unused",
                n,
                temperature,
            )
        records = workload.validation_records()
        if not records and isinstance(workload.source, ResetPrompts):  # the environment's reset text alone
            records = [PromptRecord(index=i, prompt="") for i in range(64 if limit is None else limit)]
        runner = None
        if workload.runner is not None:
            r = workload.runner
            runner = RewardRunner(
                r.functions, workers=r.workers, pool=r.pool, timeout_s=r.timeout_s, on_error=r.on_error
            )
        driver = EpisodeDriver(
            train.config,
            workload.tokenizer,
            max_turn_tokens=train.max_turn_tokens,
            chat_template=train.chat_template,
            prompt_key=train.prompt_key,
            reserved_keys=tuple(train.reserved_keys),
        )
        return cls(
            records,
            workload.renderer,
            runner,
            workload.tokenizer,
            workload.stop_token_ids,
            driver,
            seed=seed,
            pass_threshold=pass_threshold,
            batch_size=batch_size,
            limit=limit,
            owns_runner=True,
            owns_driver=True,
        )

    def score(self, items: Sequence[ValidationItem], generated: Sequence[Sequence[Sequence[int]]]) -> Any:
        """Not used: an episode is scored as it is played (:meth:`generate_and_score`)."""
        raise NotImplementedError("EpisodeValidationSet plays and scores whole episodes: use generate_and_score")

    def generate_and_score(
        self, model: Any, items: Sequence[ValidationItem], device: torch.device | str | None = None
    ) -> EpisodeValidationResult:  # type: ignore[override]
        """Play one batch of held-out episodes with ``model`` (greedy) and score them (see the class doc).

        The model runs in eval mode under ``torch.no_grad()``; its train/eval mode is restored afterwards.

        Raises:
            AgentEnvironmentError: an environment's ``reset()`` failed (as in training: no episode without it).
            RewardFunctionError: a reward call failed and the runner's ``on_error`` is ``"fail"``.
        """
        items = list(items)
        if not items:
            return EpisodeValidationResult()
        if device is None:
            device = next(iter(model.parameters())).device
        was_training = bool(getattr(model, "training", False))
        model.eval()
        try:
            result = _run_coroutine(self._play(model, items, device))
        finally:
            model.train(was_training)
        log.debug(
            "validation batch: %d episodes, mean reward %.4f, %.2f turns",
            len(items),
            result.mean_reward,
            result.mean_turns,
        )
        return result

    async def _play(self, model: Any, items: Sequence[ValidationItem], device: Any) -> EpisodeValidationResult:
        """Play ``items``' episodes turn by turn together, then score each."""
        import asyncio

        from lightning_hybrid_rollout.rollout.sample_state import PromptGroup, SampleState

        driver = self.driver
        games: list[tuple[SampleState, PromptGroup]] = []
        for item in items:
            uid = f"val-{item.index}"
            st = SampleState(uid=uid, group_id=uid, index=0, seed=self.seed + item.index)
            metadata = {**item.columns, PROMPT_KEY: {"index": item.index, "epoch": 0, "messages": item.messages}}
            games.append((st, PromptGroup(uid, item.text, list(item.token_ids), metadata, [st])))
        await asyncio.gather(*(driver.begin(st, group) for st, group in games))
        reasons: dict[str, str] = {}
        playing = [st for st, _ in games]
        while playing:
            ready: list[tuple[SampleState, int]] = []
            for st in playing:
                limit = driver.turn_limit(st)
                if limit <= 0:  # the episode is out of room: its driver ends it (as the rollouter does)
                    reason = await driver.after_turn(st, "length")
                    limit = driver.turn_limit(st) if reason is None else 0
                    if limit <= 0:
                        reasons[st.uid] = reason or "length"
                        continue
                ready.append((st, limit))
            if not ready:
                break
            turns = self._generate_turn(
                model, [st.prompt_ids + st.tokens for st, _ in ready], [n for _, n in ready], device
            )
            for (st, _), tokens in zip(ready, turns, strict=True):
                st.keep_segment(tokens, [0.0] * len(tokens), 0, "validation", final=True)
            stops = set(self.stop_token_ids)
            ends = [("stop" if tokens and tokens[-1] in stops else "length") for tokens in turns]
            after = await asyncio.gather(*(driver.after_turn(st, end) for (st, _), end in zip(ready, ends)))
            playing = []
            for (st, _), reason in zip(ready, after):
                if reason is None:
                    playing.append(st)
                else:
                    reasons[st.uid] = reason
        return await self._score(games, reasons)

    def _generate_turn(
        self, model: Any, sequences: Sequence[Sequence[int]], limits: Sequence[int], device: Any
    ) -> list[list[int]]:
        """One greedy model turn of each sequence: at most its limit of tokens, up to and including its first stop
        token (as an engine returns a turn that stopped)."""
        import torch

        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.stop_token_ids[0]
        width = max(len(s) for s in sequences)
        input_ids = torch.full((len(sequences), width), int(pad), dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):  # left padding: every sequence ends where its turn starts
            input_ids[row, width - len(seq) :] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq) :] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max(limits),
                eos_token_id=list(self.stop_token_ids),
                pad_token_id=int(pad),
                num_return_sequences=1,
                do_sample=False,
            )
        stops = set(self.stop_token_ids)
        turns = []
        for new, limit in zip(out[:, width:].tolist(), limits, strict=True):
            new = new[:limit]
            end = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))
            turns.append(new[:end])
        return turns

    async def _score(self, games: Sequence[tuple[Any, Any]], reasons: dict[str, str]) -> EpisodeValidationResult:
        """Each finished episode's reward: the reward functions' on its last model turn plus its environment's."""
        result = EpisodeValidationResult()
        for st, group in games:
            sample = st.to_sample(group, reasons.get(st.uid, "length"), now=0.0)
            episode = sample.metadata.get("episode") or {}
            reward = 0.0
            if self.runner is not None:
                scored = await self.runner.score_group(
                    group_reward_input([sample], self.tokenizer, self.stop_token_ids)
                )
                reward = float(scored.rewards[0])
                result.reward_errors += scored.errors
                for name, values in scored.per_function.items():
                    got = [v for v in values if v is not None]
                    result.function_sums[name] = result.function_sums.get(name, 0.0) + float(sum(got))
                    result.function_counts[name] = result.function_counts.get(name, 0) + len(got)
            env_reward = episode.get("env_reward")
            if env_reward is not None:
                reward += float(env_reward)
                result.env_reward_sum += float(env_reward)
                result.env_rewards += 1
            result.num_episodes += 1
            result.reward_sum += reward
            result.passed += reward >= self.pass_threshold
            result.turns_sum += int(episode.get("turns", 0))
            result.tool_calls += int(episode.get("tool_calls", 0))
            result.tool_errors += int(episode.get("tool_errors", 0))
            result.truncated += episode.get("stop_reason") == "max_episode_tokens"
        return result

    def close(self) -> None:
        """Shut the reward runner and the episode driver down if this set owns them (:meth:`from_workload`)."""
        super().close()
        if self.owns_driver:
            self.driver.close()

    def __repr__(self) -> str:
        return (
            f"EpisodeValidationSet(records={len(self.records)}, seed={self.seed}, max_turns="
            f"{self.driver.budget.max_turns}, max_episode_tokens={self.driver.budget.max_episode_tokens}, "
            f"batch_size={self.batch_size}, limit={self.limit})"
        )


def _run_coroutine(coro: Any) -> Any:
    """``coro``'s result: on a new event loop here, or on a thread of its own if this thread runs a loop."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lhr-val") as pool:
        return pool.submit(asyncio.run, coro).result()
