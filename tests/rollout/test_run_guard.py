"""The run's footprint (fast, no Ray): private directories, the sweep of dead runs, the watchdog.

The slow end-to-end checks (a real fit killed with SIGKILL, its sockets, its token) are in
``tests/lightning/test_run_safety.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lightning_hybrid_rollout.rollout import run_guard


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the run roots (``$TMPDIR/lhr-<uid>`` and the staging root) at a fresh directory."""
    monkeypatch.setattr(run_guard.tempfile, "gettempdir", lambda: str(tmp_path))
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(run_guard, "shm_root", lambda: shm)
    return tmp_path


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_run_files_are_private_and_record_their_owner(private_tmp: Path) -> None:
    files = run_guard.RunFiles.create()
    token = Path(files.write_token())
    assert _mode(files.root.parent) == _mode(files.root) == _mode(files.staging_dir) == 0o700
    assert _mode(token) == 0o600 and len(token.read_text()) == 64
    owner = json.loads((files.root / run_guard.OWNER_FILE).read_text())
    assert owner["pid"] == os.getpid() and run_guard.owner_alive(owner)
    assert run_guard.sweep_dead_runs() == []  # a live run is never swept
    assert files.root.exists() and files.staging_dir.exists()
    files.remove()
    assert not files.root.exists() and not files.staging_dir.exists()


def test_the_sweep_removes_a_dead_runs_files_and_processes_and_nothing_else(private_tmp: Path) -> None:
    dead = run_guard.RunFiles.create(owner_pid=os.getpid())
    (dead.staging_dir / "node-weights-1").write_bytes(b"w" * 64)
    # a process of the dead run (it inherited the run id), and an unrelated one
    env = {**os.environ, run_guard.RUN_ID_ENV: dead.run_id}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    owner = json.loads((dead.root / run_guard.OWNER_FILE).read_text())
    owner["pid"] = _dead_pid()
    for d in (dead.root, dead.staging_dir):
        (d / run_guard.OWNER_FILE).write_text(json.dumps(owner))
    # what must stay: a live run, another user's directory with the same shape, files that are not ours
    live = run_guard.RunFiles.create()
    shm = run_guard.shm_root()
    other_user = shm / f"lhr-{os.getuid()}-0therus3r"
    other_user.mkdir()
    (other_user / run_guard.OWNER_FILE).write_text(json.dumps({"pid": owner["pid"]}))
    (other_user / "node-weights-2").write_bytes(b"x")
    os.chown(other_user, 65534, 65534)
    unrelated = shm / "sem.mp-something"
    unrelated.write_bytes(b"y")
    no_owner = shm / f"lhr-{os.getuid()}-noowner"
    no_owner.mkdir()
    try:
        time.sleep(0.3)  # let the orphan exec, so its environment is readable
        assert run_guard.sweep_dead_runs() == [dead.run_id]
        orphan.wait(timeout=5)
        assert not dead.root.exists() and not dead.staging_dir.exists()
        assert bystander.poll() is None
        assert live.root.exists() and live.staging_dir.exists()
        assert (other_user / "node-weights-2").exists() and unrelated.exists() and no_owner.exists()
    finally:
        for p in (orphan, bystander):
            p.kill()
            p.wait()
        live.remove()


_OWNER = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job inherits SIGINT ignored
from lightning_hybrid_rollout.rollout import run_guard
files = run_guard.RunFiles.create()
watchdog = run_guard.start_watchdog(files)
env = {**os.environ, run_guard.RUN_ID_ENV: files.run_id}
# a "Ray daemon" (names the run dir) with a child that hides its marks, like ray::DashboardAgent
daemon = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], env={}); time.sleep(120)",
    str(files.root)], env=env)
print(files.root, watchdog.pid, daemon.pid, flush=True)
time.sleep(120)
"""


def _start_owner() -> tuple[subprocess.Popen[str], Path, int, list[int]]:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    root, watchdog, daemon = owner.stdout.readline().split()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = psutil.Process(int(daemon)).children()
        if kids and (Path(root) / run_guard.PIDS_FILE).exists():
            recorded = json.loads((Path(root) / run_guard.PIDS_FILE).read_text())
            if str(kids[0].pid) in recorded:
                return owner, Path(root), int(watchdog), [int(daemon), kids[0].pid]
        time.sleep(0.2)
    raise AssertionError("the watchdog never recorded the run's tree")


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_the_watchdog_cleans_up_when_the_trainer_dies(sig: signal.Signals) -> None:
    owner, root, watchdog, run_pids = _start_owner()
    try:
        # Ray's raylet dies with the trainer and its agents lose their parent: only the recorded tree finds them
        os.kill(run_pids[0], signal.SIGKILL)
        os.kill(owner.pid, sig)
        owner.wait(timeout=10)
        assert _gone([*run_pids, watchdog], within=10), "a process of the dead run outlived it"
        assert not root.exists()
    finally:
        for pid in [*run_pids, watchdog, owner.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_stopping_the_watchdog_kills_only_the_runs_processes(private_tmp: Path) -> None:
    files = run_guard.RunFiles.create()
    watchdog = run_guard.start_watchdog(files)
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the trainer's own child
    env = {**os.environ, run_guard.RUN_ID_ENV: files.run_id}
    ray_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(1.0)
        run_guard.stop_watchdog(watchdog)
        assert watchdog.returncode == 0
        ray_like.wait(timeout=5)
        assert mine.poll() is None
        assert not files.root.exists() and not files.staging_dir.exists()
    finally:
        for p in (mine, ray_like):
            p.kill()
            p.wait()


def test_the_watchdog_walks_the_tree_less_often_while_it_stays_the_same_and_at_once_again_when_it_grows() -> None:
    period = run_guard._WATCH_PERIOD_S
    seen = []
    for _ in range(6):
        period = run_guard.next_watch_period(period, changed=False)
        seen.append(period)
    assert seen == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert run_guard.next_watch_period(4.0, changed=True) == run_guard._WATCH_PERIOD_S
