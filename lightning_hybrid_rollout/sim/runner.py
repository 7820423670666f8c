"""The trainer side of the simulator: runs the REAL controller and policies against a simulated replica pool.

Each run follows the runtime's per-step order (design/scheduling.md §1) on the virtual clock of a
:class:`~lightning_hybrid_rollout.sim.world.RolloutWorld`; the pool's methods advance that clock by the scenario's
switch costs while the rollout side keeps generating, and every second of the trainer's timeline goes to exactly one
:data:`BREAKDOWN_KEYS` bucket (docs/simulator.md, "What is modelled").

Example::

    from lightning_hybrid_rollout.sim.presets import get_preset
    from lightning_hybrid_rollout.sim.runner import simulate

    result = simulate(get_preset("verl_32_devices"))
    for run in result.runs:
        print(run.name, round(run.time_s), round(run.efficiency, 3))
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout import metrics as M
from lightning_hybrid_rollout.schedule import DynamicResourceController, StepEndResult, create_policy
from lightning_hybrid_rollout.schedule.cycle import CycleEnd, CycleLedger, ProductionByRole, RunShape, Totals
from lightning_hybrid_rollout.schedule.rate_matched_policy import RateScheduleContext
from lightning_hybrid_rollout.sim.bound import balance_bound, balance_term_from_pieces, bound_pieces, bound_terms
from lightning_hybrid_rollout.sim.pool import SimReplicaPool
from lightning_hybrid_rollout.sim.results import (
    BREAKDOWN_HELP,
    BREAKDOWN_KEYS,
    GAP_HELP,
    GAP_KEYS,
    RunResult,
    ScenarioResult,
)
from lightning_hybrid_rollout.sim.scenario import RunSpec, Scenario
from lightning_hybrid_rollout.sim.world import ProductionWindow, RolloutWorld, SimSample, SimulationError
from lightning_hybrid_rollout.trace import (
    DECODED_TOKENS,
    GENERATED_TOKENS,
    IN_FLIGHT,
    SERVING_S,
    TRAINED_SAMPLES,
    TRAINED_TOKENS,
    TRAINER_TRACK,
    TraceWriter,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BREAKDOWN_HELP",
    "BREAKDOWN_KEYS",
    "GAP_HELP",
    "GAP_KEYS",
    "RunResult",
    "ScenarioResult",
    "SimReplicaPool",
    "balance_bound",
    "replace_run",
    "run_once",
    "simulate",
]


class _Run:
    """One run's trainer loop (internal; see :func:`run_once`)."""

    def __init__(self, scenario: Scenario, run: RunSpec, trace: TraceWriter | None) -> None:
        self.sc = scenario
        self.run = run
        self.trace = trace
        self.world = RolloutWorld(scenario, run, trace)
        self.breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        self.trained_any = False
        self.trained: list[SimSample] = []
        #: Per trained sample: the trainer's param version minus the oldest weight version the sample was generated
        #: under (the runtime's ``train/staleness_*``: ``param_version - weight_version_min``).
        self.version_lags: list[int] = []
        self._cycle_lags: list[int] = []
        self.steps: list[dict[str, float]] = []
        self.pool = SimReplicaPool(self.world, scenario, self._charge)
        self.controller: DynamicResourceController | None = None
        if run.hybrid:
            kwargs = {"only_hybrid": run.rollout_devices == 0, **run.policy_kwargs}
            policy = create_policy(run.policy, **kwargs)
            self.controller = DynamicResourceController(
                self.pool,
                policy,
                clock=lambda: self.world.now,
                enable_rebalance=run.enable_rebalance,
                has_hybrid=True,
                num_hybrid_replicas=len(self.world.hybrid) or None,
            )
        #: The per-cycle core the runtime callback uses too: contexts and cycle metrics come only from it.
        self.ledger = CycleLedger(
            RunShape(
                required_samples=scenario.required_samples,
                trigger_parameter_sync_step=scenario.trigger_parameter_sync_step,
                buffer_samples=scenario.buffer_samples,
                only_hybrid=run.rollout_devices == 0,
                num_standalone_replicas=len(self.world.standalone),
                num_hybrid_replicas=len(self.world.hybrid),
                hybrid_devices=run.train_devices,
                standalone_devices=run.rollout_devices,
            )
        )
        # run-level accumulators for the utilization metrics
        self._compute_total = 0.0
        self._alloc_total = 0.0
        self._wait_total = 0.0
        self._step_total = 0.0
        self._busy = 0.0
        self._capacity = 0.0
        self._overlap_saved_s: float | None = None
        self._overlap_hybrid_synced = False
        self._overlap_hybrid_sync_s = 0.0
        self._cycle_hybrid_sync_s = 0.0
        self._cycle_activation_s = 0.0
        self._cycle_staleness = (0, 0)  # (staleness at the version's end, staleness carried into the next)
        self._breakdown_at_cycle_start = dict(self.breakdown)

    # -------------------------------------------------------------------------------------------- helpers

    def _charge(self, bucket: str, seconds: float, phase: str, args: dict[str, Any]) -> None:
        self.breakdown[bucket] += seconds
        if self.trace is not None and seconds > 0:
            self.trace.span(TRAINER_TRACK, phase, self.world.now - seconds, self.world.now, args)

    def _wait_for(self, n: int) -> float:
        """Block the trainer until the queue holds ``n`` samples; charge the wait to its bucket."""
        w = self.world
        hybrid = w.hybrid_serving()
        thr0 = w.throttled_s
        t0 = w.now
        waited = w.run_until(lambda: w.queue_size >= n, f"{n} samples in the queue")
        if waited <= 0:
            return 0.0
        if not self.trained_any:
            self.breakdown["startup_fill"] += waited
        elif hybrid:
            self.breakdown["waiting_hybrid_generating"] += waited
        else:
            thr = min(waited, w.throttled_s - thr0)
            self.breakdown["waiting_staleness_bound"] += thr
            self.breakdown["waiting_idle"] += waited - thr
        if self.trace is not None:
            self.trace.span(TRAINER_TRACK, "waiting", t0, w.now, {"hybrid": hybrid, "samples": n})
        return waited

    def _train_seconds(self, batch: list[SimSample]) -> float:
        tm = self.sc.trainer
        tokens = sum(self.sc.lengths.prompt_tokens + s.length + s.extra_tokens for s in batch)
        return tokens * tm.device_s_per_token / self.run.train_devices + tm.step_overhead_s

    def _standalone_pause_s(self) -> float:
        """Seconds at the end of a standalone weight sync during which standalone replicas do not generate.

        The whole sync with verl's sync; with ``staged_standalone_sync`` only the commit (the weights are
        staged while the replicas keep generating, then loaded during a short pause).
        """
        sw = self.sc.costs
        if self.run.staged_standalone_sync:
            return min(sw.standalone_commit_s, sw.standalone_sync_s)
        return sw.standalone_sync_s

    def _pause_standalone(self) -> None:
        """Standalone replicas stop generating for their weight load: ``begin_weight_update`` of the runtime.

        With ``standalone_sync_aborts`` (the runtime's behaviour) their requests in flight are aborted here and
        re-sent with their prefix (partial rollout); they wait on the paused replicas and pay the re-prefill after
        the load. This is the start of the sync with verl's sequencing and the commit with
        ``staged_standalone_sync`` (the replicas kept generating while the buckets were staged).
        """
        w = self.world
        w.set_state(w.standalone, "syncing", serving=False)
        if self.run.sync_aborts:
            w.abort([r for r in w.standalone if r.members], account="standalone_sync_reprefill")

    def _standalone_sync(self) -> float:
        w = self.world
        if not w.standalone:
            return 0.0
        cost = self.sc.costs.standalone_sync_s
        t0 = w.now
        w.advance_to(t0 + cost - self._standalone_pause_s())  # staged: the replicas generate while weights arrive
        self._pause_standalone()
        w.advance_to(t0 + cost)
        w.set_state(w.standalone, "active", serving=True)
        self._charge("weight_sync_standalone", w.now - t0, "weight_sync", {"target": "standalone"})
        return w.now - t0

    def _overlapped_sync(self, step: int) -> float:
        """``overlap_sync``: ask the policy first; if it will activate, prepare hybrid during the standalone sync.

        The hybrid wake-up and then the hybrid weight sync run concurrently with the standalone weight sync; the
        trainer is blocked for ``max(standalone_sync_s, wake_s + hybrid_sync_s)``. The controller's activation
        that follows finds the replicas awake and current (both pool methods are then no-ops) and only adds and
        resumes them.
        """
        w = self.world
        assert self.controller is not None
        # as the runtime: not asked when nothing could be prepared; else with the cycle's measurements so far
        if not w.hybrid or self.controller.is_hybrid_active or self.controller.pending_cleanup:
            return self._standalone_sync()
        ctx = self._context(w.peek_window())
        if not self.controller.policy.should_activate_after_step(step, self.controller.is_hybrid_active, ctx):
            return self._standalone_sync()
        # only the replicas the activation will lend (k of n); the controller asks the policy the same question
        subset = self.controller.replicas_to_activate(step, ctx)
        chosen = w.hybrid if subset is None else [w.hybrid[i] for i in subset]
        costs = self.sc.costs
        hybrid_sync_s = self.pool.sync_s(chosen, version=step)
        t0 = w.now
        w.set_state(chosen, "switching", serving=False, routable=False)
        s_end = t0 + (costs.standalone_sync_s if w.standalone else 0.0)
        s_pause = s_end - (self._standalone_pause_s() if w.standalone else 0.0)
        wake_end = t0 + costs.wake_s
        sync_end = wake_end + hybrid_sync_s
        events = [(s_pause, 0, "pause"), (s_end, 1, "standalone"), (wake_end, 2, "wake"), (sync_end, 3, "hybrid_sync")]
        for t, _, what in sorted(events):
            w.advance_to(t)
            if what == "pause" and w.standalone:
                self._pause_standalone()
            elif what == "standalone" and w.standalone:
                w.set_state(w.standalone, "active", serving=True)
            elif what == "wake":
                for r in chosen:
                    r.awake = True
                w.set_state(chosen, "syncing", serving=False, routable=False)
            elif what == "hybrid_sync":
                self.pool.mark_synced(chosen, version=step)
                w.set_state(chosen, "parked", serving=False, routable=False)
        sync_s = s_end - t0
        self._overlap_hybrid_synced = True
        self._overlap_hybrid_sync_s = hybrid_sync_s
        self._overlap_saved_s = max(0.0, sync_s + costs.wake_s + hybrid_sync_s - (w.now - t0))
        self.breakdown["weight_sync_standalone"] += sync_s
        self.breakdown["hybrid_switching"] += (w.now - t0) - sync_s
        if self.trace is not None:
            self.trace.span(TRAINER_TRACK, "weight_sync", t0, s_end, {"target": "standalone", "overlap": "hybrid"})
            if w.now > s_end:
                self.trace.span(TRAINER_TRACK, "switching", s_end, w.now, {"op": "hybrid wake/sync (overlapped)"})
        return sync_s

    def _cycle_lengths(self) -> list[int]:
        """Micro fit-steps of each sync cycle: ``steps`` cycles of ``trigger_parameter_sync_step``.

        With ``early_first_sync`` the first weight sync comes after the first micro-step (a one-step cycle, so the
        policy decides with a measured step instead of waiting a whole cycle) and the second after the
        ``trigger_parameter_sync_step``-th, where it always is: the same micro-steps, one more sync.
        """
        m, steps = self.sc.trigger_parameter_sync_step, self.sc.steps
        if not self.run.early_first_sync or m == 1:
            return [m] * steps
        return [1, m - 1] + [m] * (steps - 1)

    def _totals(self) -> Totals:
        w = self.world
        return Totals(total_generated_samples=w.generated, expected_samples=w.consumed, queue_size=w.queue_size)

    def _context(self, window: ProductionWindow | None = None) -> RateScheduleContext:
        """The decision context from the core (:class:`CycleLedger`), with the window's per-role production."""
        production = None if window is None else ProductionByRole.from_roles(window.serving_s, window.tokens)
        return self.ledger.context(self._totals(), production)

    def _check_devices_free(self) -> None:
        busy = [r.name for r in self.world.hybrid if r.awake or r.members]
        if busy:
            raise SimulationError(
                f"run {self.run.name!r}: the trainer must train but hybrid replicas {busy} still hold its devices; "
                f"the policy {self.run.policy!r} has to deactivate them before a training step"
            )

    def _after_sync(self, step: int) -> StepEndResult | None:
        """The controller's activation decision with the cycle's measurements (hybrid runs only)."""
        w = self.world
        if self.controller is None:
            return None
        t0 = w.now
        hybrid_sync0 = self.breakdown["weight_sync_hybrid"]
        end = self.controller.after_sync(step, self._context(w.take_window()))
        self._cycle_hybrid_sync_s += self.breakdown["weight_sync_hybrid"] - hybrid_sync0
        self._cycle_activation_s = w.now - t0
        synced = self._overlap_hybrid_synced
        lent = set(self.controller.active_replicas or range(len(w.hybrid)) if self.controller.is_hybrid_active else ())
        idle_awake = [r.index for r in w.hybrid if r.awake and r.index not in lent]
        if idle_awake:  # overlap_sync woke them but the policy changed its mind (or lent fewer)
            self.pool.sleep_replicas(replicas=idle_awake)
        self.ledger.record_sync_decision(self.controller.is_hybrid_active, synced)
        return end

    # ------------------------------------------------------------------------------------------------ loop

    def execute(self) -> RunResult:
        sc, w, ledger = self.sc, self.world, self.ledger
        R = sc.required_samples
        if self.trace is not None:
            self.trace.describe_track(TRAINER_TRACK, kind="trainer", devices=list(range(self.run.train_devices)))
        w.start()
        if self.controller is not None:
            # the start decision (step 0): nothing measured yet; its production belongs to no cycle
            self.controller.after_sync(0, self._context())
            self.ledger.record_start_decision(self.controller.is_hybrid_active, False)
            w.take_window()
        cycles = self._cycle_lengths()
        last_v = len(cycles) - 1
        for v, n_micro in enumerate(cycles):
            self._cycle_hybrid_sync_s = 0.0
            self._cycle_activation_s = 0.0
            self._overlap_hybrid_synced = False
            self._overlap_saved_s = 0.0
            end: StepEndResult | None = None
            sync_s = 0.0
            for j in range(n_micro):
                t_step = w.now
                if self.controller is not None and j == 0:  # the cycle's first step, as the runtime callback

                    def wait_for_samples(n: int) -> None:
                        before = w.generated
                        ledger.add_deactivate_wait(self._wait_for(n), w.generated - before)

                    start = self.controller.before_step(v, self._context(), wait_for_samples)
                    ledger.mark_deactivation(start.deactivated)
                self._check_devices_free()
                t_gen = w.now
                q0 = w.queue_size
                waited = self._wait_for(R)
                batch = w.take(R)
                lags = [w.version - (w.version if s.min_version is None else s.min_version) for s in batch]
                self.version_lags.extend(lags)
                self._cycle_lags.extend(lags)
                train_s = self._train_seconds(batch)
                ledger.add_batch(waited, q0, len(batch), sum(s.length for s in batch))
                t0 = w.now
                w.set_trainer_training(True)
                self._trace_generated()
                w.advance_to(t0 + train_s)
                self._trace_generated()
                w.set_trainer_training(False)
                ledger.add_compute(train_s)
                self.trained_any = True
                self.trained.extend(batch)
                self.breakdown["training_compute"] += train_s
                if self.trace is not None:
                    self.trace.span(TRAINER_TRACK, "training", t0, w.now, {"step": v, "micro_step": j})
                if j == n_micro - 1:
                    if self.run.sequencing == "overlap_sync" and self.controller is not None and v < last_v:
                        sync_s = self._overlapped_sync(v + 1)
                    else:
                        sync_s = self._standalone_sync()
                    w.set_version(v + 1, sum(cycles[: v + 1]) / sc.trigger_parameter_sync_step)
                    if v < last_v:
                        end = self._after_sync(v + 1)
                ledger.end_step(allocated_s=w.now - t_gen, step_s=w.now - t_step)
            # staleness_samples only grows within a version's window: its value now is the budget the version used;
            # the reset carries the samples queued or in flight into the next version's count
            self._cycle_staleness = (w.staleness_samples, w.outstanding + w.queue_size)
            history, generated = w.reset_staleness()
            self._emit_cycle(v + 1, sync_s, end, history, generated)
        w.close_spans()
        return self._result()

    def _emit_cycle(
        self,
        step: int,
        sync_s: float,
        end: StepEndResult | None,
        history: list[tuple[float, int, int]],
        generated: int,
    ) -> None:
        c = self.controller
        ratio = getattr(c.policy, "deactivate_ratio", None) if c is not None else None
        out = self.ledger.close(
            CycleEnd(
                rollout_history=history,
                step_generated_samples=generated,
                mq_size=float(self.world.queue_size),
                standalone_sync_s=sync_s,
                hybrid_sync_s=self._cycle_hybrid_sync_s
                + (self._overlap_hybrid_sync_s if self._overlap_hybrid_synced else 0.0),
                activate_duration_s=end.cycle_activate_duration_s if end is not None else 0.0,
                deactivate_duration_s=end.cycle_deactivate_duration_s if end is not None else 0.0,
                deactivate_ratio=ratio,
                param_version=step,
                overlap_saved_s=self._overlap_saved_s if self.run.sequencing == "overlap_sync" else None,
                hybrid_active=bool(c is not None and c.is_hybrid_active),
                active_hybrid_replicas=c.active_replica_count if c is not None else None,
            )
        )
        busy, cap = M.rollout_utilization_terms(history)
        self._busy += busy
        self._capacity += cap
        self._compute_total += out[M.TRAIN_COMPUTE_TIME_S]
        self._alloc_total += out[M.TRAIN_ALLOCATED_TIME_S]
        self._wait_total += self.ledger.last_wait_s
        self._step_total += self.ledger.last_step_s
        if ratio is not None:
            out["sim/deactivate_ratio"] = float(ratio)
        out["sim/activation_s"] = self._cycle_activation_s
        # the staleness budget: samples counted against the closing version (<= max_required_samples, the
        # rollouter's admission bound) and samples carried into the next one (queued or in flight at the sync)
        out["sim/staleness_samples"], out["sim/carried_samples"] = map(float, self._cycle_staleness)
        # the trained samples' version lag (the runtime logs the same per step as train/staleness_mean/max)
        lags, self._cycle_lags = self._cycle_lags, []
        out["sim/version_lag_mean"] = statistics.fmean(lags) if lags else 0.0
        out["sim/version_lag_max"] = float(max(lags, default=0))
        out["sim/time_s"] = self.world.now
        out["sim/step"] = float(step)
        for key, value in self.breakdown.items():
            out[f"sim/{key}_s"] = value - self._breakdown_at_cycle_start[key]
        self._breakdown_at_cycle_start = dict(self.breakdown)
        self.steps.append(out)
        if self.trace is not None:
            self._trace_totals()
            self.trace.step_metrics(step, self.world.now, out)

    def _trace_generated(self) -> None:
        """Each standalone replica's tokens so far (``generated_tokens.<replica>``), as the runtime reads them at the
        boundaries of the trainer's ``training`` spans."""
        w, tw = self.world, self.trace
        if tw is None:
            return
        for r in w.standalone:
            r.advance(w.now)
            tw.counter(f"{GENERATED_TOKENS}.{r.name}", w.now, r.tokens)
            tw.counter(f"{IN_FLIGHT}.{r.name}", w.now, len(r.members))

    def _trace_totals(self) -> None:
        """The runtime's running totals at a cycle's end (``trained_*``, ``decoded_tokens.<role>``, ``serving_s.*``)."""
        w, tw = self.world, self.trace
        assert tw is not None
        tw.counter(TRAINED_SAMPLES, w.now, len(self.trained))
        tw.counter(TRAINED_TOKENS, w.now, sum(s.length for s in self.trained))
        for kind, replicas in (("standalone", w.standalone), ("hybrid", w.hybrid)):
            if not replicas:
                continue
            for r in replicas:
                r.advance(w.now)
            tw.counter(f"{DECODED_TOKENS}.{kind}", w.now, sum(r.tokens for r in replicas))
            tw.counter(f"{SERVING_S}.{kind}", w.now, w.serving_total[kind])

    def _gap(self, train_device_s: float) -> dict[str, float]:
        """Device-second accounting of ``time_s − (G + ρ·W)/(S + ρ·T)`` (the balance term of the bound).

        Capacity is counted in standalone device-seconds at the best standalone rate of the current progress: a
        rollout device-second is 1, a trainer device-second ``ρ``. What the run did not turn into trained work
        splits into :data:`GAP_KEYS`; each value is device-seconds / ``(S + ρ·T)``, i.e. wall seconds, and they sum
        to ``time_s`` minus the balance term (``residual``: decoding done at a version whose best rate differs from
        the one ``G`` credits). ``hybrid_ratio_below_rho_unavoidable`` is the part of the hybrid's shortfall below
        ``ρ`` that the bound itself counts (its samples' own ratios are below ``ρ``, :func:`balance_bound`): what
        is left, ``total`` minus it, is ``time_s`` minus the bound's balance term.
        """
        sc, run, w = self.sc, self.run, self.world
        gen, rho = bound_terms(sc, self.trained, dict(w.progress_at))
        T, S = run.train_devices, run.rollout_devices
        scale = S + rho * T
        acc = w.device_account
        b = self.breakdown
        out = dict.fromkeys(GAP_KEYS, 0.0)
        for key in BREAKDOWN_KEYS:
            if key not in ("training_compute", "waiting_hybrid_generating"):
                out[f"trainer_{key}"] = rho * T * b[key]
        # what the hybrid replicas decoded, lacked of their limit, or of their best speed (booked as slowed)
        hybrid_peak = sum(acc.get(f"hybrid_{k}", 0.0) for k in ("decoded", "below_peak", "slowed"))
        out["hybrid_below_own_peak"] = acc.get("hybrid_below_peak", 0.0)
        pieces_term = balance_term_from_pieces(
            T, S, train_device_s, bound_pieces(sc, self.trained, dict(w.progress_at))
        )
        unavoidable = max(0.0, scale * pieces_term - gen - rho * train_device_s)
        out["hybrid_ratio_below_rho_unavoidable"] = unavoidable
        out["hybrid_peak_below_rho"] = rho * T * b["waiting_hybrid_generating"] - hybrid_peak
        # the part the bound counts comes off what the run booked at ρ: the hybrid's shortfall, or (no hybrid
        # replica) the trainer's idle waits
        out["hybrid_peak_below_rho" if run.hybrid else "trainer_waiting_idle"] -= unavoidable
        out["standalone_paused_for_sync"] = acc.get("standalone_syncing", 0.0)
        out["standalone_not_serving_other"] = sum(
            acc.get(f"standalone_{state}", 0.0) for state in ("parked", "switching", "active")
        )
        out["standalone_below_peak"] = acc.get("standalone_below_peak", 0.0)
        out["standalone_below_peak_admission_blocked"] = acc.get("standalone_below_peak_throttled", 0.0)
        out["slowed_while_training"] = acc.get("standalone_slowed", 0.0) + acc.get("hybrid_slowed", 0.0)
        out["reprefill_after_standalone_sync_aborts"] = acc.get("standalone_sync_reprefill", 0.0)
        out["reprefill_after_standalone_aborts"] = acc.get("standalone_reprefill", 0.0)
        out["reprefill_after_hybrid_aborts"] = acc.get("hybrid_reprefill", 0.0)
        unit = w.standalone_peak_per_device
        out["drain_queued_untrained"] = sum(smp.length for smp in w.queue) / unit
        partial = 0.0
        for r in w.replicas:
            r.advance(w.now)
            for smp in r.members.values():
                partial += smp.decoded(max(0.0, smp.target - r.progress))
        waiting = [*w.parked, *w.to_dispatch, *w.tool_waiting.values()]
        partial += sum(smp.decoded(smp.remaining) for smp in waiting)
        out["drain_in_flight_untrained"] = partial / unit
        decoded = acc.get("standalone_decoded", 0.0) + acc.get("hybrid_decoded", 0.0)
        wasted = sum(out[k] for k in GAP_KEYS if k.startswith(("reprefill", "drain")))
        out["residual"] = decoded - gen - wasted
        total = scale * w.now - gen - rho * train_device_s
        out = {k: v / scale for k, v in out.items()}
        out["total"] = total / scale
        return out

    def _result(self) -> RunResult:
        sc, run, w = self.sc, self.run, self.world
        train = sum(sc.lengths.prompt_tokens + s.length + s.extra_tokens for s in self.trained)
        train *= sc.trainer.device_s_per_token
        train += sc.trainer.step_overhead_s * run.train_devices * sc.steps * sc.trigger_parameter_sync_step
        bound = balance_bound(sc, run, self.trained, train, dict(w.progress_at))
        gap = self._gap(train)
        u_train = M.train_resource_utilization(self._compute_total, self._alloc_total)
        u_rollout = self._busy / self._capacity if self._capacity > 0 else 0.0
        util = M.cluster_resource_utilization(
            u_train, u_rollout, self._wait_total, self._step_total, run.train_devices, run.rollout_devices
        )
        total = sum(self.breakdown.values())
        if not math.isclose(total, w.now, rel_tol=1e-9, abs_tol=1e-6):
            raise SimulationError(f"run {run.name!r}: breakdown sums to {total}, time is {w.now} (a simulator bug)")
        return RunResult(
            name=run.name,
            policy=run.policy,
            train_devices=run.train_devices,
            rollout_devices=run.rollout_devices,
            hybrid=run.hybrid,
            time_s=w.now,
            work_bound_s=bound,
            breakdown_s=dict(self.breakdown),
            resource_utilization=util,
            steps=self.steps,
            activations=self.controller.activate_count if self.controller else 0,
            deactivations=self.controller.deactivate_count if self.controller else 0,
            generated=w.generated,
            consumed=w.consumed,
            queued=w.queue_size,
            outstanding=w.outstanding,
            admitted=w.admitted,
            version_lag_mean=statistics.fmean(self.version_lags) if self.version_lags else 0.0,
            version_lag_max=max(self.version_lags, default=0),
            gap_s=gap,
        )


