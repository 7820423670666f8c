"""TaskSource: the toy tasks' seeded streams as prompt sources, exact resume, held-out prompts, TRL-style reward."""

from __future__ import annotations

import itertools
import json
import pickle
import re

import pytest

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.sources import PromptRecord, TaskReward, TaskSource
from lightning_hybrid_rollout.tasks import TASKS, get_task


def draw(source: TaskSource, n: int) -> list[PromptRecord]:
    return list(itertools.islice(iter(source), n))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_stream_is_the_tasks_own_seeded_stream(name: str) -> None:
    expected = get_task(name).sample_prompts(30, seed=7)
    records = draw(TaskSource(name, seed=7), 30)
    assert [(r.index, r.prompt, r.columns, r.epoch) for r in records] == [
        (p.index, p.prompt, p.metadata, 0) for p in expected
    ]
    assert all(isinstance(r.prompt, str) for r in records)


@pytest.mark.parametrize("first", [0, 1, 17])
def test_resume_continues_the_stream_exactly(first: int) -> None:
    uninterrupted = draw(TaskSource("arithmetic", seed=3), first + 10)
    original = TaskSource("arithmetic", seed=3)
    draw(original, first)
    state = json.loads(json.dumps(original.state_dict()))  # survives a JSON (or any plain-value) checkpoint
    resumed = TaskSource("arithmetic", seed=3)
    resumed.load_state_dict(state)
    assert draw(resumed, 10) == uninterrupted[first:]
    assert state["index"] == first


def test_resume_restores_the_generator_not_just_the_index() -> None:
    original = TaskSource("reverse", seed=0)
    draw(original, 5)
    resumed = TaskSource("reverse", seed=99)  # another seed: only the saved generator state can continue it
    resumed.load_state_dict(original.state_dict())
    assert draw(resumed, 5) == draw(original, 5)


def test_a_state_of_another_task_or_without_its_keys_raises() -> None:
    state = TaskSource("copy").state_dict()
    with pytest.raises(DatasetError, match="task 'copy', this run's is 'arithmetic'"):
        TaskSource("arithmetic").load_state_dict(state)
    with pytest.raises(DatasetError, match="needs 'index' and 'rng_state'"):
        TaskSource("arithmetic").load_state_dict({"index": 3})


def test_validation_records_are_the_val_seed_stream_and_do_not_move_training() -> None:
    source = TaskSource("arithmetic", seed=0, val_size=12)
    val = source.validation_records()
    assert [r.prompt for r in val] == [p.prompt for p in get_task("arithmetic").sample_prompts(12, seed=10_000)]
    assert source.state_dict()["index"] == 0
    assert len(TaskSource("copy").validation_records()) == 64
    assert [r.prompt for r in TaskSource("arithmetic", val_seed=1, val_size=12).validation_records()] != [
        r.prompt for r in val
    ]


def test_task_kwargs_reach_the_task_and_bad_ones_are_a_config_error() -> None:
    assert TaskSource("arithmetic", task_kwargs={"max_response_tokens": 5}).task.max_response_tokens == 5
    with pytest.raises(ConfigError, match="does not accept task_kwargs"):
        TaskSource("arithmetic", task_kwargs={"nope": 1})
    with pytest.raises(ConfigError, match=re.escape("unknown toy task 'arithmetc'. Did you mean 'arithmetic'?")):
        TaskSource("arithmetc")


def test_the_default_reward_scores_each_completion_against_its_own_records_columns() -> None:
    source = TaskSource("arithmetic", seed=0)
    records = draw(source, 10)
    first = records[0]
    other = next(r for r in records if r.columns["answer"] != first.columns["answer"])
    (fn,) = source.default_reward_funcs()
    assert fn.__name__ == "arithmetic_reward"
    columns = {k: [first.columns[k], other.columns[k]] for k in first.columns}
    completions = [other.columns["answer"] + "</s>", other.columns["answer"] + "</s>"]
    prompts = [first.prompt, other.prompt]
    assert fn(prompts, completions, [[1], [2]], trainer_state=object(), **columns) == [0.0, 1.0]


def test_the_reward_reads_conversational_completions() -> None:
    fn = TaskReward(get_task("copy"))
    completions = [[{"role": "assistant", "content": "ab"}], [{"role": "assistant", "content": "ba"}]]
    assert fn(["p", "p"], completions, None, answer=["ab", "ab"]) == [1.0, 0.0]


def test_the_reward_function_pickles_for_worker_processes() -> None:
    fn = pickle.loads(pickle.dumps(TaskSource("reverse").default_reward_funcs()[0]))
    assert fn.__name__ == "reverse_reward" and fn(["p"], ["cba"], None, answer=["cba"]) == [1.0]
