"""A real run's balance bound (``run_bound``): the simulator's formula, measured from the run's own trace.

- the formula against hand-computed values;
- the same function, fed a simulated run's terms, gives the simulator's own bound (the two cannot disagree), and the
  trace reader finds in a simulated trace exactly the simulator's breakdown;
- the runtime's trace carries the terms (``trained_*``, ``decoded_tokens.*``, ``serving_s.*``) and the reader turns
  them into the bound computed by hand; ``lhr report`` prints it; the CPU miniature's last two lines;
- a tiny recorded real run (``tests/data/cpu_miniature_default_8_steps``): its trace's terms agree with its
  ``metrics.csv``.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_hybrid_rollout.analysis.run_bound import (
    BREAKDOWN_KEYS,
    RunMeasurements,
    read_run,
    run_balance_bound,
    trainer_breakdown,
)
from lightning_hybrid_rollout.sim import runner as sim_runner
from lightning_hybrid_rollout.sim import simulate
from lightning_hybrid_rollout.sim.bound import bound_from_terms, peak_tokens_per_device_s
from lightning_hybrid_rollout.sim.results import BREAKDOWN_KEYS as SIM_BREAKDOWN_KEYS
from lightning_hybrid_rollout.trace import TraceWriter, load_trace
from tests.benchmarks import load_benchmark
from tests.sim.conftest import tiny_scenario

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------------------------ the formula


@pytest.mark.parametrize(
    ("T", "S", "W", "G", "rho", "expected"),
    [
        (1, 1, 27.8, 85.0, 1.0, 56.4),  # the 2-core miniature: (85 + 27.8) / 2
        (2, 2, 100.0, 20.0, 1.0, 50.0),  # training-bound: W/T = 50 > (20 + 100) / 4 = 30
        (2, 2, 10.0, 100.0, 0.5, 35.0),  # (100 + 0.5 * 10) / (2 + 0.5 * 2)
        (4, 0, 8.0, 12.0, 0.5, 8.0),  # colocated: (12 + 4) / 2, W/T = 2
    ],
)
def test_the_bound_formula_against_hand_computed_values(T, S, W, G, rho, expected):
    assert bound_from_terms(T, S, W, G, rho) == pytest.approx(expected)


def test_the_bound_refuses_what_has_no_meaning():
    with pytest.raises(ValueError, match="train_devices > 0"):
        bound_from_terms(0, 2, 1.0, 1.0)
    with pytest.raises(ValueError, match="work must be >= 0"):
        bound_from_terms(1, 1, 1.0, -1.0)
    with pytest.raises(ValueError, match="decode rate must be > 0"):
        RunMeasurements(1, 1, 1.0, 100.0, 0.0)


def test_a_real_runs_bound_from_its_measurements():
    # 265k tokens at 3125 tok/s = 84.8 core-s of generation, 27.8 s of training, 1 + 1 cores
    assert run_balance_bound(1, 1, 27.8, 265_000, 3125.0) == pytest.approx((84.8 + 27.8) / 2)
    # a hybrid replica decoding at 2500 tok/s per device: rho 0.8
    m = RunMeasurements(1, 1, 27.8, 265_000, 3125.0, 2500.0)
    assert m.rho == pytest.approx(0.8) and m.generation_device_s == pytest.approx(84.8)
    assert m.bound_s == pytest.approx((84.8 + 0.8 * 27.8) / 1.8)
    assert run_balance_bound(1, 1, 27.8, 265_000, 3125.0, 2500.0) == m.bound_s
    # devices in other units (2 cores per device): the same bound when the rates are per device
    assert run_balance_bound(2, 2, 27.8, 265_000, 3125.0 / 2) == pytest.approx((84.8 + 27.8) / 2)


# ---------------------------------------------------------------------------------- against the simulator


def test_the_real_run_bound_agrees_with_the_simulators_on_a_simulated_run(tmp_path, monkeypatch):
    # constant rates (no length drift, no KV limit); hybrid replicas at 3/4 of the standalone speed (rho 0.75)
    sc = tiny_scenario(hybrid_replica={"devices": 1, "tokens_per_s": 30.0, "batch_slowdown": 0.05})
    seen: dict[str, tuple[float, float]] = {}
    real = sim_runner.balance_bound

    def spy(scenario: Any, run: Any, samples: Any, train_device_s: float, progress_at: Any = None) -> float:
        samples = list(samples)
        seen[run.name] = (float(sum(s.length for s in samples)), train_device_s)
        return real(scenario, run, samples, train_device_s, progress_at)

    monkeypatch.setattr(sim_runner, "balance_bound", spy)
    result = simulate(sc, trace_dir=tmp_path)
    standalone = peak_tokens_per_device_s(sc, sc.replica, 0.0)
    hybrid = peak_tokens_per_device_s(sc, sc.hybrid_model, 0.0)
    assert hybrid / standalone == pytest.approx(0.75)
    for r in result.runs:
        tokens, train_device_s = seen[r.name]
        report = read_run(r.trace_path)
        train_s = report.breakdown_s["training_compute"]  # read from the simulated trace's spans
        assert train_s * r.train_devices == pytest.approx(train_device_s, rel=1e-6)
        bound = run_balance_bound(r.train_devices, r.rollout_devices, train_s, tokens, standalone, hybrid)
        assert bound == pytest.approx(r.work_bound_s, rel=1e-6), r.name
        assert report.wall_s == pytest.approx(r.time_s, rel=1e-6)


def test_the_reader_finds_the_simulators_breakdown_in_its_trace(tmp_path):
    result = simulate(tiny_scenario(), trace_dir=tmp_path)
    assert set(BREAKDOWN_KEYS) - {"untraced"} <= set(SIM_BREAKDOWN_KEYS)
    for r in result.runs:
        breakdown, start, end = trainer_breakdown(load_trace(r.trace_path))
        expected = dict(r.breakdown_s)
        expected["waiting_idle"] += expected.pop("waiting_staleness_bound")  # a trace cannot tell them apart
        expected["untraced"] = 0.0
        assert breakdown == pytest.approx(expected, abs=1e-5), r.name
        assert (start, end) == pytest.approx((0.0, r.time_s))
        assert sum(breakdown.values()) == pytest.approx(end - start)
    dynamic = result.run("dynamic_default").breakdown_s
    assert dynamic["startup_fill"] > 0 and dynamic["waiting_hybrid_generating"] > 0 and dynamic["waiting_idle"] > 0


# ---------------------------------------------------------------------------------------- a real run's trace


def _window(standalone: tuple[int, float], hybrid: tuple[int, float]) -> Any:
    from lightning_hybrid_rollout.rollout.role_window import RoleWindow

    return RoleWindow(
        serving_s={"standalone": standalone[1], "hybrid": hybrid[1]},
        decoded_tokens={"standalone": standalone[0], "hybrid": hybrid[0]},
        start_s=0.0,
        end_s=1.0,
    )


def write_runtime_trace(run_dir: Path) -> None:
    """A run's trace written by ``RolloutRuntime`` itself (no Ray, no engine), with round numbers.

    Trainer (core 0, shared with the hybrid replica): waits 1 s for its first batch, trains 2 s, syncs 0.5 s, then
    waits 1 s with the hybrid replica generating, switches 0.3 s and idles 0.2 s untraced. It takes 8 samples of
    1000 response tokens. The standalone replica (core 1) decodes 2000 tokens in 1 s of serving (2000 tok/s), the
    hybrid one 600 tokens in 0.4 s (1500 tok/s: rho 0.75).
    """
    from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
    from lightning_hybrid_rollout.run.runtime import RolloutRuntime

    rt = RolloutRuntime(RolloutConfig(), AsyncTrainingConfig(), workload=None, run_dir=run_dir, trace=True)
    samples = [SimpleNamespace(response_length=1000, prompt_token_ids=[0] * 30) for _ in range(8)]
    rt.queue = SimpleNamespace(get_batch=lambda n, timeout: samples[:n], size=lambda: 0)
    windows = iter([_window((1000, 0.5), (0, 0.0)), _window((1000, 0.5), (600, 0.4))])
    rt.rollouter = SimpleNamespace(take_role_window=lambda: next(windows), in_flight=0, is_running=False)
    rt.tracer.describe_tracks(rt.rollout.concurrent_samples_per_replica, [[1]], [[0]])
    t0 = rt.tracer.t0
    try:
        rt.trace_phase("waiting", t0 + 0.0, t0 + 1.0, hybrid=False)
        assert len(rt.take_samples(8, timeout=1.0)) == 8
        rt.trace_phase("training", t0 + 1.0, t0 + 3.0)
        rt.take_role_window()
        rt.trace_phase("weight_sync", t0 + 3.0, t0 + 3.5, target="standalone")
        rt.trace_cycle(1, t0 + 3.5, {"dynamic_resource/mq_size": 0.0})
        rt.trace_phase("waiting", t0 + 3.5, t0 + 4.5, hybrid=True)
        rt.trace_phase("switching", t0 + 4.5, t0 + 4.8, op="deactivate")
        rt.take_role_window()
        rt.trace_cycle(2, t0 + 4.8, {"dynamic_resource/mq_size": 0.0})
        rt.trace_phase("training", t0 + 5.0, t0 + 5.0)  # empty: not written
        rt.trace_phase("waiting", t0 + 5.0, t0 + 5.0, hybrid=False)
        rt.trace_phase("weight_sync", t0 + 5.0, t0 + 5.0 + 1e-9, target="standalone")  # ends the traced time
    finally:
        rt.stop()


#: What :func:`write_runtime_trace` measures, by hand.
_G = 8000 / 2000  # trained tokens / standalone tok/s per device
_BOUND = max(2.0, (_G + 0.75 * 2.0) / (1 + 0.75))  # 5.5 / 1.75 = 3.142857...
_WALL = 5.0


def test_the_runtime_trace_carries_the_bound_terms_and_the_reader_computes_the_bound(tmp_path):
    write_runtime_trace(tmp_path)
    report = read_run(tmp_path)
    assert report.totals == pytest.approx(
        {
            "trained_samples": 8,
            "trained_tokens": 8000,
            "decoded_tokens.standalone": 2000,
            "serving_s.standalone": 1.0,
            "decoded_tokens.hybrid": 600,
            "serving_s.hybrid": 0.4,
        }
    )
    m = report.measurements
    assert m is not None and report.missing == ()
    assert (m.train_devices, m.rollout_devices, m.train_compute_s) == pytest.approx((1, 1, 2.0))
    assert m.standalone_tokens_per_device_s == pytest.approx(2000) and m.rho == pytest.approx(0.75)
    assert report.bound_s == pytest.approx(_BOUND, rel=1e-6)
    assert report.wall_s == pytest.approx(_WALL, abs=1e-5)
    assert report.efficiency == pytest.approx(_BOUND / _WALL, rel=1e-5)
    assert report.breakdown_s == pytest.approx(
        {
            "training_compute": 2.0,
            "startup_fill": 1.0,
            "waiting_hybrid_generating": 1.0,
            "waiting_idle": 0.0,
            "hybrid_switching": 0.3,
            "weight_sync_standalone": 0.5,
            "weight_sync_hybrid": 0.0,
            "untraced": 0.2,
        },
        abs=1e-5,
    )


def test_a_trace_without_the_terms_still_gets_its_breakdown(tmp_path):
    with TraceWriter(tmp_path / "trace.json", {"run": "old"}) as tw:
        tw.describe_track("replica/standalone_0", kind="standalone", devices=[1])
        tw.span("trainer/trainer", "waiting", 0.0, 2.0, {"hybrid": False})
        tw.span("trainer/trainer", "training", 2.0, 9.0)
    report = read_run(tmp_path)
    assert report.measurements is None and report.bound_s is None and report.efficiency is None
    assert any("trained_tokens" in m for m in report.missing) and any("devices" in m for m in report.missing)
    assert report.breakdown_s["startup_fill"] == pytest.approx(2.0)
    assert "not measurable" in report.lines()[0]
    # the trainer's devices given: still no tokens
    assert read_run(tmp_path, train_devices=1).measurements is None
    with pytest.raises(FileNotFoundError):
        read_run(tmp_path / "nowhere")


def test_lhr_report_prints_the_bound_the_efficiency_and_the_breakdown(tmp_path, capsys):
    from lightning_hybrid_rollout.analysis.report import report_main

    write_runtime_trace(tmp_path)
    assert report_main([str(tmp_path), "--out", str(tmp_path / "plots")]) == 0
    lines = capsys.readouterr().out.splitlines()
    text = "\n".join(lines)
    assert f"balance bound {_BOUND:.1f} s, efficiency {_BOUND / _WALL:.3f} (traced wall {_WALL:.1f} s)" in text
    assert "rho 0.75 (measured)" in text and "8.0k tokens trained / 2000 tok/s" in text
    assert "training 2.0 s (40%), start-up 1.0 s (20%), waiting with hybrid generating 1.0 s (20%)" in text
    assert "switching 0.3 s (6%), standalone sync 0.5 s (10%), untraced 0.2 s (4%)" in text
    pngs = [line for line in lines if line.endswith(".png")]
    assert pngs and all(Path(p).stat().st_size > 1000 for p in pngs)


# --------------------------------------------------------------------------------------- a tiny recorded run

#: ``benchmarks/cpu_miniature.py --steps 8 --repeats 1``, the ``default`` run (trace.json + metrics.csv, 18 KB).
RECORDED = ROOT / "tests" / "data" / "cpu_miniature_default_8_steps"


def test_a_recorded_real_run_reads_and_agrees_with_its_metrics_csv():
    import csv

    report = read_run(RECORDED)
    assert report.name == "default_r1"
    m = report.measurements
    assert m is not None and (m.train_devices, m.rollout_devices) == (1, 1)
    # the trace's terms against the run's own metrics.csv (written by other code paths)
    rows = list(csv.DictReader((RECORDED / "metrics.csv").open()))
    cycles = {r["dynamic_resource/param_version"]: r for r in rows if r.get("dynamic_resource/param_version")}
    compute = sum(float(r["dynamic_resource/train_compute_time_s"]) for r in cycles.values())
    assert m.train_compute_s == pytest.approx(compute, abs=1e-3)  # training spans = the callback's compute
    lengths = [float(r["train/response_length_mean"]) for r in rows if r.get("train/response_length_mean")]
    assert report.totals["trained_samples"] == 8 * 256 == len(lengths) * 256
    assert m.trained_tokens == pytest.approx(sum(lengths) * 256)  # the tokens the module trained on
    # the figures the benchmark printed for this run
    assert m.standalone_tokens_per_device_s == pytest.approx(4508, abs=1) and m.rho == pytest.approx(0.57, abs=0.01)
    t = report.totals
    standalone, hybrid = (t[f"decoded_tokens.{k}"] / t[f"serving_s.{k}"] for k in ("standalone", "hybrid"))
    rho = hybrid / standalone  # 1 + 1 cores: (G + rho W) / (1 + rho) > W
    assert report.bound_s == pytest.approx((t["trained_tokens"] / standalone + rho * compute) / (1 + rho), rel=1e-4)
    assert report.bound_s == pytest.approx(5.716, abs=1e-3) and report.efficiency == pytest.approx(0.840, abs=1e-3)
    assert sum(report.breakdown_s.values()) == pytest.approx(report.wall_s)
    assert report.breakdown_s["waiting_hybrid_generating"] > 0 and report.breakdown_s["untraced"] < 0.1


# ------------------------------------------------------------------------------------------ the CPU miniature


def _miniature() -> Any:
    return load_benchmark("cpu_miniature")


def test_a_cpu_miniature_run_prints_its_bound_lines(tmp_path):
    bench = _miniature()
    write_runtime_trace(tmp_path)
    report = bench._bound(tmp_path)
    assert report is not None and report.efficiency == pytest.approx(_BOUND / _WALL, rel=1e-5)
    assert bench._bound(tmp_path / "missing") is None
    assert math.isfinite(report.bound_s)
