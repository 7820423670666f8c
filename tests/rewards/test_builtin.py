"""The built-in rewards: completion text of plain and chat completions, exact match, regex format, math_verify."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import pytest

from lightning_hybrid_rollout.rewards import FormatReward, completion_text, exact_match, math_verify


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_completion_text_reads_plain_chat_and_multipart_completions() -> None:
    assert completion_text("42") == "42"
    assert completion_text(chat("42")) == "42"
    assert completion_text({"role": "assistant", "content": "42"}) == "42"
    assert (
        completion_text(
            [{"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]}]
        )
        == "42"
    )
    assert completion_text([{"role": "assistant", "content": "4"}, {"role": "assistant", "content": "2"}]) == "42"
    with pytest.raises(TypeError, match=r"a completion must be a string or a list of chat messages .*, got int: 42"):
        completion_text(42)


def test_exact_match_compares_stripped_text_with_the_answer_as_a_string() -> None:
    assert exact_match([" 7\n", chat("7"), "8", "77"], answer=[7, "7", "7", 7]) == [1.0, 1.0, 0.0, 0.0]


def test_format_reward_matches_the_whole_completion_by_default_and_anywhere_with_search() -> None:
    whole = FormatReward(r"<answer>\d+</answer>")
    assert whole(["<answer>7</answer>", "so <answer>7</answer>", chat("<answer>12</answer>")]) == [1.0, 0.0, 1.0]
    anywhere = FormatReward(r"<answer>\d+</answer>", search=True)
    assert anywhere(["so <answer>7</answer> done", "no"]) == [1.0, 0.0]


def test_format_reward_dot_spans_lines_unless_dotall_is_off() -> None:
    text = "<think>a\nb</think>"
    assert FormatReward("<think>.*</think>")([text]) == [1.0]
    assert FormatReward("<think>.*</think>", dotall=False)([text]) == [0.0]
    assert FormatReward("<THINK>.*</THINK>", ignore_case=True)([text]) == [1.0]


def test_format_reward_refuses_a_bad_pattern_when_built() -> None:
    with pytest.raises(ValueError, match=r"pattern '\(' is not a valid regular expression"):
        FormatReward("(")


COMPLETIONS = [r"so the answer is \boxed{42}.", "42", "The answer is 41.", r"\boxed{\frac{1}{2}}", "0.5", "no idea"]
SOLUTIONS = ["42", "$42$", "42", "0.5", r"$\frac{1}{2}$", "42"]
EXPECTED = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def test_math_verify_scores_boxed_and_plain_number_answers() -> None:
    assert math_verify(COMPLETIONS, solution=SOLUTIONS) == EXPECTED
    assert math_verify([chat(c) for c in COMPLETIONS], answer=SOLUTIONS) == EXPECTED


def test_math_verify_prefers_solution_over_answer_and_gives_none_for_an_unparsable_truth() -> None:
    assert math_verify(["42", "42"], solution=["42", "not math at all"], answer=["0", "0"]) == [1.0, None]


def test_math_verify_without_a_ground_truth_column_says_which_columns_exist() -> None:
    with pytest.raises(ValueError, match=r"'solution' or 'answer' column, the data set has \['task'\]"):
        math_verify(["42"], prompts=["q"], completion_ids=[[1]], task=["x"])


def test_math_verify_works_in_worker_threads() -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(math_verify, COMPLETIONS, solution=SOLUTIONS) for _ in range(4)]
        assert [f.result(timeout=60) for f in futures] == [EXPECTED] * 4


def test_importing_the_package_loads_no_heavy_library() -> None:
    code = (
        "import sys, lightning_hybrid_rollout.rewards as r; r.RewardRunner; "
        "print([m for m in ('torch', 'vllm', 'ray', 'math_verify', 'sympy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
