"""Fast unit tests of the toy tasks and their reward functions (pure Python)."""

from __future__ import annotations

import random

import pytest

from lightning_hybrid_rollout.tasks import (
    TASKS,
    ArithmeticTask,
    CopyTask,
    StringReverseTask,
    clean_response,
    get_task,
)


def test_arithmetic_prompts_are_deterministic_and_in_range() -> None:
    task = ArithmeticTask()
    a = task.sample_prompts(50, seed=3)
    b = task.sample_prompts(50, seed=3)
    assert a == b
    assert a != task.sample_prompts(50, seed=4)
    assert [p.index for p in a] == list(range(50))
    for p in a:
        x, y = p.metadata["a"], p.metadata["b"]
        assert 0 <= x <= 4 and 0 <= y <= 4
        assert p.prompt == f"{x}+{y}="
        assert p.metadata["answer"] == str(x + y)
    # 25 distinct problems exist; a long stream covers them all
    assert len({p.prompt for p in task.sample_prompts(500)}) == 25


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("7", 1.0),
        ("7</s>", 1.0),
        ("7</s>garbage after the end", 1.0),
        ("<s>7</s><pad><pad>", 1.0),
        ("8</s>", 0.0),
        ("77</s>", 0.0),
        ("7 </s>", 0.0),
        ("", 0.0),
        ("</s>", 0.0),
    ],
)
def test_arithmetic_reward_exact_match(text: str, reward: float) -> None:
    task = ArithmeticTask()
    meta = task.make_prompt({"a": 3, "b": 4}).metadata
    assert task.reward(text, meta) == reward


def test_reward_requires_answer() -> None:
    with pytest.raises(KeyError, match="answer"):
        ArithmeticTask().reward("7", {})


def test_arithmetic_validates_arguments() -> None:
    with pytest.raises(ValueError, match="max_response_tokens"):
        ArithmeticTask(max_operand=50, max_response_tokens=2)
    with pytest.raises(ValueError, match="max_operand"):
        ArithmeticTask(max_operand=-1)


def test_random_response_has_answer_shape() -> None:
    rng = random.Random(0)
    task = ArithmeticTask()
    for _ in range(20):
        r = task.random_response(rng)
        assert r.isdigit() and 0 <= int(r) <= 8


def test_reverse_and_copy() -> None:
    rev, cp = StringReverseTask(), CopyTask()
    p = rev.make_prompt({"s": "abc"})
    assert p.prompt == "rev:abc=" and p.metadata["answer"] == "cba"
    assert rev.reward("cba</s>", p.metadata) == 1.0
    assert rev.reward("abc</s>", p.metadata) == 0.0
    q = cp.make_prompt({"s": "abc"})
    assert q.prompt == "copy:abc=" and cp.reward("abc", q.metadata) == 1.0
    for tp in rev.sample_prompts(30, seed=1):
        s = tp.metadata["s"]
        assert 2 <= len(s) <= 4 and set(s) <= set("abcde")
        assert tp.metadata["answer"] == s[::-1]


def test_partial_credit_is_in_unit_interval() -> None:
    task = StringReverseTask(partial_credit=True)
    meta = task.make_prompt({"s": "abcd"}).metadata  # answer "dcba"
    assert task.reward("dcba</s>", meta) == 1.0
    assert task.reward("dcbx</s>", meta) == pytest.approx(4 / 5)  # 3 positions + right length
    assert task.reward("dc</s>", meta) == pytest.approx(2 / 5)
    assert task.reward("", meta) == 0.0
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice("abcde</s>") for _ in range(rng.randint(0, 8)))
        assert 0.0 <= task.reward(text, meta) <= 1.0


def test_clean_response() -> None:
    assert clean_response("12</s>34") == ("12", True)
    assert clean_response("12") == ("12", False)


def test_registry() -> None:
    assert set(TASKS) == {"arithmetic", "reverse", "copy"}
    assert isinstance(get_task("copy", max_len=3), CopyTask)
    with pytest.raises(ValueError, match="available"):
        get_task("nope")


def test_task_chars_are_in_tokenizer_vocab() -> None:
    from lightning_hybrid_rollout.models.tiny_model import tiny_vocab

    vocab = tiny_vocab()
    for task in (ArithmeticTask(), StringReverseTask(), CopyTask()):
        for p in task.sample_prompts(50):
            assert set(p.prompt + p.metadata["answer"]) <= set(vocab), p
