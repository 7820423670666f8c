"""A run's footprint on the machine (its private directories and every process started for it) and what removes them
whatever happens: the normal shutdown, a watchdog that outlives even a ``kill -9`` of the trainer, and a sweep of
dead runs at the next start (docs/security.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RUN_ID_ENV = "LHR_RUN_ID"
"""Environment variable every process of a run inherits (its value: the run id)."""
STAGING_DIR_ENV = "LHR_STAGING_DIR"
"""Environment variable naming the run's staging directory (engines create their weight files there)."""
OWNER_FILE = "owner.json"
_START_TIME_SLACK_S = 1.0


def _uid() -> int:
    return os.getuid()


def runs_root() -> Path:
    """``$TMPDIR/lhr-<uid>`` (0700, created if missing): the parent of every run directory of this user."""
    root = Path(tempfile.gettempdir()) / f"lhr-{_uid()}"
    _private_dir(root)
    return root


def shm_root() -> Path:
    """Where staging directories go: ``/dev/shm`` when writable (shared memory), else the temp dir."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path("/dev/shm")
    return Path(tempfile.gettempdir())


def _private_dir(path: Path) -> None:
    """Create ``path`` with mode 0700, or check that an existing one is a real directory of this user."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        st = path.lstat()
        if not path.is_dir() or path.is_symlink() or st.st_uid != _uid():
            raise RuntimeError(
                f"{path} exists but is not a directory owned by uid {_uid()}: remove it (or set TMPDIR elsewhere)"
            ) from None
    os.chmod(path, 0o700)


def _staging_name(run_id: str) -> str:
    return f"lhr-{_uid()}-{run_id}"


