"""An episode's trained sequence: prompt + model tokens as generated + tool tokens as the template renders them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from lightning_hybrid_rollout.agentic.episode import PLAIN_CHAT_TEMPLATE, Episode, EpisodeBudget
from lightning_hybrid_rollout.errors import ChatTemplateError, ConfigError

QUESTION = [{"role": "user", "content": "What is 2+3? Use the add tool."}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _prompt(tok: Any, messages: list[dict[str, Any]]) -> list[int]:
    return _encode(tok, tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


def _episode(tok: Any, **budget: int) -> Episode:
    return Episode(QUESTION, _prompt(tok, QUESTION), tok, EpisodeBudget(**budget) if budget else None)


def test_the_sequence_is_the_templates_rendering_of_the_whole_conversation(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    ep = _episode(tok)
    first = _encode(tok, CALL + "<|im_end|>")
    ep.add_model_turn(first, [-0.5] * len(first), weight_versions=[4])
    tool_ids = ep.add_message({"role": "tool", "content": "5"})
    assert tok.decode(tool_ids) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    second = _encode(tok, "The answer is 5.<|im_end|>")
    ep.add_model_turn(second, [-0.25] * len(second), weight_versions=[5])
    conversation = [*QUESTION, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "5"}]
    expected = _prompt(tok, conversation) + second
    assert ep.token_ids == expected  # exactly what the template gives, plus the model's final turn
    n_prompt = len(ep.prompt_token_ids)
    assert ep.response_token_ids == expected[n_prompt:]
    assert ep.loss_mask == [1] * len(first) + [0] * len(tool_ids) + [1] * len(second)
    assert ep.response_logprobs == [-0.5] * len(first) + [0.0] * len(tool_ids) + [-0.25] * len(second)
    assert ep.messages[-1] == {"role": "assistant", "content": "The answer is 5."}


def test_model_tokens_are_kept_as_generated_never_retokenized(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    ep = _episode(tok)
    canonical = _encode(tok, "hello")
    odd = [t for ch in "hello" for t in _encode(tok, ch)]  # the same text, a token split no tokenizer would pick
    assert odd != canonical and tok.decode(odd) == "hello"
    end = _encode(tok, "<|im_end|>")
    ep.add_model_turn(odd + end, [0.0] * (len(odd) + len(end)), [0])
    ep.add_message({"role": "tool", "content": "ok"})
    n = len(ep.prompt_token_ids)
    assert ep.token_ids[n : n + len(odd) + len(end)] == odd + end


def test_a_turn_cut_by_the_length_limit_is_closed_by_the_template_in_the_tool_turn(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    ep = _episode(tok)
    cut = _encode(tok, "Let me think")  # no end token: the engine hit max_tokens
    ep.add_model_turn(cut, [0.0] * len(cut), [0])
    tool_ids = ep.add_message({"role": "user", "content": "Go on."})
    assert tok.decode(tool_ids) == "<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"


def test_staleness_is_the_oldest_segments_version(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    ep = _episode(tok)
    assert ep.min_weight_version is None
    ids = _encode(tok, CALL + "<|im_end|>")
    ep.add_model_turn(ids, [0.0] * len(ids), weight_versions=[3, 4], segment_starts=[0, 5])
    ep.add_message({"role": "tool", "content": "5"})
    ep.add_model_turn(ids, [0.0] * len(ids), weight_versions=[6])
    assert (ep.min_weight_version, ep.max_weight_version, ep.weight_versions) == (3, 6, [3, 4, 6])
    with pytest.raises(ValueError, match="one weight version per segment"):
        ep.add_model_turn(ids, [0.0] * len(ids), weight_versions=[7, 8])


def test_max_turns_ends_the_episode(tiny_tokenizer) -> None:
    ep = Episode([{"role": "user", "content": "1+2="}], [1, 5, 6], tiny_tokenizer, EpisodeBudget(max_turns=2))
    ep.add_model_turn([7], [0.0], [0])
    ep.add_message({"role": "tool", "content": "3"})
    assert not ep.done
    ep.add_model_turn([8], [0.0], [0])
    assert ep.stop_reason == "max_turns" and ep.num_model_turns == 2
    with pytest.raises(RuntimeError, match="already ended"):
        ep.add_message({"role": "tool", "content": "3"})


def test_max_episode_tokens_counts_the_prompt_and_drops_a_tool_turn_that_does_not_fit(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    prompt = tok.encode("1+2=")  # BOS + 4 characters
    ep = Episode([{"role": "user", "content": "1+2="}], prompt, tok, EpisodeBudget(max_episode_tokens=20))
    assert ep.remaining_tokens == 15
    ep.add_model_turn(tok.encode("3", add_special_tokens=False), [0.0], [0])
    assert ep.remaining_tokens == 14
    assert ep.add_message({"role": "tool", "content": "a long tool answer"}) is None
    assert ep.stop_reason == "max_episode_tokens" and ep.response_token_ids == tok.encode("3", add_special_tokens=False)
    full = Episode([{"role": "user", "content": "1+2="}], prompt, tok, EpisodeBudget(max_episode_tokens=5))
    assert full.stop_reason == "max_episode_tokens"  # the prompt alone fills it
    edge = Episode([{"role": "user", "content": "1+2="}], prompt, tok, EpisodeBudget(max_episode_tokens=7))
    edge.add_model_turn([9, 9], [0.0, 0.0], [0])
    assert edge.stop_reason == "max_episode_tokens" and edge.remaining_tokens == 0


def test_the_tiny_tokenizer_renders_tool_turns_with_the_plain_template(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    ep = Episode([{"role": "user", "content": "1+2="}], tok.encode("1+2="), tok)
    assert ep.chat_template == PLAIN_CHAT_TEMPLATE
    ep.add_model_turn([*tok.encode("3", add_special_tokens=False), tok.eos_token_id], [0.0, 0.0], [1])
    ids = ep.add_message({"role": "tool", "content": "ok"})
    assert ids == tok.encode("\ntool: ok\nassistant: ", add_special_tokens=False)
    assert ep.loss_mask == [1, 1] + [0] * len(ids) and ep.template_fallbacks == 0


def test_a_template_whose_earlier_turns_change_falls_back_with_a_counted_warning(tiny_tokenizer, caplog) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    # Earlier assistant turns lose their text once another message follows (as templates that drop reasoning do).
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}{{ m['role'] }}: .\n"
        "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    ep = Episode([{"role": "user", "content": "1+2="}], tok.encode("1+2="), tok)
    ep.add_model_turn(tok.encode("3", add_special_tokens=False), [0.0], [0])
    with caplog.at_level("WARNING"):
        ids = ep.add_message({"role": "tool", "content": "ok"})
    assert ids == tok.encode("tool: ok\nassistant: ", add_special_tokens=False)
    assert ep.template_fallbacks == 1 and "template_fallbacks" in caplog.text


def test_a_template_that_cannot_isolate_a_message_is_one_clear_error(tiny_tokenizer) -> None:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    ep = Episode([{"role": "user", "content": "1"}], tok.encode("1"), tok)
    ep.add_model_turn([9], [0.0], [0])
    with pytest.raises(ChatTemplateError, match="'tool' message"):
        ep.add_message({"role": "tool", "content": "2"})


def test_state_dict_is_plain_data_and_a_restored_episode_continues_identically(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    ep = _episode(tok, max_turns=3, max_episode_tokens=500)
    ids = _encode(tok, CALL + "<|im_end|>")
    ep.add_model_turn(ids, [-1.0] * len(ids), [2])
    ep.add_message({"role": "tool", "content": "5"})
    state = json.loads(json.dumps(ep.state_dict()))  # survives a JSON checkpoint
    restored = Episode.from_state_dict(state, tok)
    assert restored.state_dict() == ep.state_dict()
    for e in (ep, restored):
        e.add_model_turn(ids, [-1.0] * len(ids), [3])
        e.add_message({"role": "tool", "content": "5"})
    assert restored.token_ids == ep.token_ids and restored.loss_mask == ep.loss_mask
    assert restored.min_weight_version == 2 and restored.remaining_tokens == ep.remaining_tokens


@pytest.mark.parametrize("bad", [{"max_turns": 0}, {"max_episode_tokens": -1}, {"max_turns": True}])
def test_budget_values_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=f"{next(iter(bad))} must be an integer >= 1"):
        EpisodeBudget(**bad)
