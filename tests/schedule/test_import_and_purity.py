"""schedule/ stays pure: light to import (no torch/Ray/vLLM/Lightning), no clock reads, no I/O, no print."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning_hybrid_rollout.schedule as schedule

REPO = Path(__file__).parents[2]
SCHEDULE_DIR = Path(schedule.__file__).parent
HEAVY = ("torch", "ray", "vllm", "lightning", "transformers")


def run_python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_schedule_loads_no_heavy_framework():
    out = run_python(
        "import lightning_hybrid_rollout.schedule, sys, json; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert json.loads(out) == []


def test_plain_package_import_registers_all_three_builtin_policies_and_stays_light():
    out = run_python(
        "import lightning_hybrid_rollout, sys, json; "
        "registry = sys.modules['lightning_hybrid_rollout.schedule.base']._REGISTRY; "
        f"print(json.dumps([sorted(registry), [m for m in {HEAVY!r} if m in sys.modules]]))"
    )
    names, heavy = json.loads(out)
    assert {"default", "static_fully_async", "fixed_ratio"} <= set(names)
    assert heavy == []


FORBIDDEN_MODULES = {"time", "datetime", "asyncio", "threading", "socket", "os", "io", "ray", "torch", "vllm"}
FORBIDDEN_CALLS = {"print", "open", "input"}


def test_schedule_sources_have_no_clock_reads_io_or_print():
    problems: list[str] = []
    for path in sorted(SCHEDULE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                roots = set()
            problems += [f"{path.name}:{node.lineno} imports {r}" for r in roots & FORBIDDEN_MODULES]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
                problems.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    assert problems == []


def test_schedule_exports_the_documented_public_names():
    expected = {
        "DynamicSchedulePolicyBase",
        "DynamicScheduleContext",
        "register_policy",
        "create_policy",
        "available_policies",
        "get_policy_class",
        "DynamicResourceController",
        "ControllerState",
        "ReplicaPool",
        "ReplicaPoolError",
        "StepStartResult",
        "StepEndResult",
        "DefaultDynamicSchedulePolicy",
        "StaticFullyAsyncPolicy",
        "FixedRatioDynamicSchedulePolicy",
    }
    assert expected <= set(schedule.__all__)
    assert all(hasattr(schedule, name) for name in schedule.__all__)
