"""Validation that scores generated answers with the run's own reward functions and reports pass@k.

:class:`ValidationSet` answers the source's held-out prompts with the trainer's model and scores each prompt's ``n``
answers with one reward-runner call, in the rollouter's convention; :class:`ValidationResult` keeps sums, so merged
batches give the exact metrics of the whole set (docs/grpo.md).

Example::

    vs = ValidationSet.from_workload(workload, max_new_tokens=rollout.response_length, n=4)
    result = ValidationResult.combine(vs.generate_and_score(model, batch, "cuda") for batch in vs.batches())
    print(result.metrics())  # {"val/reward": ..., "val/pass@1": ..., "val/pass@4": ..., ...}

An agentic run (tools or an environment) validates with whole greedy episodes instead
(:mod:`.episode_validation`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.rewards import GroupRewardInput, RewardRunner
from lightning_hybrid_rollout.run.workload import cut_at_stop
from lightning_hybrid_rollout.sources import Messages, PromptRecord, PromptRenderer

if TYPE_CHECKING:
    import torch

    from lightning_hybrid_rollout.run.workload import Workload

__all__ = [
    "DEFAULT_VAL_SEED",
    "VAL_ENV_REWARD",
    "VAL_EPISODE_REWARD",
    "VAL_PASS_AT",
    "VAL_REWARD",
    "VAL_REWARD_ERRORS",
    "VAL_REWARD_MEAN",
    "VAL_TOOL_CALLS",
    "VAL_TOOL_ERRORS",
    "VAL_TRUNCATED_FRACTION",
    "VAL_TURNS",
    "ValidationItem",
    "ValidationResult",
    "ValidationSet",
    "item_reward_input",
    "pass_at_k",
    "pass_at_key",
    "reward_mean_key",
]

log = logging.getLogger(__name__)

#: Mean weighted reward over every validation sample.
VAL_REWARD = "val/reward"
#: pass@k (``VAL_PASS_AT.format(k=k)``: ``val/pass@1`` and ``val/pass@<n>``), averaged over prompts.
VAL_PASS_AT = "val/pass@{k}"
#: Fraction of samples that reached ``max_new_tokens`` without a stop token.
VAL_TRUNCATED_FRACTION = "val/truncated_fraction"
#: Mean of one reward function over the samples it scored (``None`` values left out).
VAL_REWARD_MEAN = "val/rewards/{name}_mean"
#: Failed reward calls (``reward_error: zero``; each scored 0.0).
VAL_REWARD_ERRORS = "val/reward_errors"
#: Mean reward of a held-out episode: its reward functions' weighted sum plus its environment's reward.
VAL_EPISODE_REWARD = "val/episode_reward"
#: Mean model turns per held-out episode.
VAL_TURNS = "val/turns"
#: Mean environment reward per held-out episode (episodes whose environment gave one; runs with an environment).
VAL_ENV_REWARD = "val/env_reward"
#: Tool calls and environment steps the held-out episodes ran (summed).
VAL_TOOL_CALLS = "val/tool_calls"
#: Of those, the ones answered with an error (or malformed), summed.
VAL_TOOL_ERRORS = "val/tool_errors"
#: The first held-out episode's seed (``RolloutDataModule(val_seed=...)``'s default): record ``i`` plays seed
#: ``val_seed + i``, so every validation replays the same episodes.
DEFAULT_VAL_SEED = 10_000


def pass_at_key(k: int) -> str:
    """The metric name of pass@``k``: ``val/pass@<k>``."""
    return VAL_PASS_AT.format(k=k)


def reward_mean_key(name: str) -> str:
    """The metric name of a reward function's mean: ``val/rewards/<name>_mean``."""
    return VAL_REWARD_MEAN.format(name=name)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one prompt: ``1 - C(n - c, k) / C(n, k)``.

    The chance that at least one of ``k`` samples drawn without replacement from the ``n`` generated ones passes.

    Args:
        n: Samples generated for the prompt.
        c: How many of them passed.
        k: Samples drawn (``1 <= k <= n``).

    Raises:
        ConfigError: ``n < 1``, ``c`` outside ``[0, n]`` or ``k`` outside ``[1, n]``.

    Example::

        >>> pass_at_k(5, 2, 1), pass_at_k(5, 2, 2)
        (0.4, 0.7)
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ConfigError(f"pass_at_k needs n >= 1, 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class ValidationItem:
    """One held-out prompt, rendered for the model (not frozen: Lightning's batch transfer rebuilds dataclasses).

    Args:
        index: The record's index in its data set.
        prompt: The record's prompt: its string, or its message list.
        text: The rendered text (after the chat template, if one was applied).
        token_ids: The rendered prompt's token ids.
        messages: The messages given to the chat template (system prompt included), or ``None`` for plain text.
        columns: The record's other fields (the reward functions' keyword arguments).
    """

    index: int
    prompt: str | Messages
    text: str
    token_ids: list[int]
    messages: Messages | None
    columns: dict[str, Any] = field(default_factory=dict)


def item_reward_input(
    item: ValidationItem, completion_ids: Sequence[Sequence[int]], tokenizer: Any
) -> GroupRewardInput:
    """One prompt's reward-function input, in TRL's convention (as the rollouter builds it for training).

    ``prompts`` holds the item's message list (chat) or its text, once per completion; each completion is decoded
    without special tokens, as ``[{"role": "assistant", "content": text}]`` (chat) or the text; each column is
    broadcast to one value per completion.

    Args:
        item: The prompt.
        completion_ids: Its completions' token ids, already cut at their first stop token.
        tokenizer: The model's tokenizer.
    """
    ids = [list(c) for c in completion_ids]
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in ids]
    prompt = list(item.messages) if item.messages is not None else item.text
    return GroupRewardInput.from_prompt(item.index, prompt, texts, ids, item.columns)


