"""The trainer's CPU pinning covers every thread of its process (``RolloutConfig.pin_trainer``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores and Linux affinity"
)

_CHILD = """
import json, os, threading
from lightning_hybrid_rollout.run.runtime import pin_trainer_process

stop = threading.Event()
early = threading.Thread(target=stop.wait, name="started-before-pinning")  # like Ray's driver io thread
early.start()
core = min(os.sched_getaffinity(0))
pinned = pin_trainer_process([core])
late = threading.Thread(target=stop.wait)
late.start()
masks = {}
for tid in os.listdir("/proc/self/task"):
    masks[tid] = sorted(os.sched_getaffinity(int(tid)))
stop.set()
print(json.dumps({"pinned": pinned, "core": core, "masks": masks, "nothing": pin_trainer_process([])}))
"""


def test_pin_trainer_process_pins_threads_started_before_it():
    # in a child process: pinning the pytest process would slow every later test down
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["pinned"] == [report["core"]]
    assert len(report["masks"]) >= 3  # main, the early thread, the late one (and torch's, if any)
    assert all(mask == [report["core"]] for mask in report["masks"].values()), report["masks"]
    assert report["nothing"] is None
