"""Tests of validation by the run's reward functions: pass@k by hand, real HF generation, TRL-convention scoring.

Generation runs a tiny random ``LlamaForCausalLM`` (hidden 64, 1 layer) with its char tokenizer, built offline in a
tmp dir; tests about what reaches the reward functions use :class:`ScriptedLM`, whose answers are fixed, so the
rewards (picked by a sample's position or its prompt's columns, never by random text) are known in advance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.models.tiny_model import BOS_ID, EOS_ID, PAD_ID, build_tiny_model, build_tiny_tokenizer
from lightning_hybrid_rollout.rewards import RewardFunction, RewardRunner
from lightning_hybrid_rollout.run.workload import Workload
from lightning_hybrid_rollout.sources import PromptRecord, PromptRenderer, TaskSource
from lightning_hybrid_rollout.validation.answers import (
    VAL_REWARD,
    VAL_TRUNCATED_FRACTION,
    ValidationItem,
    ValidationResult,
    ValidationSet,
    pass_at_k,
    pass_at_key,
    reward_mean_key,
)

#: A stop token the tiny model (vocabulary 128) can never emit: answers run to ``max_new_tokens``.
UNREACHABLE_STOP = 10_000
#: A chat template the char tokenizer can encode (``<s>``/``</s>`` are its special tokens).
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
#: Plain prompts, shortest first (1 + 2, 3, 5, 6, 9 tokens), on which the tiny model's greedy answers vary.
PLAIN = [
    PromptRecord(index=10 + i, prompt=p, columns={"answer": str(i)})
    for i, p in enumerate(["go", "abc", "hello", "3*4=ab", "copy: abc"])
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("validation") / "tiny", hidden=64, layers=1, init_scale=6.0)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def chat_tok() -> Any:
    t = build_tiny_tokenizer()
    t.chat_template = CHAT_TEMPLATE
    return t


class Recorder:
    """A reward function that records every call and scores with ``rule(j, columns_of_sample_j)``."""

    __name__ = "recorder"

    def __init__(self, rule: Callable[[int, dict[str, Any]], float | None] = lambda j, cols: 0.0) -> None:
        self.rule = rule
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: list, completions: list, completion_ids: list, **columns: Any) -> list[float | None]:
        self.calls.append({"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **columns})
        return [self.rule(j, {k: v[j] for k, v in columns.items()}) for j in range(len(completions))]


class ScriptedLM(torch.nn.Module):
    """A stand-in causal LM: sample ``j`` of every prompt is ``scripts[j % len(scripts)]`` (cut to
    ``max_new_tokens``, then padded as HF pads finished rows); records each ``generate`` call."""

    def __init__(self, scripts: Sequence[Sequence[int]]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.scripts = [list(s) for s in scripts]
        self.calls: list[dict[str, Any]] = []

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append(
            {"input_ids": input_ids, "attention_mask": attention_mask, "training": self.training}
            | {"grad": torch.is_grad_enabled(), **kwargs}
        )
        n = kwargs["num_return_sequences"]
        rows = input_ids.repeat_interleave(n, dim=0)
        answers = [self.scripts[r % n % len(self.scripts)][: kwargs["max_new_tokens"]] for r in range(len(rows))]
        new = torch.full((len(rows), max(map(len, answers))), kwargs["pad_token_id"], dtype=torch.long)
        for r, a in enumerate(answers):
            new[r, : len(a)] = torch.tensor(a, dtype=torch.long)
        return torch.cat([rows, new], dim=1)


def spy(model: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record each ``model.generate`` call's kwargs and output (the real model still generates)."""
    calls: list[dict[str, Any]] = []
    real = model.generate

    def generate(**kwargs: Any) -> Any:
        out = real(**kwargs)
        calls.append({"kwargs": kwargs, "out": out})
        return out

    monkeypatch.setattr(model, "generate", generate)
    return calls


