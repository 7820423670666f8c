"""docs/workloads.md's examples: the YAML's dataset/reward sections are valid configs, the reward runs as shown."""

from __future__ import annotations

from pathlib import Path

import yaml

from lightning_hybrid_rollout.rewards import GroupRewardInput, RewardConfig, RewardFunction, RewardRunner
from lightning_hybrid_rollout.sources import DatasetConfig

DOC = (Path(__file__).resolve().parents[1] / "docs" / "workloads.md").read_text()


def _block(lang: str) -> str:
    return DOC.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_the_yaml_example_holds_a_valid_dataset_and_reward_config() -> None:
    from lightning_hybrid_rollout.lightning.config_check import check_callback_args

    args = yaml.safe_load(_block("yaml"))["trainer"]["callbacks"][0]["init_args"]
    dataset = DatasetConfig.from_dict(args["dataset"])
    assert dataset.prompt_column == "prompt" and dataset.val_path == "data/val.jsonl"
    rewards = RewardConfig.from_dict(args["rewards"])
    assert rewards.weights == [1.0, 0.5] and rewards.reward_error == "fail"
    assert check_callback_args("callback", args) == []


def test_the_reward_example_scores_a_chat_group_in_trls_convention() -> None:
    namespace: dict = {}
    exec(_block("python"), namespace)
    fn = RewardFunction(name="accuracy", fn=namespace["accuracy"])
    chat = [{"role": "user", "content": "2+2?"}]
    group = GroupRewardInput.from_prompt(0, chat, ["It is 4", "5"], [[1], [2]], {"answer": "4"})
    with RewardRunner([fn]) as runner:
        assert runner.score_group_sync(group).rewards == [1.0, 0.0]


def test_the_dynamic_sampling_yaml_is_a_valid_rollout_config() -> None:
    from lightning_hybrid_rollout.config import RolloutConfig

    block = next(b.split("```", 1)[0] for b in DOC.split("```yaml\n")[1:] if "filter_groups" in b.split("```", 1)[0])
    rollout = RolloutConfig.from_dict(yaml.safe_load(block)["trainer"]["callbacks"][0]["init_args"]["rollout"])
    assert rollout.filter_groups is True and rollout.max_num_gen_batches == 10


def test_the_hub_ids_yaml_is_a_valid_rollout_and_dataset_config() -> None:
    from lightning_hybrid_rollout.config import RolloutConfig

    block = next(b.split("```", 1)[0] for b in DOC.split("```yaml\n")[1:] if "hub ids" in b.split("```", 1)[0])
    doc = yaml.safe_load(block)
    rollout = RolloutConfig(**doc["rollout"])
    dataset = DatasetConfig.from_dict(doc["dataset"])
    assert rollout.model_revision == "main" and dataset.name == "main" and dataset.test_split == "test"
