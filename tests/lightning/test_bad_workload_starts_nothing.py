"""A bad data set or reward function, met through ``Trainer.fit``: one line naming it and the fix, nothing started.

Each case runs a real ``lightning.pytorch.Trainer(...).fit(...)`` with :class:`HybridRolloutCallback`, a
:class:`GRPOModule` and a :class:`RolloutDataModule`, as a user would, on the tiny local model (built once for the
module). The callback's ``setup`` builds and checks the workload before the rollout runtime starts, so the fit must
stop there with one exception of the package whose message is a single line, and leave nothing behind: Ray never
started (nor imported, nor vLLM, if they were not yet), no child process, no run files of this process under
``$TMPDIR/lhr-<uid>`` or the shared-memory staging root, and an empty run directory (no Ray session dir, replica
logs or trace). ``RayRuntime.start`` (the package's only call of ``ray.init``) is replaced by a spy that fails the
test if anything gets that far, since the callback's clean-up on the exception would otherwise hide it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import psutil
import pytest

from lightning_hybrid_rollout.config import RolloutConfig
from lightning_hybrid_rollout.errors import ConfigError, DatasetError, HybridRolloutError, RewardFunctionError
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.rollout import run_guard
from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

#: Lightning's note on the ``dataloader_iter`` step: raised by ``Trainer.fit`` before any callback hook (``lhr fit``
#: hides it around the run, lightning/expected_warnings.py), so a plain fit shows it.
pytestmark = pytest.mark.filterwarnings("ignore:You are using the `dataloader_iter` step flavor")

#: Good rows: plain prompts the tiny char tokenizer encodes, with an ``answer`` column.
GOOD_ROWS: list[dict[str, Any]] = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("bad_workload") / "tiny", hidden=64, layers=1, seed=0)


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_text(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


#: A case builds, in the test's (current) directory, the callback's ``dataset`` and ``reward_funcs`` arguments (and,
#: optionally, ``rollout`` settings).
Inputs = tuple[dict[str, Any], list[str]] | tuple[dict[str, Any], list[str], dict[str, Any]]
CASES: dict[str, tuple[Callable[[Path], Inputs], type[HybridRolloutError], list[str]]] = {
    "missing_data_file": (
        lambda d: ({"path": str(d / "nope.jsonl")}, ["exact_match"]),
        DatasetError,
        ["nope.jsonl not found", "give a local .jsonl/.json/.parquet/.csv file, a save_to_disk directory or a hub"],
    ),
    "unknown_format": (
        lambda d: ({"path": write_text(d / "prompts.txt", "1+1=\n")}, ["exact_match"]),
        DatasetError,
        ["prompts.txt", "unknown format '.txt'", ".jsonl/.json/.parquet/.csv"],
    ),
    "missing_prompt_column": (
        lambda d: ({"path": write_jsonl(d / "q.jsonl", [{"question": "1+1=", "answer": "2"}])}, ["exact_match"]),
        DatasetError,
        ["q.jsonl", "has no column 'prompt' (columns: question, answer)", "Set dataset.prompt_column"],
    ),
    "malformed_chat_message": (
        lambda d: (
            {
                "path": write_jsonl(
                    d / "chat.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": [{"role": "user"}]}]
                )
            },
            ["exact_match"],
        ),
        DatasetError,
        [
            "chat.jsonl row 1 (counting from 0), message 0: 'content' is missing",
            'each message must be {"role": "<system|user|assistant>", "content": "<text>"}',
        ],
    ),
    "empty_file": (
        lambda d: ({"path": write_text(d / "empty.jsonl", "")}, ["exact_match"]),
        DatasetError,
        ["empty.jsonl is empty", "give a file with at least one row"],
    ),
    "reward_module_does_not_import": (
        lambda d: ({"path": write_jsonl(d / "ok.jsonl", GOOD_ROWS)}, ["nope_module:fn"]),
        RewardFunctionError,
        [
            "reward function 'nope_module:fn'",
            "module 'nope_module' does not import: ModuleNotFoundError",
            "check the module name and that it is installed or on sys.path",
        ],
    ),
    "reward_file_missing": (
        lambda d: ({"path": write_jsonl(d / "ok.jsonl", GOOD_ROWS)}, ["missing.py:fn"]),
        RewardFunctionError,
        [
            "reward function 'missing.py:fn'",
            "missing.py' not found (a relative path is read from the current directory",
            "fix the path",
        ],
    ),
    "reward_wrong_signature": (
        lambda d: (
            {"path": write_jsonl(d / "ok.jsonl", GOOD_ROWS)},
            [write_text(d / "my_reward.py", "def r(x):\n    return [0.0]\n") + ":r"],
        ),
        RewardFunctionError,
        [
            "my_reward.py:r'",
            "parameter 'x' is required but is none of prompts, completions, completion_ids or the data set's "
            "columns (answer); give it a default, rename it after a column, or take it from **kwargs",
        ],
    ),
    "group_filter_module_does_not_import": (
        lambda d: ({"path": write_jsonl(d / "ok.jsonl", GOOD_ROWS)}, ["exact_match"], {"filter_groups": "nope:keep"}),
        ConfigError,
        ["rollout.filter_groups 'nope:keep'", "module 'nope' does not import: ModuleNotFoundError"],
    ),
    "group_filter_not_callable": (
        lambda d: (
            {"path": write_jsonl(d / "ok.jsonl", GOOD_ROWS)},
            ["exact_match"],
            {"filter_groups": write_text(d / "filters.py", "keep = 3\n") + ":keep"},
        ),
        ConfigError,
        ["filters.py:keep' is not a function (it is int 3)", "point it at a function samples -> bool"],
    ),
}


def run_files_of_this_process() -> list[Path]:
    """Run and staging directories whose ``owner.json`` names this process (other runs on the machine ignored)."""
    roots = [Path(tempfile.gettempdir()) / f"lhr-{os.getuid()}", Path("/dev/shm"), Path(tempfile.gettempdir())]
    found = []
    for root in roots:
        for owner in root.glob(f"*/{run_guard.OWNER_FILE}") if root.is_dir() else []:
            try:
                pid = json.loads(owner.read_text()).get("pid")
            except (OSError, ValueError):
                continue
            if pid == os.getpid():
                found.append(owner.parent)
    return found


def live_children() -> set[int]:
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    }


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_workload_stops_the_fit_with_one_line_and_starts_nothing(
    case: str,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ray_started_by_test: Callable[[], bool],
) -> None:
    make_inputs, error_type, fragments = CASES[case]
    monkeypatch.chdir(tmp_path)  # relative reward paths are read from here
    dataset, reward_funcs, *rollout_settings = make_inputs(tmp_path)
    ray_starts: list[str] = []

    def spy_start(self: RayRuntime) -> RayRuntime:
        ray_starts.append(case)
        raise AssertionError("Ray was started although the workload is bad: the check must come first")

    monkeypatch.setattr(RayRuntime, "start", spy_start)
    imported_before = {name: name in sys.modules for name in ("ray", "vllm")}
    children_before = live_children()
    files_before = set(run_files_of_this_process())  # e.g. the staging directory of an earlier test's weight push
    filters_before = list(warnings.filters)
    run_dir = tmp_path / "run"

    callback = HybridRolloutCallback(
        RolloutConfig(model_path=str(model_dir), n=2, prompt_length=32, response_length=4, **dict(*rollout_settings)),
        dataset=dataset,
        rewards={"reward_funcs": reward_funcs or []},
        run_dir=str(run_dir),
    )
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="hybrid_single_device",
        max_steps=1,
        callbacks=[callback],
        default_root_dir=str(run_dir),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(HybridRolloutError) as info:
        trainer.fit(GRPOModule(), datamodule=RolloutDataModule())

    # one exception of the right kind, one line naming what is wrong and the fix
    assert type(info.value) is error_type, repr(info.value)
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    # nothing started, nothing left behind
    assert ray_starts == []
    for name, was_imported in imported_before.items():
        assert was_imported or name not in sys.modules, f"{name} was imported by a fit that never starts"
    assert not ray_started_by_test()
    assert live_children() - children_before == set()
    assert set(run_files_of_this_process()) - files_before == set()
    assert not run_dir.exists() or list(run_dir.iterdir()) == []
    assert callback.runtime is None and callback.controller is None
    assert warnings.filters == filters_before  # the warnings the callback hid from its setup are shown again