def run_once(scenario: Scenario, run: RunSpec | str, trace_path: str | Path | None = None) -> RunResult:
    """Simulate one run of ``scenario``.

    Args:
        scenario: The scenario.
        run: A :class:`RunSpec` or the name of one of the scenario's runs.
        trace_path: Write the run's Chrome trace there (see :mod:`lightning_hybrid_rollout.trace`).
    """
    spec = scenario.run(run) if isinstance(run, str) else run
    trace = None
    if trace_path is not None:
        meta = {
            "source": "simulator",
            "scenario": scenario.name,
            "run": spec.name,
            "policy": spec.policy,
            "train_devices": spec.train_devices,
            "rollout_devices": spec.rollout_devices,
            "hybrid": spec.hybrid,
            "sequencing": spec.sequencing,
            "enable_rebalance": spec.enable_rebalance,
            "early_first_sync": spec.early_first_sync,
            "staged_standalone_sync": spec.staged_standalone_sync,
            "standalone_sync_aborts": spec.sync_aborts,
            "standalone_sync_mode": spec.config.standalone_sync_mode,
        }
        trace = TraceWriter(trace_path, meta)
    try:
        result = _Run(scenario, spec, trace).execute()
    finally:
        if trace is not None:
            trace.close()
    if trace_path is not None:
        result.trace_path = str(trace_path)
    return result


