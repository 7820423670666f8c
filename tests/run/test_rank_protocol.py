"""The trainer ranks never disagree at a sync boundary (``run/rank_protocol.py``).

Unit rules on one process, then the real callback hooks on 2 gloo ranks walking every boundary kind: the start
decision, an activation, a skipped sync, an ``overlap_sync`` preparation that activates, one whose policy changes
its mind, and the last cycle. Both ranks must receive the same message at every boundary, and rank 0 may wake the
hybrid engines only after every rank has offloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_hybrid_rollout.errors import RankProtocolError
from lightning_hybrid_rollout.run.rank_protocol import BoundaryProtocol
from tests.lightning._rank_protocol_worker import KINDS

ROOT = Path(__file__).resolve().parents[2]


def _protocol() -> tuple[BoundaryProtocol, list[str], list[str]]:
    sent: list[str] = []
    calls: list[str] = []

    def broadcast(message: str) -> str:
        sent.append(message)
        return message

    protocol = BoundaryProtocol(
        broadcast=broadcast, offload=lambda: calls.append("offload"), barrier=lambda: calls.append("barrier")
    )
    return protocol, sent, calls


def test_one_message_per_boundary_offload_once_then_a_barrier() -> None:
    protocol, sent, calls = _protocol()
    protocol.open()
    protocol.need_devices()
    protocol.need_devices()  # overlap prepared, then the activation's wake: nothing more is sent
    assert protocol.close() == "offload"
    protocol.open()
    assert protocol.close() == "stay"
    assert sent == ["offload", "stay"] == protocol.history
    assert calls == ["offload", "barrier", "offload"]  # the barrier only after the boundary's broadcast


def test_misuse_raises_instead_of_hanging() -> None:
    protocol, _, _ = _protocol()
    with pytest.raises(RankProtocolError, match="outside a sync boundary"):
        protocol.need_devices()
    with pytest.raises(RankProtocolError, match="without an open"):
        protocol.close()
    protocol.open()
    with pytest.raises(RankProtocolError, match="still open"):
        protocol.open()
    follower = BoundaryProtocol(broadcast=lambda m: "junk", offload=lambda: None, barrier=lambda: None)
    with pytest.raises(RankProtocolError, match="expected 'offload' or 'stay'"):
        follower.follow()


def test_two_gloo_ranks_see_the_same_message_at_every_boundary_and_offload_before_the_wake(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.lightning._rank_protocol_worker",
                str(rank),
                str(store),
                str(tmp_path / f"r{rank}.json"),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    r0, r1 = (json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in (0, 1))
    expected = {
        "start": "offload",
        "activate": "offload",
        "skip": "stay",
        "overlap": "offload",
        "overlap_changed_mind": "offload",
        "last_cycle": "offload",
    }
    assert r0["history"] == r1["history"] == [expected[k] for k in KINDS]
    assert "overlap_prepare" in r0["call_log"] and "overlap_undo" in r0["call_log"]  # both overlap kinds ran
    # every wake on rank 0 comes after rank 1 finished the offload of that boundary
    wakes = [t for what, t in r0["log"] if what == "wake"]
    offloads_1 = [t for what, t in r1["log"] if what == "offload_end"]
    assert len(wakes) == len(offloads_1) == 5
    assert all(off < wake for off, wake in zip(offloads_1, wakes, strict=True)), (offloads_1, wakes)
    # and every rank onloaded at each next cycle start: as many onloads as offloads before the last boundary
    assert sum(what == "onload" for what, _ in r1["log"]) == 4