def make_set(
    tokenizer: Any,
    records: Sequence[PromptRecord] = PLAIN,
    recorder: Recorder | None = None,
    stops: Sequence[int] = (UNREACHABLE_STOP,),
    prompt_length: int = 64,
    system_prompt: str | None = None,
    **kwargs: Any,
) -> ValidationSet:
    renderer = PromptRenderer(tokenizer, prompt_length=prompt_length, system_prompt=system_prompt)
    runner = RewardRunner([RewardFunction(name="recorder", fn=recorder or Recorder())])
    return ValidationSet(
        records, renderer, runner, tokenizer, stops, owns_runner=True, **{"max_new_tokens": 6} | kwargs
    )


def run_all(vs: ValidationSet, model: Any) -> ValidationResult:
    try:
        return ValidationResult.combine((vs.generate_and_score(model, b, "cpu") for b in vs.batches()), n=vs.n)
    finally:
        vs.close()


def ids_of(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_matches_hand_computed_values() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # fewer failures than k: some draw always passes
    assert pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_counts_outside_the_samples(n: int, c: int, k: int) -> None:
    with pytest.raises(ConfigError, match="pass_at_k needs"):
        pass_at_k(n, c, k)


# ---------------------------------------------------------------------------------------------------- items


def test_items_render_records_skip_too_long_ones_and_leave_the_training_count_alone(tok: Any) -> None:
    vs = make_set(tok, prompt_length=6)  # <s> + 2, 3, 5, 6, 9 chars: the first three fit
    items = vs.items()
    assert [it.index for it in items] == [10, 11, 12]
    assert items[0] == ValidationItem(10, "go", "go", tok.encode("go"), None, {"answer": "0"})
    assert vs.skipped_too_long == 2
    assert vs.renderer.skipped_too_long == 0  # the training run's count (saved in its checkpoints) is untouched
    assert [[it.index for it in b] for b in vs.batches()] == [[10, 11, 12]]
    vs.close()


def test_limit_keeps_the_first_prompts_that_fit_and_batches_split_them(tok: Any) -> None:
    records = [PromptRecord(0, "a" * 70), *PLAIN]  # the first is too long for prompt_length=64
    vs = make_set(tok, records, limit=3, batch_size=2)
    assert [[it.index for it in b] for b in vs.batches()] == [[10, 11], [12]]
    assert vs.skipped_too_long == 1
    vs.close()


def test_every_prompt_too_long_is_one_clear_error(tok: Any) -> None:
    vs = make_set(tok, prompt_length=2)
    with pytest.raises(DatasetError, match=r"every one of the 5 validation prompts is longer than prompt_length=2"):
        vs.items()
    vs.close()


def test_items_survive_lightning_batch_transfer(tok: Any) -> None:
    from lightning.fabric.utilities.apply_func import move_data_to_device

    vs = make_set(tok)
    batch = vs.batches()[0]
    assert move_data_to_device(batch, torch.device("cpu")) == batch
    vs.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        ({"n": 0}, "n must be an integer >= 1"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"limit": 0}, "limit must be None"),
        ({"temperature": -1.0}, "temperature must be None or >= 0"),
        ({"n": 4, "temperature": 0.0}, "n=4 samples need temperature > 0"),
        ({"pass_threshold": math.nan}, "pass_threshold must be a finite number"),
        ({"stops": ()}, "at least one stop token"),
    ],
)
def test_out_of_range_settings_are_one_clear_config_error(tok: Any, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        make_set(tok, **kwargs)
    assert len(info.value.problems) == 1


# ---------------------------------------------------------------------------------------------------- generation


def test_answers_without_a_stop_token_run_to_max_new_tokens_and_count_as_truncated(
    tok: Any, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, rec = spy(model, monkeypatch), Recorder()
    result = run_all(make_set(tok, recorder=rec, max_new_tokens=5, n=2, batch_size=5), model)
    assert [len(ids) for call in rec.calls for ids in call["completion_ids"]] == [5] * 10
    width = max(len(it.token_ids) for it in make_set(tok).items())
    assert calls[0]["out"].shape == (10, width + 5)
    assert result.truncated_fraction == 1.0
    assert (result.num_prompts, result.num_samples) == (5, 10)


def test_answer_is_cut_at_its_first_stop_token_and_generation_ends_there(
    tok: Any, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = Recorder()
    run_all(make_set(tok, PLAIN[:1], free, max_new_tokens=8), model)
    greedy = free.calls[0]["completion_ids"][0]
    p = max(i for i in range(len(greedy)) if greedy[i] not in greedy[:i])  # the last token first seen there
    assert p >= 2
    calls, rec = spy(model, monkeypatch), Recorder()
    result = run_all(make_set(tok, PLAIN[:1], rec, stops=(UNREACHABLE_STOP, greedy[p]), max_new_tokens=8), model)
    assert rec.calls[0]["completion_ids"] == [greedy[:p]]
    assert calls[0]["kwargs"]["eos_token_id"] == [UNREACHABLE_STOP, greedy[p]]
    assert calls[0]["out"].shape[1] == len(PLAIN[0].prompt) + 1 + p + 1  # <s> + prompt, then p tokens and the stop
    assert result.truncated_fraction == 0.0


def test_left_padding_gives_each_prompt_its_unbatched_greedy_answer(
    tok: Any, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = Recorder()
    run_all(make_set(tok, recorder=alone, batch_size=1), model)
    calls, batched = spy(model, monkeypatch), Recorder()
    run_all(make_set(tok, recorder=batched, batch_size=5), model)
    assert [c["completion_ids"] for c in batched.calls] == [c["completion_ids"] for c in alone.calls]
    ids, mask = calls[0]["kwargs"]["input_ids"], calls[0]["kwargs"]["attention_mask"]
    assert ids[0, 0].item() == PAD_ID and mask[0, 0].item() == 0 and mask[0, -1].item() == 1  # short prompt: left pad
    assert mask[-1].tolist() == [1] * ids.shape[1]  # the longest prompt fills its row


def test_temperature_none_with_one_sample_is_greedy_and_repeatable(
    tok: Any, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = spy(model, monkeypatch)
    first, second = Recorder(), Recorder()
    run_all(make_set(tok, recorder=first, max_new_tokens=8), model)
    run_all(make_set(tok, recorder=second, max_new_tokens=8), model)
    assert [c["completion_ids"] for c in first.calls] == [c["completion_ids"] for c in second.calls]
    assert calls[0]["kwargs"]["do_sample"] is False and "temperature" not in calls[0]["kwargs"]
    sampled = [Recorder(), Recorder()]  # the check has teeth: sampling the random model gives other answers
    for rec in sampled:
        run_all(make_set(tok, recorder=rec, max_new_tokens=8, temperature=1.0), model)
    assert [c["completion_ids"] for c in sampled[0].calls] != [c["completion_ids"] for c in sampled[1].calls]


def test_several_samples_are_drawn_at_temperature_one_from_the_full_distribution(tok: Any) -> None:
    lm = ScriptedLM([[5, EOS_ID]])
    run_all(make_set(tok, n=3, stops=(EOS_ID, 0)), lm)
    kwargs = lm.calls[0]
    assert (kwargs["do_sample"], kwargs["temperature"], kwargs["top_k"], kwargs["top_p"]) == (True, 1.0, 0, 1.0)
    assert (kwargs["num_return_sequences"], kwargs["max_new_tokens"], kwargs["eos_token_id"]) == (3, 6, [EOS_ID, 0])
    lm = ScriptedLM([[5, EOS_ID]])
    run_all(make_set(tok, n=1, temperature=0.7), lm)
    assert (lm.calls[0]["do_sample"], lm.calls[0]["temperature"]) == (True, 0.7)


def test_model_generates_in_eval_mode_without_grad_and_gets_its_mode_back(tok: Any) -> None:
    lm = ScriptedLM([[5, EOS_ID]])
    lm.train()
    run_all(make_set(tok, stops=(EOS_ID,)), lm)
    assert (lm.calls[0]["training"], lm.calls[0]["grad"]) == (False, False)
    assert lm.training is True
    lm.eval()
    run_all(make_set(tok, stops=(EOS_ID,)), lm)
    assert lm.training is False


# ---------------------------------------------------------------------------------------------------- scoring


def test_one_score_call_per_prompt_with_its_n_completions_as_plain_strings(tok: Any, model: Any) -> None:
    rec = Recorder()
    run_all(make_set(tok, recorder=rec, n=3, batch_size=2), model)
    assert len(rec.calls) == 5
    for call, record in zip(rec.calls, PLAIN, strict=True):
        assert call["prompts"] == [record.prompt] * 3
        assert call["answer"] == [record.columns["answer"]] * 3
        assert len(call["completions"]) == len(call["completion_ids"]) == 3
        assert call["completions"] == [tok.decode(ids, skip_special_tokens=True) for ids in call["completion_ids"]]


def test_chat_prompts_reach_rewards_as_messages_and_answers_as_assistant_messages_without_special_tokens(
    chat_tok: Any,
) -> None:
    records = [PromptRecord(3, [{"role": "user", "content": "hi"}], {"answer": "ok"})]
    rec = Recorder()
    answer = [*ids_of(chat_tok, "ok"), BOS_ID, *ids_of(chat_tok, "y"), EOS_ID, *ids_of(chat_tok, "zz")]
    lm = ScriptedLM([answer])
    vs = make_set(chat_tok, records, rec, stops=(EOS_ID,), system_prompt="be brief", n=2, temperature=1.0)
    assert vs.items()[0].text == "<s>system: be brief</s><s>user: hi</s><s>assistant: "
    run_all(vs, lm)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert rec.calls[0]["prompts"] == [messages, messages]
    assert rec.calls[0]["completions"] == [[{"role": "assistant", "content": "oky"}]] * 2
    assert rec.calls[0]["completion_ids"] == [answer[:4]] * 2  # cut at the stop; the special <s> stays in the ids
    assert rec.calls[0]["answer"] == ["ok", "ok"]


def test_pass_at_k_and_mean_reward_follow_which_samples_pass(tok: Any) -> None:
    passes = [0, 1, 2, 4]  # of n=4 samples, the first `passes` of each prompt get reward 1.0
    records = [PromptRecord(i, "1+1=", {"passes": c}) for i, c in enumerate(passes)]
    rec = Recorder(lambda j, cols: 1.0 if j < cols["passes"] else 0.0)
    result = run_all(make_set(tok, records, rec, n=4), ScriptedLM([[5, 6]]))
    assert result.pass_at_k == pytest.approx({1: (0 + 1 / 4 + 2 / 4 + 1) / 4, 4: 3 / 4})
    assert result.mean_reward == pytest.approx(7 / 16)
    assert result.function_means == pytest.approx({"recorder": 7 / 16})


def test_pass_threshold_decides_which_rewards_pass(tok: Any) -> None:
    records = [PromptRecord(0, "1+1=")]
    for threshold, expected in [(0.5, 1.0), (0.51, 0.0)]:
        rec = Recorder(lambda j, cols: 0.5)
        result = run_all(make_set(tok, records, rec, n=2, pass_threshold=threshold), ScriptedLM([[5]]))
        assert result.pass_at_k == {1: expected, 2: expected}


def test_truncated_fraction_counts_answers_that_reach_max_new_tokens_without_a_stop(tok: Any) -> None:
    scripts = [[5, 6, EOS_ID], [5, 6, 7, 8, 9, 10], [5, 6, 7, 8], [5, 6, 7, EOS_ID]]  # max_new_tokens=4
    result = run_all(make_set(tok, PLAIN[:1], stops=(EOS_ID,), n=4, max_new_tokens=4), ScriptedLM(scripts))
    assert result.truncated_fraction == 0.5  # the 2nd (cut by the limit) and the 3rd (exactly 4, no stop)


def test_results_merge_across_batches_as_sums_not_means_of_means(tok: Any) -> None:
    passes = [0, 0, 0, 4]  # batches of 3 and 1 prompts: mean of batch means would give pass@1 = 0.5
    records = [PromptRecord(i, "1+1=", {"passes": c}) for i, c in enumerate(passes)]
    scripts = [[5, EOS_ID], [5, 6, 7, 8, 9, 10, 11]]  # every other sample truncated at max_new_tokens=6
    rule = lambda j, cols: (1.0 if j < cols["passes"] else None) if cols["passes"] else 0.0  # noqa: E731
    for batch_size, batches in [(3, 2), (4, 1)]:
        vs = make_set(tok, records, Recorder(rule), stops=(EOS_ID,), n=4, batch_size=batch_size)
        assert len(vs.batches()) == batches
        result = run_all(vs, ScriptedLM(scripts))
        assert result.pass_at_k == pytest.approx({1: 0.25, 4: 0.25})
        assert result.mean_reward == pytest.approx(4 / 16)
        assert result.truncated_fraction == 0.5
        assert result.function_means == pytest.approx({"recorder": 4 / 16})  # no None here: 12 zeros + 4 ones
        assert (result.num_prompts, result.num_samples) == (4, 16)
    prompt_three = make_set(tok, records[3:], Recorder(lambda j, cols: 1.0 if j < 2 else None), n=4)
    result = run_all(prompt_three, ScriptedLM(scripts))
    assert result.function_means == {"recorder": 1.0}  # the mean is over the values that are not None
    assert result.mean_reward == 0.5  # a sample no function scored gets 0.0


def test_merging_results_of_different_sample_counts_is_an_error() -> None:
    with pytest.raises(ConfigError, match="n=1 and n=4"):
        ValidationResult(n=1).merge(ValidationResult(n=4))


def test_metric_names_are_the_documented_constants(tok: Any) -> None:
    result = run_all(make_set(tok, n=4), ScriptedLM([[5, EOS_ID]]))
    assert set(result.metrics()) == {
        "val/reward",
        "val/pass@1",
        "val/pass@4",
        "val/truncated_fraction",
        "val/reward_errors",
        "val/rewards/recorder_mean",
    }
    assert (VAL_REWARD, VAL_TRUNCATED_FRACTION) == ("val/reward", "val/truncated_fraction")
    assert (pass_at_key(4), reward_mean_key("acc")) == ("val/pass@4", "val/rewards/acc_mean")
    assert ValidationResult(n=1).metrics() == {}


def test_from_workload_scores_in_a_runner_of_its_own_and_leaves_train_reward_stats_alone(tok: Any) -> None:
    source = TaskSource("copy", seed=0, val_size=3)
    functions = [RewardFunction(name=f.__name__, fn=f) for f in source.default_reward_funcs()]
    workload = Workload(
        source=source,
        renderer=PromptRenderer(tok, prompt_length=64),
        runner=RewardRunner(functions),
        tokenizer=tok,
        stop_token_ids=(EOS_ID,),
    )
    vs = ValidationSet.from_workload(workload, max_new_tokens=4, n=2)
    assert [it.index for it in vs.items()] == [r.index for r in source.validation_records()]
    result = run_all(vs, ScriptedLM([[5, EOS_ID]]))
    assert result.num_prompts == 3 and "val/rewards/copy_reward_mean" in result.metrics()
    assert "train/rewards/copy_reward_mean" not in workload.runner.take_stats()
    assert vs.runner is not workload.runner and vs.runner.functions == workload.runner.functions
    workload.close()
