"""PromptRenderer and check_prompts_fit: chat templates, plain text, system prompts, too-long prompts."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.sources import (
    DatasetConfig,
    DatasetSource,
    PromptRecord,
    PromptRenderer,
    TaskSource,
    check_prompts_fit,
)
from tests.sources.conftest import CHAT_ROWS, WriteRows

HI = [{"role": "user", "content": "hi there"}]
HI_TEXT = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
HI_IDS = [4, 6, 9, 10, 5, 4, 7]  # no <s> (2): the template's text is tokenized without special tokens


def chat(messages: list[dict[str, str]], index: int = 0) -> PromptRecord:
    return PromptRecord(index=index, prompt=messages, columns={})


def plain(text: str, index: int = 0) -> PromptRecord:
    return PromptRecord(index=index, prompt=text, columns={})


def test_a_chat_prompt_goes_through_the_template_without_adding_special_tokens(chat_tokenizer: Any) -> None:
    rendered = PromptRenderer(chat_tokenizer, prompt_length=64).render(chat(HI))
    assert rendered is not None
    assert (rendered.text, rendered.token_ids, rendered.messages) == (HI_TEXT, HI_IDS, HI)


def test_a_plain_prompt_is_encoded_as_is_with_the_tokenizers_bos(plain_tokenizer: Any, chat_tokenizer: Any) -> None:
    rendered = PromptRenderer(plain_tokenizer, prompt_length=64).render(plain("3+4="))
    assert rendered is not None
    assert rendered.token_ids == plain_tokenizer.encode("3+4=") and rendered.token_ids[0] == 1
    assert (rendered.text, rendered.messages) == ("3+4=", None)
    with_template = PromptRenderer(chat_tokenizer, prompt_length=64).render(plain("hi there"))
    assert with_template is not None and with_template.token_ids == [2, 9, 10] and with_template.messages is None


def test_chat_template_true_wraps_a_plain_prompt_as_one_user_message(chat_tokenizer: Any) -> None:
    rendered = PromptRenderer(chat_tokenizer, prompt_length=64, chat_template=True).render(plain("hi there"))
    assert rendered is not None and (rendered.text, rendered.token_ids, rendered.messages) == (HI_TEXT, HI_IDS, HI)


def test_chat_template_false_refuses_a_chat_prompt(chat_tokenizer: Any) -> None:
    with pytest.raises(DatasetError, match=r"row 3 .* is a chat prompt but dataset.chat_template is false"):
        PromptRenderer(chat_tokenizer, prompt_length=64, chat_template=False).render(chat(HI, index=3))


def test_a_chat_prompt_needs_a_tokenizer_with_a_chat_template(plain_tokenizer: Any) -> None:
    with pytest.raises(DatasetError, match=r"row 0 .* the tokenizer has no chat template; use a chat model's"):
        PromptRenderer(plain_tokenizer, prompt_length=64).render(chat(HI))
    with pytest.raises(ConfigError, match="chat_template is true but the tokenizer has no chat template"):
        PromptRenderer(plain_tokenizer, prompt_length=64, chat_template=True)


def test_the_system_prompt_is_prepended_unless_the_row_has_its_own(chat_tokenizer: Any) -> None:
    renderer = PromptRenderer(chat_tokenizer, prompt_length=64, system_prompt="be brief")
    rendered = renderer.render(chat(HI))
    assert rendered is not None and rendered.messages == [{"role": "system", "content": "be brief"}, *HI]
    assert rendered.text.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n")
    own = CHAT_ROWS[1]["prompt"]
    rendered = PromptRenderer(chat_tokenizer, prompt_length=64, system_prompt="other").render(chat(own))
    assert rendered is not None and rendered.messages == own
    assert HI == [{"role": "user", "content": "hi there"}]  # the record's messages are not modified


def test_the_system_prompt_reaches_plain_prompts_only_with_chat_template_true(
    chat_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    wrapped = PromptRenderer(chat_tokenizer, prompt_length=64, system_prompt="be", chat_template=True)
    rendered = wrapped.render(plain("hi"))
    assert rendered is not None and [m["role"] for m in rendered.messages or []] == ["system", "user"]
    untemplated = PromptRenderer(chat_tokenizer, prompt_length=64, system_prompt="be")
    with caplog.at_level(logging.WARNING, logger="lightning_hybrid_rollout.sources.render"):
        rendered = untemplated.render(plain("hi"))
    assert rendered is not None and rendered.messages is None
    assert "system_prompt is ignored for plain-string prompts" in caplog.text
    with pytest.raises(ConfigError, match="system_prompt needs the chat template"):
        PromptRenderer(chat_tokenizer, prompt_length=64, system_prompt="be", chat_template=False)


def test_a_prompt_over_prompt_length_is_skipped_and_counted(chat_tokenizer: Any) -> None:
    fits = PromptRenderer(chat_tokenizer, prompt_length=len(HI_IDS))
    assert fits.render(chat(HI)) is not None and fits.skipped_too_long == 0
    tight = PromptRenderer(chat_tokenizer, prompt_length=len(HI_IDS) - 1)
    assert tight.render(chat(HI)) is None and tight.render(chat(HI)) is None
    assert tight.skipped_too_long == 2


def test_prompt_length_must_be_positive(chat_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="prompt_length must be an integer >= 1, got 0"):
        PromptRenderer(chat_tokenizer, prompt_length=0)


def chat_source(write_rows: WriteRows, **kwargs: Any) -> DatasetSource:
    return DatasetSource(DatasetConfig(path=str(write_rows(CHAT_ROWS)), **kwargs), seed=0)


def test_check_prompts_fit_raises_when_no_prompt_fits(write_rows: WriteRows, chat_tokenizer: Any) -> None:
    renderer = PromptRenderer(chat_tokenizer, prompt_length=6)  # the rows have 7, 12 and 11 tokens
    with pytest.raises(DatasetError) as info:
        check_prompts_fit(chat_source(write_rows), renderer)
    assert str(info.value) == (
        "every prompt is longer than prompt_length=6 tokens (shortest: 7, of 3 scanned); raise "
        "rollout.prompt_length or shorten the prompts"
    )


def test_check_prompts_fit_scans_every_row_and_does_not_move_the_stream(
    write_rows: WriteRows, chat_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [*CHAT_ROWS[1:], CHAT_ROWS[0]]  # only the last row (7 tokens) fits
    source = DatasetSource(DatasetConfig(path=str(write_rows(rows))), seed=0)
    state = source.state_dict()
    renderer = PromptRenderer(chat_tokenizer, prompt_length=7)
    with caplog.at_level(logging.WARNING, logger="lightning_hybrid_rollout.sources.render"):
        report = check_prompts_fit(source, renderer)
    assert (report.scanned, report.too_long, report.shortest, report.longest) == (3, 2, 7, 12)
    assert "2 of 3 scanned prompts are longer than prompt_length=7" in caplog.text
    assert source.state_dict() == state and renderer.skipped_too_long == 0
    with pytest.raises(DatasetError, match="of 2 scanned"):
        check_prompts_fit(source, renderer, max_scan=2)


def test_check_prompts_fit_takes_records_or_any_source(plain_tokenizer: Any) -> None:
    renderer = PromptRenderer(plain_tokenizer, prompt_length=8)
    assert check_prompts_fit([plain("1+1=")], renderer).too_long == 0
    source = TaskSource("arithmetic", seed=0)
    state = source.state_dict()
    assert check_prompts_fit(source, renderer, max_scan=20).scanned == 20
    assert source.state_dict() == state
    with pytest.raises(DatasetError, match="no prompts to check"):
        check_prompts_fit([], renderer)


def test_check_prompts_fit_surfaces_a_chat_prompt_the_tokenizer_cannot_render(
    write_rows: WriteRows, plain_tokenizer: Any
) -> None:
    with pytest.raises(DatasetError, match="tokenizer has no chat template"):
        check_prompts_fit(chat_source(write_rows), PromptRenderer(plain_tokenizer, prompt_length=64))
