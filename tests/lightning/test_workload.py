"""The workload's seams to the rollouter: the checkpointable prompt feed and a finished group's reward input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.lightning.workload import PROMPT_KEY, PromptFeed, group_reward_input, load_group_filter
from lightning_hybrid_rollout.rollout.group_filter import rewards_vary
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.sources import PromptRenderer, TaskSource

END = 2  # the stub tokenizer's end token


class CharTokenizer:
    """One id per character (ord + 10); ids below 10 are special and dropped by ``skip_special_tokens``."""

    chat_template = None

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 10 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i - 10) if i >= 10 else ("" if skip_special_tokens else f"<{i}>") for i in ids)


def sample(uid: str, response: str, metadata: dict[str, Any], prompt: str = "2+2=") -> Sample:
    tok = CharTokenizer()
    ids = [*tok.encode(response), END, *tok.encode("junk")]
    return Sample(uid, "g0", prompt, tok.encode(prompt), ids, [0.0] * len(ids), metadata=metadata)


def test_a_chat_group_gives_message_lists_assistant_completions_cut_at_the_stop_and_its_columns():
    messages = [{"role": "user", "content": "2+2?"}]
    meta = {"answer": "4", "level": 1, PROMPT_KEY: {"index": 7, "epoch": 0, "messages": messages}, "rollout": {}}
    group = group_reward_input([sample("a", "4", meta), sample("b", "5", meta)], CharTokenizer(), [END])
    assert group.prompt_index == 7 and group.is_chat
    assert group.prompts == [messages, messages]
    assert group.completions == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "5"}]]
    assert group.completion_ids == [[ord("4") + 10], [ord("5") + 10]]  # cut before the stop token
    assert group.columns == {"answer": ["4", "4"], "level": [1, 1]}  # reserved keys are not columns


def test_a_plain_group_gives_prompt_strings_and_text_completions():
    meta = {"answer": "4", PROMPT_KEY: {"index": 3, "epoch": 1, "messages": None}}
    group = group_reward_input([sample("a", "4", meta)], CharTokenizer(), [END])
    assert not group.is_chat and group.prompts == ["2+2="] and group.completions == ["4"]


def test_the_feed_skips_too_long_prompts_and_continues_from_its_state():
    def feed() -> PromptFeed:
        return PromptFeed(TaskSource("copy", seed=0), PromptRenderer(CharTokenizer(), prompt_length=9))

    first = feed()
    drawn = [item for _, item in zip(range(6), first)]
    assert all(len(item["prompt_token_ids"]) <= 9 for item in drawn)
    state = first.state_dict()
    assert state["skipped_too_long"] > 0  # "copy:ddcd=" and its kind (10 tokens) were left out
    uninterrupted = [item[PROMPT_KEY]["index"] for _, item in zip(range(4), first)]
    resumed = feed()
    resumed.load_state_dict(state)
    assert resumed.skipped_too_long == state["skipped_too_long"]
    assert [item[PROMPT_KEY]["index"] for _, item in zip(range(4), resumed)] == uninterrupted


def test_filter_groups_true_is_the_reward_variance_rule_and_false_is_none():
    assert load_group_filter(True) is rewards_vary and load_group_filter(False) is None


def test_a_user_group_filter_is_loaded_from_its_file_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_filters.py").write_text(
        "def short_enough(samples):\n    return all(s.response_length <= 6 for s in samples)\n"
    )
    keep = load_group_filter("my_filters.py:short_enough")
    meta = {PROMPT_KEY: {"index": 0, "epoch": 0, "messages": None}}
    assert keep([sample("a", "", meta)])  # 5 tokens: the end token and "junk"
    assert not keep([sample("b", "12345", meta)])


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_such_module:keep", "module 'no_such_module' does not import: ModuleNotFoundError"),
        ("missing.py:keep", "missing.py' not found"),
        ("math:pi", "'math:pi' is not a function (it is float 3.14"),
        ("math:no_such_name", "'math' has no attribute 'no_such_name'"),
    ],
)
def test_a_bad_group_filter_path_is_one_line(path: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_group_filter(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"rollout.filter_groups {path!r}") and fragment in message
