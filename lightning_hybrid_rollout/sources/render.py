"""Prompt records to token ids: :class:`PromptRenderer`, and the start-up check :func:`check_prompts_fit`.

Rules (the ``dataset`` section's ``chat_template`` and ``system_prompt``, see :mod:`.config`):

* A chat prompt (a message list) goes through ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
  tokenize=False)``, then ``tokenizer(text, add_special_tokens=False)`` (the template already holds BOS etc.).
* A plain string is ``tokenizer.encode(text)`` (the tokenizer adds its own BOS, as for the toy tasks), unless
  ``chat_template=True``, which makes it one user message first.
* ``system_prompt`` is prepended as a system message to templated prompts that do not start with one.
* A prompt longer than ``prompt_length`` tokens is skipped (``render`` returns ``None``) and counted in
  :attr:`PromptRenderer.skipped_too_long`.

``transformers`` is never imported here: the renderer takes any tokenizer object with those methods.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.sources.base import Messages, PromptRecord, PromptSource

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_FIT_SCAN", "PromptFitReport", "PromptRenderer", "RenderedPrompt", "check_prompts_fit"]

#: Records :func:`check_prompts_fit` tokenizes by default (a few seconds at most for short prompts).
DEFAULT_FIT_SCAN = 10_000


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt ready for the engine.

    Args:
        text: The text the token ids encode (after the chat template, if one was applied).
        token_ids: The prompt's token ids, at most ``prompt_length`` of them.
        messages: The messages given to the chat template (system prompt included), or ``None`` for plain text.
    """

    text: str
    token_ids: list[int]
    messages: Messages | None


