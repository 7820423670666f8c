"""RewardRunner: TRL's call, one call per group, weights and None, failures in both modes, stats, off-loop, pools."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ConfigError, RewardFunctionError
from lightning_hybrid_rollout.rewards import GroupRewardInput, RewardConfig, RewardRunner, load_reward_functions

from .conftest import FIXTURE, fn_of, make_group


def score(runner: RewardRunner, group: GroupRewardInput) -> Any:
    return asyncio.run(runner.score_group(group))


def ones(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def test_a_trl_style_function_works_unchanged_on_chat_completions() -> None:
    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion[0]["content"])) for completion in completions]

    with RewardRunner([fn_of(reward_len)]) as runner:
        result = score(runner, make_group(3))
    assert result.rewards == [-19.0, -18.0, -17.0]
    assert result.per_function == {"reward_len": [-19.0, -18.0, -17.0]} and result.errors == 0


def test_functions_loaded_from_a_config_score_a_plain_group() -> None:
    cfg = RewardConfig(reward_funcs=["exact_match", f"{FIXTURE}:accuracy"], reward_weights=[1.0, 0.5])
    with RewardRunner.from_config(cfg, columns=["answer"]) as runner:
        assert score(runner, make_group(2, chat=False, answer="7")).rewards == [1.5, 0.0]


def test_every_call_gets_trls_arguments_and_the_columns_as_lists() -> None:
    seen: list[dict[str, Any]] = []

    def spy(**kwargs: Any) -> list[float]:
        seen.append(kwargs)
        return [0.0] * len(kwargs["completions"])

    with RewardRunner([fn_of(spy)]) as runner:
        score(runner, make_group(2, answer="7", task="arithmetic"))
    (kw,) = seen
    assert set(kw) == {"prompts", "completions", "completion_ids", "answer", "task"}
    assert kw["answer"] == ["7", "7"] and kw["task"] == ["arithmetic"] * 2
    assert kw["prompts"] == [[{"role": "user", "content": "3+4="}]] * 2
    assert kw["completions"] == [[{"role": "assistant", "content": "7"}], [{"role": "assistant", "content": "77"}]]
    assert kw["completion_ids"] == [[7], [7, 7]]


def test_each_function_is_called_once_per_group() -> None:
    calls: list[int] = []

    def counted(completions: Any, **kwargs: Any) -> list[float]:
        calls.append(len(completions))
        return [1.0] * len(completions)

    with RewardRunner([fn_of(counted), fn_of(ones)], workers=2) as runner:
        for _ in range(3):
            score(runner, make_group(8))
        runner.score_group_sync(make_group(8))
    assert calls == [8, 8, 8, 8]


def test_a_functions_in_place_edit_of_its_arguments_stays_its_own() -> None:
    def greedy(completions: Any, **kwargs: Any) -> list[float]:
        n = len(completions)
        completions.clear()
        return [0.0] * n

    with RewardRunner([fn_of(greedy), fn_of(ones)]) as runner:
        assert score(runner, make_group(2)).rewards == [1.0, 1.0]


def test_the_reward_is_the_weighted_sum_over_functions_that_did_not_return_none() -> None:
    def a(completions: Any, **kwargs: Any) -> list[float | None]:
        return [1.0, None, 1.0]

    def b(completions: Any, **kwargs: Any) -> list[float | None]:
        return [None, None, 0.5]

    with RewardRunner([fn_of(a, weight=2.0), fn_of(b, weight=10.0)]) as runner:
        result = score(runner, make_group(3))
    assert result.rewards == [2.0, 0.0, 7.0]  # sample 1: every function returned None -> 0.0
    assert result.per_function == {"a": [1.0, None, 1.0], "b": [None, None, 0.5]}


def test_sync_scoring_gives_the_same_result_as_async_scoring() -> None:
    def a(completions: Any, **kwargs: Any) -> list[float | None]:
        return [float(len(c[0]["content"])) if len(c[0]["content"]) > 1 else None for c in completions]

    with RewardRunner([fn_of(a, weight=0.5), fn_of(ones)], workers=1) as runner:
        assert runner.score_group_sync(make_group(3)) == score(runner, make_group(3))


def raises(completions: Any, **kwargs: Any) -> list[float]:
    raise ValueError("bad input\nsecond line")


def returns_nan(completions: Any, **kwargs: Any) -> list[float]:
    return [float("nan")] * len(completions)


def returns_too_few(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0]


def returns_a_float(completions: Any, **kwargs: Any) -> float:
    return 1.0


def returns_a_string(completions: Any, **kwargs: Any) -> list[Any]:
    return ["1.0"] * len(completions)


FAILURES = [
    (raises, "ValueError: bad input second line; fix the function or set reward_error: zero"),
    (returns_nan, "value 0 is nan (return None for 'does not apply'); fix the function"),
    (returns_too_few, "returned 1 values for 3 completions; fix the function"),
    (returns_a_float, "returned float 1.0, not a list of 3; fix the function"),
    (returns_a_string, "value 0 is str '1.0', not a number; fix the function"),
]


@pytest.mark.parametrize(("bad", "expected"), FAILURES, ids=lambda x: getattr(x, "__name__", ""))
def test_a_failed_call_in_fail_mode_raises_naming_the_function_and_prompt(bad: Any, expected: str) -> None:
    with RewardRunner([fn_of(ones), fn_of(bad)], on_error="fail") as runner:
        with pytest.raises(RewardFunctionError) as err:
            score(runner, make_group(3, prompt_index=17))
        assert f"reward function '{bad.__name__}' (test:{bad.__name__}) failed on prompt 17: " in str(err.value)
        assert expected in str(err.value) and "\n" not in str(err.value)
        assert runner.take_stats()["train/reward_errors"] == 1.0
        with pytest.raises(RewardFunctionError, match="failed on prompt 17"):
            runner.score_group_sync(make_group(3))


@pytest.mark.parametrize(("bad", "expected"), FAILURES, ids=lambda x: getattr(x, "__name__", ""))
def test_a_failed_call_in_zero_mode_scores_that_function_zero_and_counts_the_error(bad: Any, expected: str) -> None:
    with RewardRunner([fn_of(ones, weight=2.0), fn_of(bad)], on_error="zero") as runner:
        result = score(runner, make_group(3))
        assert result.rewards == [2.0, 2.0, 2.0]
        assert result.per_function[bad.__name__] == [0.0, 0.0, 0.0] and result.errors == 1
        assert runner.score_group_sync(make_group(3)) == result
        stats = runner.take_stats()
    assert stats["train/reward_errors"] == 2.0
    assert f"train/rewards/{bad.__name__}_mean" not in stats  # failed calls are not the function's values
    assert stats["train/rewards/ones_mean"] == 1.0


def stuck_function(release: threading.Event, returned: list[str] | None = None) -> Any:
    """A function that blocks until ``release`` is set (at teardown), then appends ``"returned"`` to ``returned``."""

    def stuck(completions: Any, **kwargs: Any) -> list[float]:
        release.wait(10)
        if returned is not None:
            returned.append("returned")
        return [1.0] * len(completions)

    return stuck


def test_a_timed_out_call_in_fail_mode_raises_naming_the_function_and_prompt(release: threading.Event) -> None:
    returned: list[str] = []
    with RewardRunner([fn_of(stuck_function(release, returned))], timeout_s=0.2, on_error="fail", workers=2) as runner:
        with pytest.raises(RewardFunctionError) as err:
            score(runner, make_group(2, prompt_index=5))
        assert returned == [] and not release.is_set()  # raised while the stuck call still runs: not awaited
        message = str(err.value)
        assert "reward function 'stuck' (test:stuck) failed on prompt 5: timed out after 0.2 s" in message
        assert "raise reward_timeout_s" in message and "\n" not in message
        with pytest.raises(RewardFunctionError, match=r"timed out after 0\.2 s"):
            runner.score_group_sync(make_group(2))


def test_a_timed_out_call_in_zero_mode_scores_zero_and_frees_the_group(release: threading.Event) -> None:
    returned: list[str] = []
    stuck = stuck_function(release, returned)
    runner = RewardRunner([fn_of(ones), fn_of(stuck)], timeout_s=0.2, on_error="zero", workers=3)
    with runner:
        result = score(runner, make_group(2))
        assert returned == [] and not release.is_set()  # the group is scored while the stuck call still runs
        assert result.rewards == [1.0, 1.0] and result.per_function["stuck"] == [0.0, 0.0]
        assert runner.score_group_sync(make_group(2)).errors == 1
        assert runner.take_stats()["train/reward_errors"] == 2.0


def test_the_timeout_counts_from_when_a_call_gets_a_worker() -> None:
    def slow(completions: Any, **kwargs: Any) -> list[float]:
        time.sleep(0.15)
        return [1.0] * len(completions)

    async def many(runner: RewardRunner) -> list[Any]:
        return await asyncio.gather(*(runner.score_group(make_group(1)) for _ in range(4)))

    with RewardRunner([fn_of(slow)], timeout_s=0.4, workers=1, on_error="fail") as runner:
        results = asyncio.run(many(runner))  # 4 x 0.15 s on one worker: the last waits 0.45 s > timeout_s
    assert [r.rewards for r in results] == [[1.0]] * 4


def test_zero_mode_logs_each_kind_of_failure_once_per_function_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lightning_hybrid_rollout.rewards.runner")
    with RewardRunner([fn_of(raises), fn_of(returns_nan)], on_error="zero") as runner:
        for _ in range(3):
            score(runner, make_group(2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert any("'raises'" in w and "ValueError: bad input" in w for w in warnings)
    assert any("'returns_nan'" in w and "is nan" in w for w in warnings)
    assert all("\n" not in w for w in warnings)
    repeats = [r for r in caplog.records if r.levelno == logging.DEBUG and "failed on prompt" in r.getMessage()]
    assert len(repeats) == 4


def test_take_stats_gives_means_over_non_none_values_since_the_last_take_and_resets() -> None:
    def half(completions: Any, **kwargs: Any) -> list[float | None]:
        return [None, 4.0] + [2.0] * (len(completions) - 2)

    ticks = iter(range(1000))
    with RewardRunner([fn_of(half), fn_of(raises)], on_error="zero", clock=lambda: float(next(ticks))) as runner:
        runner.score_group_sync(make_group(2))
        runner.score_group_sync(make_group(3))
        stats = runner.take_stats()
        assert stats["train/rewards/half_mean"] == pytest.approx((4.0 + 4.0 + 2.0) / 3)
        assert stats["train/reward_errors"] == 2.0
        assert stats["train/rewards/half_time_s"] > 0
        assert runner.take_stats() == {"train/reward_errors": 0.0}
        runner.score_group_sync(make_group(2))
        assert runner.take_stats()["train/rewards/half_mean"] == 4.0
        total = runner.cumulative_stats()
    assert total["train/rewards/half_mean"] == pytest.approx(14.0 / 4) and total["train/reward_errors"] == 3.0


def test_call_durations_come_from_the_injected_clock() -> None:
    readings = iter([10.0, 10.75, 20.0, 20.25])  # two calls: 0.75 s, then 0.25 s

    with RewardRunner([fn_of(ones)], clock=lambda: next(readings)) as runner:
        score(runner, make_group(2))
        runner.score_group_sync(make_group(2))
        assert runner.take_stats()["train/rewards/ones_time_s"] == 0.5


def test_scoring_runs_off_the_event_loop() -> None:
    """The function waits for a coroutine on the scoring loop to run: it only can if the call is off that loop."""
    started, loop_ran = threading.Event(), threading.Event()
    saw_the_loop: list[bool] = []

    def waits_for_the_loop(completions: Any, **kwargs: Any) -> list[float]:
        started.set()
        saw_the_loop.append(loop_ran.wait(5))  # False: the loop was held while this call ran
        return [1.0] * len(completions)

    async def main(runner: RewardRunner) -> None:
        async def on_the_loop() -> None:
            while not started.is_set():
                await asyncio.sleep(0.001)
            loop_ran.set()

        task = asyncio.create_task(on_the_loop())
        await asyncio.sleep(0)
        await runner.score_group(make_group(2))
        await task

    with RewardRunner([fn_of(waits_for_the_loop)]) as runner:
        asyncio.run(main(runner))
    assert saw_the_loop == [True]


def _overlap_recorder(wait_s: float) -> tuple[list[tuple[str, str]], Callable[[str], Any]]:
    """Reward functions that log ``(start|end, name)`` and, once started, wait up to ``wait_s`` for every other
    function to start too: with room for all, all start before any ends; without, none overlaps another."""
    events: list[tuple[str, str]] = []
    cond = threading.Condition()

    def make(name: str) -> Any:
        def fn(completions: Any, **kwargs: Any) -> list[float]:
            with cond:
                events.append(("start", name))
                cond.notify_all()
                cond.wait_for(lambda: sum(kind == "start" for kind, _ in events) >= 2, wait_s)
                events.append(("end", name))
            return [1.0] * len(completions)

        return fn

    return events, make


def test_the_functions_of_a_group_run_concurrently_up_to_workers() -> None:
    events, make = _overlap_recorder(wait_s=10.0)  # 2 workers: both start at once, no wait
    with RewardRunner([fn_of(make("a"), name="a"), fn_of(make("b"), name="b")], workers=2) as runner:
        score(runner, make_group(1))
    assert [kind for kind, _ in events] == ["start", "start", "end", "end"], events

    events, make = _overlap_recorder(wait_s=0.3)  # 1 worker: each waits in vain for the other, then ends
    with RewardRunner([fn_of(make("a"), name="a"), fn_of(make("b"), name="b")], workers=1) as runner:
        score(runner, make_group(1))
    assert [kind for kind, _ in events] == ["start", "end", "start", "end"], events


def test_a_process_pool_loads_the_functions_again_in_its_workers_and_scores() -> None:
    cfg = RewardConfig(
        reward_funcs=[f"{FIXTURE}:accuracy", {"class_path": "format", "init_args": {"pattern": "7+"}}, "math_verify"],
        reward_pool="process",
        reward_workers=2,
        reward_timeout_s=60,
    )
    with RewardRunner.from_config(cfg, columns=["answer"]) as runner:
        result = score(runner, make_group(2, answer="7"))
        assert runner.score_group_sync(make_group(2, answer="7")) == result
    assert result.per_function == {"accuracy": [1.0, 0.0], "FormatReward": [1.0, 1.0], "math_verify": [1.0, 0.0]}


def test_a_failure_in_a_process_pool_names_the_function_and_its_error() -> None:
    cfg = RewardConfig(reward_funcs=["exact_match"], reward_pool="process", reward_error="fail")
    expected = r"'exact_match' \(exact_match\) failed on prompt 17: TypeError"  # no 'answer' column
    with RewardRunner.from_config(cfg) as runner, pytest.raises(RewardFunctionError, match=expected):
        score(runner, make_group(2))


def test_a_function_that_does_not_load_in_a_worker_process_says_so(tmp_path: Path) -> None:
    source = tmp_path / "main_only.py"
    source.write_text(
        "import multiprocessing\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    raise RuntimeError('main process only')\n"
        "def score(completions, **kwargs):\n"
        "    return [1.0] * len(completions)\n"
    )
    cfg = RewardConfig(reward_funcs=[f"{source}:score"], reward_pool="process")
    expected = r"does not load in a worker process: .*RuntimeError: main process only"
    with RewardRunner.from_config(cfg) as runner, pytest.raises(RewardFunctionError, match=expected):
        score(runner, make_group(1))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_close_terminates_a_process_worker_stuck_in_a_timed_out_call(tmp_path: Path) -> None:
    source, pid_file = tmp_path / "stuck.py", tmp_path / "pid"
    source.write_text(
        "import os, time\n"
        "def stuck(completions, pid_file, **kwargs):\n"
        "    open(pid_file[0], 'w').write(str(os.getpid()))\n"
        "    time.sleep(60)\n"
    )
    cfg = RewardConfig(
        reward_funcs=[f"{source}:stuck"], reward_pool="process", reward_timeout_s=1.0, reward_error="zero"
    )
    runner = RewardRunner.from_config(cfg)
    assert score(runner, make_group(1, pid_file=str(pid_file))).errors == 1
    deadline = time.monotonic() + 10  # on a busy machine the worker may still be starting
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    assert _alive(pid)
    runner.close()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_math_verify_scores_in_the_thread_pool_without_the_signal_error() -> None:
    group = GroupRewardInput.from_prompt(
        3, "q", [r"so \boxed{42}", "The answer is 42.", "41", "42"], [[1]] * 4, {"solution": "42"}
    )
    cfg = RewardConfig(reward_funcs=["math_verify"], reward_workers=2)
    with RewardRunner.from_config(cfg) as runner:
        assert score(runner, group).rewards == [1.0, 1.0, 0.0, 1.0]
        assert runner.score_group_sync(group).rewards == [1.0, 1.0, 0.0, 1.0]


def test_a_closed_runner_refuses_to_score_and_closing_twice_is_harmless() -> None:
    runner = RewardRunner(load_reward_functions(RewardConfig(reward_funcs=["exact_match"])))
    runner.close()
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.score_group_sync(make_group(1, answer="7"))


def test_a_runner_needs_functions_and_valid_settings() -> None:
    with pytest.raises(ConfigError, match="reward_funcs is empty"):
        RewardRunner([])
    with pytest.raises(ConfigError, match="workers=0"):
        RewardRunner([fn_of(ones)], workers=0)


def test_a_group_needs_one_entry_per_completion_in_every_list() -> None:
    with pytest.raises(ValueError, match=r"prompt 4: each list needs one entry per completion \(2\).*'answer': 1"):
        GroupRewardInput(4, ["p", "p"], ["a", "b"], [[1], [2]], {"answer": ["7"]})
    with pytest.raises(ValueError, match="column 'prompts' has the name of a TRL argument"):
        GroupRewardInput(4, ["p"], ["a"], [[1]], {"prompts": ["x"]})
    with pytest.raises(ValueError, match="needs one entry"):
        GroupRewardInput(4, [], [], [])


def test_from_prompt_wraps_chat_completions_as_assistant_messages_and_broadcasts_columns() -> None:
    plain = GroupRewardInput.from_prompt(1, "3+4=", ["7", "8"], [(7,), (8,)], {"answer": "7"})
    assert (plain.is_chat, plain.completions, plain.prompts) == (False, ["7", "8"], ["3+4=", "3+4="])
    assert plain.columns == {"answer": ["7", "7"]} and plain.completion_ids == [[7], [8]]
    messages = [{"role": "user", "content": "3+4="}]
    chat = GroupRewardInput.from_prompt(1, messages, ["7"], [[7]])
    assert chat.is_chat and chat.completions == [[{"role": "assistant", "content": "7"}]] and chat.prompts == [messages]