def write_private_file(path: Path, data: str | bytes) -> None:
    """Write ``data`` to a new file created with mode 0600 (never readable by others, even for an instant)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def process_start_time(pid: int) -> float | None:
    """The start time of process ``pid`` (``psutil``'s ``create_time``), None when there is none."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def same_process(start_time: float, recorded: float) -> bool:
    """Whether a process started at ``start_time`` is the one recorded with ``recorded`` (pids are reused)."""
    return abs(start_time - recorded) < _START_TIME_SLACK_S


def owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the process recorded in an ``owner.json`` still runs (same pid *and* same start time)."""
    pid, started = owner.get("pid"), owner.get("create_time")
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = process_start_time(pid)
    return now is not None and (not isinstance(started, (int, float)) or same_process(now, started))


def _read_owner(directory: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class RunFiles:
    """The private directories of one run (see the module docstring).

    Args:
        run_id: Short random id (also the value of ``LHR_RUN_ID`` in the run's processes).
        root: The run directory (0700).
        staging_dir: The shared-memory staging directory (0700).
    """

    run_id: str
    root: Path
    staging_dir: Path

    @property
    def token_path(self) -> Path:
        """The Ray token file (0600)."""
        return self.root / "auth_token"

    @property
    def ray_temp_dir(self) -> Path:
        """Ray's ``_temp_dir`` (session files, logs, sockets)."""
        return self.root / "ray"

    @classmethod
    def create(cls, owner_pid: int | None = None) -> RunFiles:
        """Make both directories and record the owner (this process unless ``owner_pid``)."""
        run_id = uuid.uuid4().hex[:10]
        files = cls(run_id, runs_root() / f"r-{run_id}", shm_root() / _staging_name(run_id))
        _private_dir(files.root)
        _private_dir(files.staging_dir)
        pid = owner_pid or os.getpid()
        owner = {"run_id": run_id, "pid": pid, "create_time": process_start_time(pid), "uid": _uid()}
        owner["staging_dir"] = str(files.staging_dir)
        write_private_file(files.root / OWNER_FILE, json.dumps(owner))
        write_private_file(files.staging_dir / OWNER_FILE, json.dumps(owner))
        return files

    def write_token(self) -> str:
        """Generate a fresh Ray auth token into :attr:`token_path` (0600) and return its path."""
        write_private_file(self.token_path, secrets.token_hex(32))
        return str(self.token_path)

    def processes(
        self, exclude: tuple[int, ...] = (), open_files: bool = False, recorded: dict[int, float] | None = None
    ) -> list[Any]:
        """Live processes of this run (see :func:`run_processes`)."""
        return run_processes(
            self.run_id, markers=(str(self.root),), exclude=exclude, open_files=open_files, recorded=recorded
        )

    def remove(self) -> None:
        """Delete both directories (a dying process may still write a last log line: retried briefly)."""
        for d in (self.staging_dir, self.root):
            for _ in range(3):
                shutil.rmtree(d, ignore_errors=True)
                if not d.exists():
                    break
                time.sleep(0.3)


def run_processes(
    run_id: str,
    markers: tuple[str, ...] = (),
    exclude: tuple[int, ...] = (),
    open_files: bool = False,
    recorded: dict[int, float] | None = None,
) -> list[Any]:
    """Live processes of this user that belong to run ``run_id``, with their descendants.

    A process belongs to the run when its environment has ``LHR_RUN_ID=run_id``, its command line names a marker
    (the run directory), ``open_files`` is set and it holds a file under a marker open, or it is in ``recorded``
    (``pid -> start time``, as the watchdog records the run's tree). Descendants of such processes belong too.

    Args:
        run_id: The run's id.
        markers: Paths whose appearance in a command line (or open file) marks a process of the run.
        exclude: Pids never returned, nor their descendants (this process is always excluded).
        open_files: Also look at every process's open files (slower; used by the sweep of dead runs).
        recorded: Pids recorded earlier with their start times (a reused pid with another start time is skipped).
    """
    import psutil

    me, uid = os.getpid(), _uid()
    skip = {me, *exclude}
    found: dict[int, Any] = {}
    for p in psutil.process_iter(["pid", "uids", "status", "cmdline", "create_time"]):
        try:
            if p.pid in skip or p.info["status"] == psutil.STATUS_ZOMBIE or p.info["uids"].real != uid:
                continue
            started = (recorded or {}).get(p.pid)
            if started is not None and same_process(p.info["create_time"], started):
                found[p.pid] = p
                continue
            if _marked(p, run_id, markers, open_files):
                found[p.pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for p in list(found.values()):
        try:
            for child in p.children(recursive=True):
                if child.pid not in skip and child.status() != psutil.STATUS_ZOMBIE:
                    found.setdefault(child.pid, child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return list(found.values())


def _marked(p: Any, run_id: str, markers: tuple[str, ...], open_files: bool) -> bool:
    cmd = " ".join(p.info["cmdline"] or [])
    if (markers and any(m in cmd for m in markers)) or p.environ().get(RUN_ID_ENV) == run_id:
        return True
    return open_files and bool(markers) and any(f.path.startswith(markers) for f in p.open_files())


def _record_tree(procs: list[Any], into: dict[int, float]) -> None:
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            into[p.pid] = p.create_time()


def kill_processes(procs: list[Any], wait_s: float = 5.0) -> list[int]:
    """SIGKILL ``procs`` and wait up to ``wait_s`` for them to go; returns the pids signalled."""
    import psutil

    killed = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.kill()
            killed.append(p.pid)
    psutil.wait_procs(procs, timeout=wait_s)
    return killed


PIDS_FILE = "pids.json"
"""The watchdog's record of the run's process tree (``pid -> start time``), for a sweep after both died."""


def clean_run(
    root: Path, exclude: tuple[int, ...] = (), recorded: dict[int, float] | None = None, open_files: bool = True
) -> list[int]:
    """Kill every process of the run whose directory is ``root`` and delete its directories; returns killed pids."""
    owner = _read_owner(root) or {}
    run_id = str(owner.get("run_id") or root.name.removeprefix("r-"))
    files = RunFiles(run_id, root, shm_root() / _staging_name(run_id))
    if recorded is None:
        try:
            recorded = {int(k): float(v) for k, v in json.loads((root / PIDS_FILE).read_text()).items()}
        except (OSError, ValueError, AttributeError):
            recorded = {}
    killed = kill_processes(files.processes(exclude=exclude, open_files=open_files, recorded=recorded))
    staging = owner.get("staging_dir")
    if isinstance(staging, str) and Path(staging).name == _staging_name(run_id):
        files.staging_dir = Path(staging)
    files.remove()
    return killed


def sweep_dead_runs() -> list[str]:
    """Clean what dead runs of this user left: their processes, run directories and staging directories.

    A run is dead when the owner recorded in its ``owner.json`` no longer runs. Only directories named like this
    project's (``r-<id>`` under :func:`runs_root`, ``lhr-<uid>-<id>`` under :func:`shm_root`), owned by this user
    and holding an ``owner.json`` are considered; everything else is left alone.

    Returns:
        The ids of the runs swept.
    """
    swept: list[str] = []
    uid = _uid()
    root = runs_root()
    for d in sorted(root.glob("r-*")):
        owner = _read_owner(d)
        if owner is None or d.is_symlink() or d.lstat().st_uid != uid or owner_alive(owner):
            continue
        killed = clean_run(d)
        swept.append(str(owner.get("run_id") or d.name))
        logger.warning("swept dead run %s (owner pid %s): killed %s", d.name, owner.get("pid"), killed or "nothing")
    prefix = f"lhr-{uid}-"
    for d in sorted(shm_root().glob(prefix + "*")):
        if d.is_symlink() or not d.is_dir() or d.lstat().st_uid != uid:
            continue
        owner = _read_owner(d)
        if owner is None or owner_alive(owner):
            continue
        shutil.rmtree(d, ignore_errors=True)
        run_id = d.name[len(prefix) :]
        if run_id not in swept:
            swept.append(run_id)
            logger.warning("swept the staging directory %s of a dead run (owner pid %s)", d, owner.get("pid"))
    return swept


_PROCESS_STAGING: Path | None = None


def default_staging_dir() -> Path:
    """The directory new staging files go to: the current run's (``LHR_STAGING_DIR``), else a private one.

    Outside a run (a benchmark pushing to engines it started itself) the private directory belongs to this process
    (``owner.json``), so a later :func:`sweep_dead_runs` removes it if this process dies without cleaning up.
    """
    global _PROCESS_STAGING
    env = os.environ.get(STAGING_DIR_ENV)
    if env and os.path.isdir(env):
        return Path(env)
    if _PROCESS_STAGING is None or not _PROCESS_STAGING.is_dir():
        path = shm_root() / _staging_name(f"p{os.getpid()}-{uuid.uuid4().hex[:6]}")
        _private_dir(path)
        owner = {"pid": os.getpid(), "create_time": process_start_time(os.getpid()), "uid": _uid()}
        write_private_file(path / OWNER_FILE, json.dumps(owner))
        _PROCESS_STAGING = path
        import atexit

        atexit.register(shutil.rmtree, path, True)
    return _PROCESS_STAGING


# ------------------------------------------------------------------------------------------------------ watchdog


def start_watchdog(files: RunFiles) -> subprocess.Popen[bytes]:
    """Start the watchdog of ``files`` (this process is the owner it watches)."""
    with open(files.root / "watchdog.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "lightning_hybrid_rollout.rollout.run_guard", "watch", str(files.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # Ctrl-C in the terminal reaches the trainer, not the watchdog
            close_fds=True,
            env={k: v for k, v in os.environ.items() if k != RUN_ID_ENV},
        )


def stop_watchdog(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """Ask the watchdog to clean up now and exit (SIGTERM), and wait for it."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_WATCH_PERIOD_S = 0.5
#: The longest wait between two walks of the run's process tree while it stays the same (each walk reads every
#: child's command line and environment: ~1.6% of a core at 0.5 s on the CPU miniature). The owner's exit is still
#: seen at once (``pidfd``); a process the run starts is recorded within this long, and the clean-up finds an
#: unrecorded one by its markers anyway.
_WATCH_MAX_PERIOD_S = 4.0


def next_watch_period(period: float, changed: bool) -> float:
    """The wait before the next walk: back to :data:`_WATCH_PERIOD_S` when the last walk found a process not seen
    before, else twice ``period``, at most :data:`_WATCH_MAX_PERIOD_S`."""
    return _WATCH_PERIOD_S if changed else min(2.0 * period, _WATCH_MAX_PERIOD_S)


def _owner_subtree(owner_pid: int, root: Path, run_id: str, me: int) -> list[Any]:
    """The run's processes under the owner: the children naming the run directory (Ray's daemons), and below."""
    import psutil

    try:
        children = psutil.Process(owner_pid).children()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    daemons = []
    for c in children:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            if c.pid != me and (str(root) in " ".join(c.cmdline()) or c.environ().get(RUN_ID_ENV) == run_id):
                daemons.append(c)
    out = list(daemons)
    for d in daemons:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            out.extend(d.children(recursive=True))
    return out


def _watch_owner(owner_pid: int, root: Path, run_id: str, stop: list[bool], recorded: dict[int, float]) -> None:
    """Until ``owner_pid`` exits (or ``stop[0]`` is set by a signal), record the run's process tree."""
    import select

    fd = None
    with contextlib.suppress(OSError, AttributeError):
        fd = os.pidfd_open(owner_pid)
    me = os.getpid()
    written = 0
    period = _WATCH_PERIOD_S
    try:
        while not stop[0]:
            _record_tree(_owner_subtree(owner_pid, root, run_id, me), recorded)
            period = next_watch_period(period, changed=len(recorded) != written)
            if len(recorded) != written:
                with contextlib.suppress(OSError):
                    write_private_file(root / PIDS_FILE, json.dumps(recorded))
                written = len(recorded)
            if fd is not None:
                with contextlib.suppress(InterruptedError):
                    if select.select([fd], [], [], period)[0]:
                        return
            else:
                try:
                    os.kill(owner_pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(period)
    finally:
        if fd is not None:
            os.close(fd)


def watch(root: Path) -> int:
    """The watchdog's main loop: record the run's tree until the owner exits (or SIGTERM), then clean the run up."""
    owner = _read_owner(root)
    if owner is None:
        return 1
    stop = [False]

    def on_term(signum: int, frame: Any) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pid = int(owner["pid"])
    recorded: dict[int, float] = {}
    if owner_alive(owner):
        _watch_owner(pid, root, str(owner.get("run_id")), stop, recorded)
    # A graceful stop (SIGTERM from RayRuntime.shutdown) leaves the owner's other children alone: only what was
    # recorded as the run's, or carries its marks, is killed.
    killed = clean_run(root, exclude=(pid,), recorded=recorded)
    if killed and not stop[0]:
        logger.warning("trainer %d exited; killed %d processes of run %s", pid, len(killed), root.name)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="lhr watchdog: %(message)s")  # stderr: the run's watchdog.log
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "watch":
        logger.error("usage: python -m lightning_hybrid_rollout.rollout.run_guard watch RUN_DIR")
        return 2
    return watch(Path(args[1]))


if __name__ == "__main__":
    raise SystemExit(main())