_CACHE: dict[str, ScenarioResult] = {}
_CACHE_SIZE = 8


def simulate(
    scenario: Scenario, runs: Iterable[str] | None = None, trace_dir: str | Path | None = None
) -> ScenarioResult:
    """Simulate the scenario's runs (or the named subset) and compute the balance bound and efficiencies.

    Results without traces are memoised in-process (the simulation is deterministic), so asking twice is free.

    Args:
        scenario: The scenario.
        runs: Names of the runs to simulate (default: all).
        trace_dir: Write ``trace_<run>.json`` files there.
    """
    specs = scenario.runs if runs is None else [scenario.run(n) for n in runs]
    key = ""
    if trace_dir is None:
        key = json.dumps([scenario.to_dict(), [s.name for s in specs]], sort_keys=True, default=str)
        if key in _CACHE:
            return copy.deepcopy(_CACHE[key])
    result = _simulate(scenario, specs, trace_dir)
    if key:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = copy.deepcopy(result)
    return result


def _simulate(scenario: Scenario, specs: list[RunSpec], trace_dir: str | Path | None) -> ScenarioResult:
    if not specs:
        raise ValueError(f"scenario {scenario.name!r} has no runs to simulate")
    results = []
    for spec in specs:
        path = Path(trace_dir) / f"trace_{spec.name}.json" if trace_dir is not None else None
        results.append(run_once(scenario, spec, path))
    bound = min(r.work_bound_s for r in results)
    for r in results:
        r.efficiency = bound / r.time_s if r.time_s > 0 else 0.0
    return ScenarioResult(scenario.name, bound, results)


def replace_run(scenario: Scenario, name: str, **changes: Any) -> Scenario:
    """A copy of ``scenario`` whose run ``name`` has ``changes`` applied (helper for experiments and tests)."""
    runs = [dataclasses.replace(r, **changes) if r.name == name else r for r in scenario.runs]
    return scenario.with_runs(runs)