@dataclass
class ValidationResult:
    """Sums over validated prompts; :meth:`merge` adds two results, the properties give the means.

    Args:
        n: Samples per prompt.
        num_prompts: Prompts validated.
        num_samples: Samples scored (``n`` per prompt).
        reward_sum: Sum of the samples' weighted rewards.
        pass_at_k_sum: For each k in ``{1, n}``, the sum over prompts of :func:`pass_at_k`.
        truncated: Samples that reached ``max_new_tokens`` without a stop token.
        function_sums: Each reward function's sum over the samples it scored (``None`` values left out).
        function_counts: How many samples each function scored.
        reward_errors: Failed reward calls (``reward_error: zero``).
    """

    n: int
    num_prompts: int = 0
    num_samples: int = 0
    reward_sum: float = 0.0
    pass_at_k_sum: dict[int, float] = field(default_factory=dict)
    truncated: int = 0
    function_sums: dict[str, float] = field(default_factory=dict)
    function_counts: dict[str, int] = field(default_factory=dict)
    reward_errors: int = 0

    @property
    def ks(self) -> list[int]:
        """The k of the reported pass@k: 1 and ``n``."""
        return sorted({1, self.n})

    @property
    def mean_reward(self) -> float:
        """Mean weighted reward per sample (NaN before any sample)."""
        return self.reward_sum / self.num_samples if self.num_samples else math.nan

    @property
    def pass_at_k(self) -> dict[int, float]:
        """pass@k for k in ``{1, n}``, averaged over prompts (NaN before any prompt)."""
        return {k: self.pass_at_k_sum.get(k, 0.0) / self.num_prompts if self.num_prompts else math.nan for k in self.ks}

    @property
    def truncated_fraction(self) -> float:
        """Fraction of samples that reached ``max_new_tokens`` without a stop token (NaN before any sample)."""
        return self.truncated / self.num_samples if self.num_samples else math.nan

    @property
    def function_means(self) -> dict[str, float]:
        """Each reward function's mean over the samples it scored (functions that scored none left out)."""
        return {name: self.function_sums[name] / c for name, c in self.function_counts.items() if c}

    def merge(self, other: ValidationResult) -> ValidationResult:
        """The result over both sets of prompts (sums added; neither input is changed).

        Raises:
            ConfigError: the two results have different ``n``.
        """
        if other.n != self.n:
            raise ConfigError(f"cannot merge validation results of n={self.n} and n={other.n} samples per prompt")
        names = dict.fromkeys([*self.function_counts, *other.function_counts])
        return ValidationResult(
            n=self.n,
            num_prompts=self.num_prompts + other.num_prompts,
            num_samples=self.num_samples + other.num_samples,
            reward_sum=self.reward_sum + other.reward_sum,
            pass_at_k_sum={k: self.pass_at_k_sum.get(k, 0.0) + other.pass_at_k_sum.get(k, 0.0) for k in self.ks},
            truncated=self.truncated + other.truncated,
            function_sums={k: self.function_sums.get(k, 0.0) + other.function_sums.get(k, 0.0) for k in names},
            function_counts={k: self.function_counts.get(k, 0) + other.function_counts.get(k, 0) for k in names},
            reward_errors=self.reward_errors + other.reward_errors,
        )

    @classmethod
    def combine(cls, results: Iterable[ValidationResult], n: int | None = None) -> ValidationResult:
        """All ``results`` merged into one.

        Args:
            results: Per-batch (or per-rank) results.
            n: Samples per prompt, for an empty ``results`` (else taken from the first result).

        Raises:
            ConfigError: ``results`` is empty and no ``n`` is given, or the results have different ``n``.
        """
        items = list(results)
        if not items and n is None:
            raise ConfigError("ValidationResult.combine got no results: pass n= to combine an empty list")
        total = cls(n=items[0].n if n is None else n)
        for r in items:
            total = total.merge(r)
        return total

    def metrics(self) -> dict[str, float]:
        """The metrics by name (empty before any prompt): ``val/reward``, ``val/pass@1``, ``val/pass@<n>``,
        ``val/truncated_fraction``, ``val/reward_errors`` and ``val/rewards/<name>_mean``."""
        if not self.num_prompts:
            return {}
        out = {VAL_REWARD: self.mean_reward}
        out |= {pass_at_key(k): v for k, v in self.pass_at_k.items()}
        out[VAL_TRUNCATED_FRACTION] = self.truncated_fraction
        out[VAL_REWARD_ERRORS] = float(self.reward_errors)
        return out | {reward_mean_key(name): v for name, v in self.function_means.items()}