class PromptRenderer:
    """Turn :class:`PromptRecord` prompts into token ids, skipping (and counting) those too long.

    Args:
        tokenizer: A Hugging Face tokenizer (``encode``, ``__call__``, ``apply_chat_template``, ``chat_template``).
        prompt_length: The most prompt tokens (``rollout.prompt_length``).
        system_prompt: Prepended as a system message to templated prompts without one.
        chat_template: ``None``: template message lists only; ``True``: plain strings too; ``False``: never.

    Raises:
        ConfigError: ``prompt_length < 1``; ``chat_template=True`` with a tokenizer that has no chat template; or
            a ``system_prompt`` with ``chat_template=False``.

    Example::

        renderer = PromptRenderer(tokenizer, prompt_length=512, system_prompt="Answer briefly.")
        rendered = renderer.render(PromptRecord(index=0, prompt=[{"role": "user", "content": "2+2?"}], columns={}))
        if rendered is not None:
            engine_input = rendered.token_ids
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        prompt_length: int,
        system_prompt: str | None = None,
        chat_template: bool | None = None,
    ) -> None:
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 1:
            raise ConfigError(f"prompt_length must be an integer >= 1, got {prompt_length!r}. E.g. 512.")
        self.has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template is True and not self.has_template:
            raise ConfigError(
                "dataset.chat_template is true but the tokenizer has no chat template; use a chat model's tokenizer "
                "or set chat_template: null"
            )
        if chat_template is False and system_prompt is not None:
            raise ConfigError("dataset.system_prompt needs the chat template: set chat_template to null or true")
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length
        self.system_prompt = system_prompt
        self.chat_template = chat_template
        #: Prompts :meth:`render` skipped for being longer than ``prompt_length`` tokens.
        self.skipped_too_long = 0
        self._warned_system = False

    def messages(self, record: PromptRecord) -> Messages | None:
        """The messages the chat template gets for ``record`` (system prompt included), or ``None`` for plain text.

        Raises:
            DatasetError: a chat prompt with ``chat_template=False`` or a tokenizer without a chat template.
        """
        if isinstance(record.prompt, str):
            if self.chat_template is not True:
                if self.system_prompt is not None and not self._warned_system:
                    self._warned_system = True
                    logger.warning(
                        "dataset.system_prompt is ignored for plain-string prompts (row %d); set "
                        "dataset.chat_template: true to wrap them as chat messages",
                        record.index,
                    )
                return None
            messages = [{"role": "user", "content": record.prompt}]
        else:
            if self.chat_template is False:
                raise DatasetError(
                    f"row {record.index} (counting from 0) is a chat prompt but dataset.chat_template is false; set "
                    f"it to null, or give plain-string prompts"
                )
            if not self.has_template:
                raise DatasetError(
                    f"row {record.index} (counting from 0) is a chat prompt but the tokenizer has no chat template; "
                    f"use a chat model's tokenizer, or give plain-string prompts"
                )
            messages = [dict(m) for m in record.prompt]
        if self.system_prompt is not None and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def encode(self, record: PromptRecord) -> tuple[str, list[int], Messages | None]:
        """``(text, token ids, messages)`` of ``record``, whatever its length (nothing is counted)."""
        messages = self.messages(record)
        if messages is None:
            text = str(record.prompt)
            return text, list(self.tokenizer.encode(text)), None
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, list(self.tokenizer(text, add_special_tokens=False)["input_ids"]), messages

    def render(self, record: PromptRecord) -> RenderedPrompt | None:
        """The rendered prompt, or ``None`` (and ``skipped_too_long += 1``) when over ``prompt_length`` tokens.

        Args:
            record: A record from a :class:`~.base.PromptSource`.
        """
        text, ids, messages = self.encode(record)
        if len(ids) > self.prompt_length:
            self.skipped_too_long += 1
            if self.skipped_too_long == 1:
                logger.warning(
                    "prompt row %d has %d tokens > prompt_length=%d: skipped (further skips are only counted)",
                    record.index,
                    len(ids),
                    self.prompt_length,
                )
            return None
        return RenderedPrompt(text=text, token_ids=ids, messages=messages)


@dataclass(frozen=True)
class PromptFitReport:
    """What :func:`check_prompts_fit` measured.

    Args:
        scanned: Records tokenized.
        too_long: Of those, how many exceed ``prompt_length``.
        shortest: Fewest tokens of a scanned prompt.
        longest: Most tokens of a scanned prompt.
    """

    scanned: int
    too_long: int
    shortest: int
    longest: int


def check_prompts_fit(
    source: PromptSource | Sequence[PromptRecord], renderer: PromptRenderer, *, max_scan: int = DEFAULT_FIT_SCAN
) -> PromptFitReport:
    """Fail at start, not after hours, when no prompt fits ``prompt_length``; warn when some do not.

    Tokenizes up to ``max_scan`` training records: ``source.preview(max_scan)`` (for a ``DatasetSource``, its
    training rows in file order, so every row of a set up to ``max_scan`` rows), or the records given. Any rendering
    error (a chat prompt without a chat template, ...) surfaces here too. The stream does not move.

    Args:
        source: A prompt source, or the records to scan.
        renderer: The renderer the rollouter will use.
        max_scan: The most records to tokenize.

    Raises:
        DatasetError: every scanned prompt is longer than ``prompt_length`` tokens (or there is none).

    Example::

        report = check_prompts_fit(source, PromptRenderer(tokenizer, prompt_length=512))
        print(f"{report.too_long} of {report.scanned} prompts will be skipped")
    """
    records = source.preview(max_scan) if isinstance(source, PromptSource) else list(source)[:max_scan]
    if not records:
        raise DatasetError("the prompt source yielded no prompts to check; give a data set with at least one row")
    lengths = [len(renderer.encode(r)[1]) for r in records]
    n = renderer.prompt_length
    report = PromptFitReport(
        scanned=len(lengths), too_long=sum(x > n for x in lengths), shortest=min(lengths), longest=max(lengths)
    )
    if report.too_long == report.scanned:
        raise DatasetError(
            f"every prompt is longer than prompt_length={n} tokens (shortest: {report.shortest}, of "
            f"{report.scanned} scanned); raise rollout.prompt_length or shorten the prompts"
        )
    if report.too_long:
        logger.warning(
            "%d of %d scanned prompts are longer than prompt_length=%d tokens (longest: %d) and will be skipped",
            report.too_long,
            report.scanned,
            n,
            report.longest,
        )
    return report
