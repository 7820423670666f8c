"""RayRuntime knows its replicas' processes by pid *and* start time (fast, no Ray started).

A replica that was replaced leaves its pid in the runtime's records; by the shutdown that pid may name a process of
another run (pids come round again), which the shutdown would otherwise wait for and kill.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _spawn_with_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A new process given ``pid`` (root on Linux: ``ns_last_pid``); None where that cannot be arranged."""
    for _ in range(5):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(SLEEP)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def test_a_replica_pid_that_now_names_another_process_is_not_the_runs() -> None:
    rt = RayRuntime(address="127.0.0.1:1")  # never started: its leftovers are the recorded replica processes
    replica = subprocess.Popen(SLEEP)
    other: subprocess.Popen[bytes] | None = None
    try:
        rt._remember_pids({"frontend_pid": replica.pid, "node_id": ""})
        assert [p.pid for p in rt.leftover_processes()] == [replica.pid]
        replica.kill()
        replica.wait()
        time.sleep(1.2)  # a pid comes round minutes later on a busy machine; beyond the start-time slack here
        other = _spawn_with_pid(replica.pid)
        if other is None:  # the same situation without the kernel's help: the record names the new process's pid
            other = subprocess.Popen(SLEEP)
            rt._pids = {other.pid: rt._pids.pop(replica.pid)}
        assert other.pid in rt._pids
        assert rt.leftover_processes() == [], "a process that merely took a replaced replica's pid counts as the run's"
    finally:
        for p in (replica, other):
            if p is not None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait()
