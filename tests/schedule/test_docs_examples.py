"""Examples run: the ```python blocks of docs/policies.md and docs/controller.md, and every ``Example::`` block in
the docstrings of lightning_hybrid_rollout.schedule."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import lightning_hybrid_rollout.schedule as schedule
from lightning_hybrid_rollout.schedule import base, controller, default_policy, fixed_ratio_policy
from lightning_hybrid_rollout.schedule import static_fully_async_policy as static_policy

REPO = Path(__file__).parents[2]
MODULES: list[ModuleType] = [schedule, base, controller, default_policy, fixed_ratio_policy, static_policy]


def markdown_python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("doc", ["policies.md", "controller.md"])
def test_markdown_python_blocks_run_in_order(doc, isolated_registry):
    blocks = markdown_python_blocks(REPO / "docs" / doc)
    assert blocks, f"docs/{doc} has no ```python block"
    namespace: dict[str, object] = {"__name__": f"docs_{doc.replace('.', '_')}"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/{doc} block {i + 1}", "exec"), namespace)
        except Exception as err:  # pragma: no cover - the message is the point
            pytest.fail(f"docs/{doc} python block {i + 1} failed: {err!r}\n{block}")


def example_blocks(doc: str) -> list[str]:
    blocks: list[str] = []
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "Example::":
            continue
        indent = len(line) - len(line.lstrip())
        body: list[str] = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            body.append(nxt)
        blocks.append(textwrap.dedent("\n".join(body)))
    return blocks


def documented_objects() -> list[tuple[str, ModuleType, str]]:
    found: list[tuple[str, ModuleType, str]] = []
    for module in MODULES:
        targets: list[tuple[str, object]] = [(module.__name__, module)]
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__ or name.startswith("_"):
                continue
            targets.append((f"{module.__name__}.{name}", obj))
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    member = member.fget if isinstance(member, property) else member
                    if inspect.isfunction(member) and not attr.startswith("_"):
                        targets.append((f"{module.__name__}.{name}.{attr}", member))
        for qualname, obj in targets:
            doc = obj.__doc__ if inspect.ismodule(obj) else inspect.getdoc(obj)
            found += [(qualname, module, block) for block in example_blocks(doc or "")]
    return found


class _NullPool:
    def __getattr__(self, name: str):
        return lambda: None


class _Queue:
    def wait_until_size(self, n: int) -> None:
        pass


EXAMPLES = documented_objects()


@pytest.mark.parametrize(("qualname", "module", "block"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_docstring_example_runs(qualname, module, block, isolated_registry):
    namespace: dict[str, object] = {name: getattr(schedule, name) for name in schedule.__all__}
    namespace.update(vars(module))
    # stock objects that method-level examples refer to
    policy = schedule.DefaultDynamicSchedulePolicy()
    namespace.update(
        policy=policy,
        ctx=schedule.DynamicScheduleContext(required_samples=8, trigger_parameter_sync_step=2),
        controller=schedule.DynamicResourceController(_NullPool(), policy, clock=lambda: 0.0),
        queue=_Queue(),
        checkpoint={},
    )
    exec(compile(block, f"{qualname} Example::", "exec"), namespace)


def test_every_public_class_and_function_has_an_example_or_args():
    missing = []
    for module in MODULES:
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and not inspect.getdoc(obj):
                missing.append(f"{module.__name__}.{name}")
    assert missing == []