class ValidationSet:
    """A run's held-out prompts, answered by the trainer's model and scored by the run's reward functions.

    Args:
        records: The held-out prompt records (a source's ``validation_records()``).
        renderer: The run's renderer (chat template, tokenization, ``prompt_length``); its training skip count is
            not touched.
        runner: Scores each prompt's completions (one ``score_group_sync`` call per prompt). Its
            ``train/rewards/*`` window counts these calls: give validation a runner of its own, as
            :meth:`from_workload` does.
        tokenizer: The model's tokenizer (decoding; its pad id left-pads the prompts).
        stop_token_ids: The run's stop tokens (at least one).
        max_new_tokens: The most tokens per answer (the run's ``rollout.response_length``).
        n: Samples per prompt.
        temperature: Sampling temperature; ``None``: greedy when ``n == 1``, else 1.0. ``0`` means greedy and needs
            ``n == 1``.
        pass_threshold: A sample passes when its reward is ``>=`` this.
        batch_size: Prompts per :meth:`batches` batch (each generates ``batch_size * n`` sequences).
        limit: The most prompts to validate (the first that fit ``prompt_length``); ``None``: all.
        owns_runner: :meth:`close` closes ``runner``.

    Raises:
        ConfigError: a value out of range (the message names it and the fix).

    Example::

        vs = ValidationSet.from_workload(workload, max_new_tokens=256, n=8, temperature=0.7, batch_size=16)
        result = ValidationResult.combine((vs.generate_and_score(model, b, "cuda") for b in vs.batches()), n=vs.n)
        result.pass_at_k  # {1: 0.41, 8: 0.77}
    """

    def __init__(
        self,
        records: Sequence[PromptRecord],
        renderer: PromptRenderer,
        runner: RewardRunner,
        tokenizer: Any,
        stop_token_ids: Sequence[int],
        *,
        max_new_tokens: int,
        n: int = 1,
        temperature: float | None = None,
        pass_threshold: float = 1.0,
        batch_size: int = 64,
        limit: int | None = None,
        owns_runner: bool = False,
    ) -> None:
        problems = []
        for name, value in (("max_new_tokens", max_new_tokens), ("n", n), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"validation {name} must be an integer >= 1, got {value!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            problems.append(f"validation limit must be None (all prompts) or an integer >= 1, got {limit!r}")
        if temperature is not None and not (isinstance(temperature, (int, float)) and temperature >= 0):
            problems.append(f"validation temperature must be None or >= 0, got {temperature!r}")
        elif temperature == 0 and isinstance(n, int) and n > 1:
            problems.append(f"validation n={n} samples need temperature > 0 (0 is greedy: n identical answers)")
        if not isinstance(pass_threshold, (int, float)) or not math.isfinite(pass_threshold):
            problems.append(f"validation pass_threshold must be a finite number, got {pass_threshold!r}")
        if not list(stop_token_ids):
            problems.append("validation needs at least one stop token id (the model's end token)")
        if problems:
            raise ConfigError(problems)
        self.records = list(records)
        self.renderer = renderer
        self.runner = runner
        self.tokenizer = tokenizer
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.max_new_tokens = max_new_tokens
        self.n = n
        self.temperature = temperature
        self.pass_threshold = float(pass_threshold)
        self.batch_size = batch_size
        self.limit = limit
        self.owns_runner = owns_runner
        #: Records :meth:`items` skipped for being longer than ``prompt_length`` tokens.
        self.skipped_too_long = 0
        self._items: list[ValidationItem] | None = None

    @classmethod
    def from_workload(
        cls,
        workload: Workload,
        *,
        max_new_tokens: int,
        n: int = 1,
        temperature: float | None = None,
        pass_threshold: float = 1.0,
        batch_size: int = 64,
        limit: int | None = None,
    ) -> ValidationSet:
        """The validation set of a run: its source's held-out records, its renderer, tokenizer and stop tokens.

        The reward functions run in a runner of their own (same functions, pool kind, workers, timeout and error
        rule as the workload's), so validation never shows in the training ``train/rewards/*`` metrics;
        :meth:`close` shuts it down.

        Args:
            workload: The run's workload.
            max_new_tokens: The run's ``rollout.response_length``.
            n: Samples per prompt.
            temperature: See :class:`ValidationSet`.
            pass_threshold: A sample passes when its reward is ``>=`` this.
            batch_size: Prompts per batch.
            limit: The most prompts.
        """
        train = workload.runner
        runner = RewardRunner(
            train.functions, workers=train.workers, pool=train.pool, timeout_s=train.timeout_s, on_error=train.on_error
        )
        return cls(
            workload.validation_records(),
            workload.renderer,
            runner,
            workload.tokenizer,
            workload.stop_token_ids,
            max_new_tokens=max_new_tokens,
            n=n,
            temperature=temperature,
            pass_threshold=pass_threshold,
            batch_size=batch_size,
            limit=limit,
            owns_runner=True,
        )

    @property
    def do_sample(self) -> bool:
        """Whether answers are sampled (else greedy): a temperature > 0 is set, or ``n > 1``."""
        return (self.temperature is None and self.n > 1) or bool(self.temperature)

    @property
    def ks(self) -> list[int]:
        """The k of the reported pass@k: 1 and ``n``."""
        return sorted({1, self.n})

    def items(self) -> list[ValidationItem]:
        """The records rendered (computed once), in order; those over ``prompt_length`` tokens are skipped and
        counted in :attr:`skipped_too_long`, and at most ``limit`` are kept.

        Raises:
            DatasetError: there are records but none fits ``prompt_length``.
        """
        if self._items is not None:
            return list(self._items)
        items: list[ValidationItem] = []
        skipped = 0
        for record in self.records:
            if self.limit is not None and len(items) >= self.limit:
                break
            text, ids, messages = self.renderer.encode(record)
            if len(ids) > self.renderer.prompt_length:
                skipped += 1
                continue
            items.append(ValidationItem(record.index, record.prompt, text, ids, messages, dict(record.columns)))
        if skipped and not items:
            raise DatasetError(
                f"every one of the {skipped} validation prompts is longer than prompt_length="
                f"{self.renderer.prompt_length} tokens; raise rollout.prompt_length or shorten them"
            )
        if skipped:
            log.warning(
                "%d validation prompts are longer than prompt_length=%d tokens: skipped (%d kept)",
                skipped,
                self.renderer.prompt_length,
                len(items),
            )
        if not items:
            log.info("no validation prompts: the prompt source has no held-out records")
        self.skipped_too_long, self._items = skipped, items
        return list(items)

    def batches(self) -> list[list[ValidationItem]]:
        """:meth:`items` in batches of ``batch_size`` prompts (the last one may be smaller)."""
        items = self.items()
        return [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]

    def _generate(self, model: Any, items: Sequence[ValidationItem], device: Any) -> list[list[list[int]]]:
        """Each item's ``n`` generated token lists (stop token and trailing padding included)."""
        import torch

        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.stop_token_ids[0]
        width = max(len(it.token_ids) for it in items)
        input_ids = torch.full((len(items), width), int(pad), dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, it in enumerate(items):  # left padding: every prompt ends where generation starts
            if it.token_ids:
                input_ids[row, width - len(it.token_ids) :] = torch.tensor(it.token_ids, dtype=torch.long)
                mask[row, width - len(it.token_ids) :] = 1
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "eos_token_id": list(self.stop_token_ids),
            "pad_token_id": int(pad),
            "num_return_sequences": self.n,
            "do_sample": self.do_sample,
        }
        if self.do_sample:
            kwargs |= {"temperature": float(self.temperature or 1.0), "top_k": 0, "top_p": 1.0}
        out = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device), **kwargs)
        new = out[:, width:].tolist()
        return [new[row * self.n : (row + 1) * self.n] for row in range(len(items))]

    def score(self, items: Sequence[ValidationItem], generated: Sequence[Sequence[Sequence[int]]]) -> ValidationResult:
        """Score generated answers: each cut at its first stop token, one runner call per prompt.

        Args:
            items: The prompts.
            generated: For each prompt, its ``n`` generated token lists (stop token and padding may follow).

        Raises:
            RewardFunctionError: a reward call failed and the runner's ``on_error`` is ``"fail"``.
        """
        result = ValidationResult(n=self.n, pass_at_k_sum=dict.fromkeys(self.ks, 0.0))
        for item, answers in zip(items, generated, strict=True):
            if len(answers) != self.n:
                raise ConfigError(f"prompt {item.index} has {len(answers)} generated answers, expected n={self.n}")
            cut = [cut_at_stop(a, self.stop_token_ids) for a in answers]
            scored = self.runner.score_group_sync(item_reward_input(item, cut, self.tokenizer))
            passed = sum(r >= self.pass_threshold for r in scored.rewards)
            result.num_prompts += 1
            result.num_samples += len(cut)
            result.reward_sum += float(sum(scored.rewards))
            result.truncated += sum(len(c) == len(a) >= self.max_new_tokens for c, a in zip(cut, answers))
            result.reward_errors += scored.errors
            for k in self.ks:
                result.pass_at_k_sum[k] += pass_at_k(self.n, passed, k)
            for name, values in scored.per_function.items():
                got = [v for v in values if v is not None]
                result.function_sums[name] = result.function_sums.get(name, 0.0) + float(sum(got))
                result.function_counts[name] = result.function_counts.get(name, 0) + len(got)
        return result

    def generate_and_score(
        self, model: Any, items: Sequence[ValidationItem], device: torch.device | str | None = None
    ) -> ValidationResult:
        """Answer one batch of prompts with ``model`` and score the answers (see the module doc).

        The model runs in eval mode under ``torch.no_grad()``; its train/eval mode is restored afterwards.

        Args:
            model: A Hugging Face causal LM (anything with ``generate``, ``train`` and ``training``).
            items: One batch of :meth:`batches`.
            device: Where the inputs go (default: the device of the model's first parameter).

        Raises:
            RewardFunctionError: a reward call failed and the runner's ``on_error`` is ``"fail"``.
        """
        import torch

        items = list(items)
        if not items:
            return ValidationResult(n=self.n, pass_at_k_sum=dict.fromkeys(self.ks, 0.0))
        if device is None:
            device = next(iter(model.parameters())).device
        was_training = bool(getattr(model, "training", False))
        model.eval()
        try:
            with torch.no_grad():
                generated = self._generate(model, items, device)
        finally:
            model.train(was_training)
        result = self.score(items, generated)
        log.debug("validation batch: %d prompts x %d samples, mean reward %.4f", len(items), self.n, result.mean_reward)
        return result

    def close(self) -> None:
        """Shut the reward runner down if this set owns it (:meth:`from_workload`)."""
        if self.owns_runner:
            self.runner.close()

    def __repr__(self) -> str:
        return (
            f"ValidationSet(records={len(self.records)}, n={self.n}, temperature={self.temperature}, "
            f"max_new_tokens={self.max_new_tokens}, batch_size={self.batch_size}, limit={self.limit})"
        )
