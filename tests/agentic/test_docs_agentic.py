"""docs/agentic.md's examples do what the page says: its tool and its environment load and run."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from lightning_hybrid_rollout.agentic import ToolCall, ToolRunner, TrlEnvironment, load_environment, load_tools

DOC = Path(__file__).resolve().parents[2] / "docs" / "agentic.md"


def _files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL):
        name = block.splitlines()[0].removeprefix("# ").strip()
        out[name] = tmp_path / name
        out[name].write_text(block)
    return out


def test_the_pages_tool_and_environment_load_and_run(tmp_path: Path) -> None:
    files = _files(tmp_path)
    assert set(files) == {"my_tools.py", "my_env.py"}
    runner = ToolRunner(load_tools([f"{files['my_tools.py']}:add"]))
    assert asyncio.run(runner.run(ToolCall("add", {"a": 2, "b": 3}))).content == "5"
    runner.close()
    env = load_environment(f"{files['my_env.py']}:CounterEnv").make()
    assert isinstance(env, TrlEnvironment) and [t.name for t in env.tools] == ["increment"]
    assert env.reset({"target": 2, "prompt": "p"}) == "Reach 2 with the increment tool."
    env.tools[0].fn(by=2)
    assert env.reward() == 1.0


def test_the_pages_configuration_is_accepted_by_the_callback_and_names_every_key() -> None:
    import dataclasses

    import yaml

    from lightning_hybrid_rollout import HybridRolloutCallback
    from lightning_hybrid_rollout.agentic import AgenticConfig
    from lightning_hybrid_rollout.lightning.config_check import check_init_args

    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL).group(1)
    init_args = yaml.safe_load(block)["trainer"]["callbacks"][0]["init_args"]
    assert check_init_args("callback", HybridRolloutCallback, init_args) == []
    documented = set(re.findall(r"^\| `(\w+)` \|", DOC.read_text(), re.MULTILINE))
    keys = {f.name for f in dataclasses.fields(AgenticConfig)} - {"tool_workers"}  # the pool size: not a key
    assert keys <= documented and keys <= set(init_args["agentic"])
