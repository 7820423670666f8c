"""Replica actors: pinning, a parked engine really idles, dead actors, and Ray shutdown leaving nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.replica import ReplicaDeadError, round_robin_cores

REPO = Path(__file__).resolve().parents[2]


def test_round_robin_cores() -> None:
    assert round_robin_cores(0, 1, [0, 1]) == [0]
    assert round_robin_cores(1, 1, [0, 1]) == [1]
    assert round_robin_cores(2, 1, [0, 1]) == [0]
    assert round_robin_cores(1, 2, [0, 1, 2, 3]) == [2, 3]
    assert round_robin_cores(1, 3, [4, 5, 6, 7]) == [4, 5, 7]  # cores 3,4,5 -> 7,4,5 (wraps)
    assert round_robin_cores(0, 4, [0, 1]) == [0, 1]  # more cores asked than exist: all of them


def test_engines_share_vllms_cache_between_runs_instead_of_one_per_run(tmp_path, monkeypatch) -> None:
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    spec = ReplicaSpec("s0", "standalone", VLLMEngineConfig(model="m", run_dir=str(tmp_path / "run")))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    assert "VLLM_CACHE_ROOT" not in spec.actor_env()  # vLLM's own default, ~/.cache/vllm
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    assert spec.actor_env()["VLLM_CACHE_ROOT"] == str(tmp_path / "cache")  # the user's, on every node


def test_replica_dead_error_is_picklable_and_named() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(ReplicaDeadError("r7", RuntimeError("boom"))))
    assert isinstance(e, ReplicaDeadError) and e.replica_id == "r7" and "r7" in str(e)


@pytest.mark.slow
def test_replicas_are_pinned(vllm_replicas, run_async) -> None:
    async def go() -> list[dict]:
        return [await r.health() for r in vllm_replicas]

    for i, h in enumerate(run_async(go())):
        want = round_robin_cores(i, 1)
        assert h["cores"] == want
        for pid in (h["frontend_pid"], h["engine_pid"]):  # same node here: the engine core inherited the mask
            assert psutil.Process(pid).cpu_affinity() == want


@pytest.mark.slow
def test_parked_engine_leaves_its_core_idle(vllm_replicas, run_async) -> None:
    r1 = vllm_replicas[1]
    window = 2.0

    async def busy_then_parked() -> tuple[float, float, float]:
        # busy: generate continuously for the whole window (8 workers, each starting its next request as soon as
        # one ends: a fixed set of requests can finish before the window does on a fast, quiet machine)
        spec = SamplingSpec(max_tokens=480, temperature=1.0, ignore_eos=True)
        stop = False

        async def worker(i: int) -> None:
            n = 0
            while not stop:
                result = await r1.generate(f"busy-{i}-{n}", [1, 5, 6], spec)
                n += 1
                if result.finish_reason == "abort":
                    return

        gen = [asyncio.ensure_future(worker(i)) for i in range(8)]
        await asyncio.sleep(0.5)
        c0 = await r1.cpu_seconds()
        await asyncio.sleep(window)
        c1 = await r1.cpu_seconds()
        stop = True
        sleep_s = await r1.sleep()  # aborts the busy requests
        await asyncio.gather(*gen)
        await asyncio.sleep(0.3)
        p0 = await r1.cpu_seconds()
        await asyncio.sleep(window)
        p1 = await r1.cpu_seconds()
        await r1.wake_up()
        busy = sum(v - c0.get(k, 0.0) for k, v in c1.items())
        parked = sum(v - p0.get(k, 0.0) for k, v in p1.items())
        return busy / window, parked / window, sleep_s

    busy, parked, sleep_s = run_async(busy_then_parked())
    assert busy > 0.3, f"busy engine used only {busy:.2f} core: measurement broken?"
    assert parked < 0.10, f"parked engine still used {parked:.3f} of a core"
    assert sleep_s < 5.0


@pytest.mark.slow
def test_dead_replica_and_shutdown_leave_no_processes(tiny_model_dir, tmp_path) -> None:
    """In a fresh process: own Ray + one replica; kill it (ReplicaDeadError), shut down, nothing may remain."""
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from lightning_hybrid_rollout.rollout.engine import SamplingSpec
        from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime
        from lightning_hybrid_rollout.rollout.replica import ReplicaDeadError, ReplicaSpec
        from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

        async def main(rt):
            cfg = VLLMEngineConfig(model={str(tiny_model_dir)!r}, kv_cache_memory_bytes=32 * 2**20,
                                   run_dir={str(tmp_path / "run")!r}, verify_initial_weights=False)
            (h,) = await rt.start_replicas_async([ReplicaSpec("victim", "standalone", cfg, index=1)])
            info = await h.health()
            ok = (await h.generate("x", [1, 5], SamplingSpec(max_tokens=4, ignore_eos=True))).token_ids
            import ray
            ray.kill(h.actor, no_restart=True)
            errors = []
            for _ in range(2):  # the call that discovers the death, and a call after it
                try:
                    await h.generate("y", [1, 5], SamplingSpec(max_tokens=4))
                    errors.append("no error")
                except ReplicaDeadError as e:
                    errors.append(type(e).__name__ + ":" + e.replica_id)
            return info, ok, errors, h.is_alive

        if __name__ == "__main__":
            rt = RayRuntime(num_cpus=2, object_store_memory=128 * 2**20)
            rt.start()
            session = rt.session_dir
            try:
                info, ok, errors, alive = asyncio.run(main(rt))
            finally:
                killed = rt.shutdown(wait_s=10.0)
            print("RESULT " + json.dumps(dict(info=info, ok=ok, errors=errors, alive=alive, killed=killed,
                                              session=session, left=[p.pid for p in rt.leftover_processes()])))
        """
    )
    path = tmp_path / "shutdown_probe.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=400, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT ") :])
    assert len(res["ok"]) == 4
    assert res["errors"] == ["ReplicaDeadError:victim", "ReplicaDeadError:victim"]
    assert res["alive"] is False
    assert res["killed"] == [] and res["left"] == []
    # checked from outside too: the actor, its engine core, and every process naming the session dir are gone
    pids = [res["info"]["frontend_pid"], res["info"]["engine_pid"]]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    strays = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if res["session"] and res["session"] in cmd:
            strays.append((p.pid, cmd[:120]))
    assert strays == []


@pytest.mark.slow
def test_report_startup_timings(vllm_replicas, ray_runtime, run_async) -> None:
    """Not a check: records how long Ray and the engines took to start (shown with -rP / in the log)."""

    async def go() -> list[dict]:
        return [await r.health() for r in vllm_replicas]

    for r, h in zip(vllm_replicas, run_async(go())):
        print(f"{r.replica_id}: launch {r.launch_seconds:.1f} s, engine {h['timings']}")
    print(f"ray init {ray_runtime.init_seconds:.1f} s")
