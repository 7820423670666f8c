"""The workload's seams to the rollouter: the checkpointable prompt feed and a finished group's reward input."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.rollout.group_filter import rewards_vary
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.run.workload import PROMPT_KEY, PromptFeed, group_reward_input, load_group_filter
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


def _agentic_workload(tiny_model_dir: Path, agentic: Any, dataset: Any = None, **rewards: Any) -> Any:
    from transformers import AutoTokenizer

    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.rewards import RewardConfig
    from lightning_hybrid_rollout.run.workload import build_workload

    return build_workload(
        dataset=dataset,
        task="arithmetic",
        task_kwargs=None,
        rewards=RewardConfig(**rewards),
        rollout=RolloutConfig(model_path=str(tiny_model_dir), prompt_length=64, response_length=32, max_model_len=256),
        tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir),
        agentic=agentic,
    )


def test_with_an_environment_the_data_set_and_the_reward_functions_are_optional(tiny_model_dir: Path, run_async):
    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
    from lightning_hybrid_rollout.run.workload import ResetPrompts

    env = "tests/agentic/my_envs.py:GuessEnv"
    workload = _agentic_workload(tiny_model_dir, AgenticConfig(environment=env, max_episode_tokens=256))
    try:
        assert isinstance(workload.source, ResetPrompts) and workload.runner is None
        assert workload.episodes is not None and workload.episodes.factory is not None
        first = next(iter(workload.prompt_feed()))
        assert first["prompt"] == "" and first[PROMPT_KEY]["index"] == 0
        # the reward is the environment's alone
        samples = [
            Sample(f"u{i}", "g", "", [1], [5], [0.0], metadata={"episode": {"env_reward": r}})
            for i, r in enumerate([1.0, -0.1])
        ]
        assert run_async(workload.scorer().score_group(samples)) == [1.0, -0.1]
    finally:
        workload.close()


def test_an_episodes_reward_functions_read_its_last_model_turn(tiny_model_dir: Path):
    sample = Sample("u", "g", "p", [1], [7, 8, 9, 10, 11], [0.0] * 5, loss_mask=[1, 1, 0, 0, 1])
    sample2 = Sample("v", "g", "p", [1], [7, 8, 9], [0.0] * 3, loss_mask=[1, 1, 1])
    from lightning_hybrid_rollout.run.workload import last_model_turn

    assert last_model_turn(sample) == [11] and last_model_turn(sample2) == [7, 8, 9]


@pytest.mark.parametrize(
    ("agentic", "fragment"),
    [
        ({"environment": "no_such_env.py:Env"}, "no_such_env.py"),
        ({"environment": "tests/agentic/my_envs.py:NoReset"}, "no reset()"),
        ({"tools": ("tests/agentic/my_tools.py:undocumented",)}, "undocumented"),
        ({"tools": ("tests/agentic/my_tools.py:slow",), "max_episode_tokens": 64}, "must exceed rollout.prompt_length"),
        ({"tools": ("tests/agentic/my_tools.py:slow",), "max_episode_tokens": 512}, "set rollout.max_model_len"),
    ],
)
def test_bad_agentic_input_is_one_line_before_anything_starts(tiny_model_dir: Path, agentic: dict, fragment: str):
    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig

    with pytest.raises(Exception, match=re.escape(fragment)) as err:
        _agentic_workload(tiny_model_dir, AgenticConfig(**{"max_episode_tokens": 200, **agentic}))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("episode", "engines", "want"),
    [
        (None, 552, (552, 552)),  # the engines' context is the episode's budget
        (1024, None, (1024, 1024)),  # the engines take the episode's budget
        (None, None, (4096, 4096)),  # both left out: the default for both
        (200, 256, (200, 256)),  # both set and fitting: unchanged
    ],
)
def test_an_episode_budget_left_out_is_derived_from_the_engines_context_and_the_reverse(
    episode: int | None, engines: int | None, want: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.run.workload import fit_episode_budget

    rollout = RolloutConfig(model_path="m", prompt_length=96, response_length=32, max_model_len=engines)
    with caplog.at_level("INFO", logger="lightning_hybrid_rollout.run.workload"):
        agentic, fitted = fit_episode_budget(AgenticConfig(environment="e.py:E", max_episode_tokens=episode), rollout)
    assert (agentic.max_episode_tokens, fitted.engine_max_model_len()) == want
    keys = (("max_episode_tokens", episode), ("rollout.max_model_len", engines))
    derived = [name for name, given in keys if not given]
    assert all(any(f"{name} left out: " in r.getMessage() for r in caplog.records) for name in derived)


def test_a_single_turn_run_keeps_the_engines_context() -> None:
    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.run.workload import fit_episode_budget

    rollout = RolloutConfig(model_path="m", prompt_length=96, response_length=32)
    assert fit_episode_budget(AgenticConfig(), rollout) == (AgenticConfig(), rollout)


def test_an_environment_added_to_the_smollm2_example_fits_its_engines_without_another_key() -> None:
    import yaml

    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.run.workload import fit_episode_budget

    config = yaml.safe_load(Path("examples/smollm2_cpu.yaml").read_text())
    init = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("HybridRolloutCallback"))
    rollout = RolloutConfig(**init["init_args"]["rollout"])
    agentic = AgenticConfig(environment="examples/agentic/guess_env.py:GuessNumber", max_turns=4)  # nothing else
    agentic, fitted = fit_episode_budget(agentic, rollout)
    assert agentic.max_episode_tokens == fitted.engine_max_model_len() == rollout.max_model_len


def test_an_environment_added_to_the_quickstart_fits_the_tiny_model_and_vllm_accepts_its_engines(
    tmp_path: Path,
) -> None:
    """The quickstart's tiny model holds 512 positions: the default episode budget (4096) is capped to it, where
    vLLM refused the derived max_model_len before."""
    import yaml

    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model
    from lightning_hybrid_rollout.rollout.vllm.config import engine_config_from_rollout, engine_kwargs_for
    from lightning_hybrid_rollout.rollout.vllm.engine_args import check_engine_args
    from lightning_hybrid_rollout.run.workload import fit_episode_budget

    config = yaml.safe_load(Path("examples/quickstart_cpu.yaml").read_text())
    init = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("HybridRolloutCallback"))
    build = init["init_args"]["build_model"]
    model = build_tiny_model(tmp_path / "model", hidden=build["hidden"], layers=build["layers"], seed=build["seed"])
    rollout = RolloutConfig(**{**init["init_args"]["rollout"], "model_path": str(model)})
    agentic = AgenticConfig(environment="examples/agentic/guess_env.py:GuessNumber")  # nothing else
    agentic, fitted = fit_episode_budget(agentic, rollout)
    assert agentic.max_episode_tokens == fitted.engine_max_model_len() == 512
    check_engine_args(engine_kwargs_for(engine_config_from_rollout(fitted, tmp_path / "vllm"), on_cuda=False))


def test_an_episode_budget_longer_than_the_model_s_context_is_refused_in_one_line(tmp_path: Path) -> None:
    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.errors import ConfigError
    from lightning_hybrid_rollout.run.workload import fit_episode_budget

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 512}')
    rollout = RolloutConfig(model_path=str(tmp_path), prompt_length=16, response_length=4)
    with pytest.raises(ConfigError) as err:
        fit_episode_budget(AgenticConfig(environment="e.py:E", max_episode_tokens=1024), rollout)
    assert "model's context (512, config.json's max_position_embeddings)" in str(err.value)
    assert "lower max_episode_tokens to at most 512" in str(err.value) and "\n" not in str(err.value)


def test_a_tool_added_to_the_quickstart_that_leaves_no_room_for_a_turn_is_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    """The tiny model's tokenizer spells text out character by character: one tool's description in the system
    message is ~800 tokens, past its 512-position context. The run refused the first episode after Ray and the
    engines had started; now the workload refuses it, naming the tools and what to change."""
    import yaml
    from transformers import AutoTokenizer

    from lightning_hybrid_rollout.agentic.runtime import AgenticConfig
    from lightning_hybrid_rollout.config import RolloutConfig
    from lightning_hybrid_rollout.errors import ConfigError
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model
    from lightning_hybrid_rollout.rewards import RewardConfig
    from lightning_hybrid_rollout.run.workload import build_workload

    config = yaml.safe_load(Path("examples/quickstart_cpu.yaml").read_text())
    init = next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("HybridRolloutCallback"))
    build = init["init_args"]["build_model"]
    model = build_tiny_model(tmp_path / "model", hidden=build["hidden"], layers=build["layers"], seed=build["seed"])

    def workload(tools: tuple[str, ...], model: Path = model) -> Any:
        rollout = RolloutConfig(**{**init["init_args"]["rollout"], "model_path": str(model)})
        return build_workload(
            dataset=None,
            task=init["init_args"]["task"],
            task_kwargs=None,
            rewards=RewardConfig(),
            rollout=rollout,
            tokenizer=AutoTokenizer.from_pretrained(model),
            agentic=AgenticConfig(tools=tools),
        )

    tools = ("tests/agentic/my_tools.py:add",)
    with pytest.raises(ConfigError) as err:
        workload(tools)  # nothing else
    message = str(err.value)
    assert message.startswith("agentic.tools: the first prompt renders to ") and "\n" not in message
    assert "with the descriptions of 1 tool (" in message and "not under agentic.max_episode_tokens=512" in message
    rendered = int(message.split("renders to ")[1].split(" tokens")[0])
    plain = int(message.split("1 tool (")[1].split(" without")[0])
    assert plain < 512 <= rendered
    # a model whose context holds the description runs the same config
    longer = build_tiny_model(tmp_path / "longer", hidden=32, layers=1, max_position_embeddings=2048)
    fitted = workload(tools, model=longer)
    try:
        assert fitted.episodes is not None and fitted.episodes.budget.max_episode_tokens == 2048
    finally:
        fitted.close()
