"""One trainer rank of ``test_rank_protocol.py``: the real callback hooks over a gloo process group.

Usage: ``python -m tests.lightning._rank_protocol_worker RANK STORE_FILE OUT_JSON``. Rank 0 owns a fake runtime (no
Ray, no engines: waits and pushes are instant) and a scripted policy that walks every boundary kind; rank 1 runs the
same hooks as a non-zero rank does in a fit. Both write what they sent/received, when they offloaded and onloaded,
and (rank 0) when the hybrid engines woke.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from lightning_hybrid_rollout.config import AsyncTrainingConfig, RolloutConfig
from lightning_hybrid_rollout.lightning.callback import HybridRolloutCallback
from lightning_hybrid_rollout.run.runtime import OverlapReport, RuntimeQueries
from lightning_hybrid_rollout.schedule import DynamicResourceController

#: (early answer, controller answer) per cycle end, after the start decision (True: activate).
#: overlap_sync asks early only when it could prepare (hybrid asleep), i.e. at every cycle end here.
SCRIPT = {
    0: (None, True),  # the start decision: activate (the boundary sends "offload")
    1: (False, True),  # activate after the sync (seed order)
    2: (False, False),  # skip: "stay"
    3: (True, True),  # overlap: prepared under the standalone sync, then activated
    4: (True, False),  # overlap with a changed mind: prepared, then put back to sleep
    5: (False, True),  # the last cycle: activates, then the fit ends
}
KINDS = ["start", "activate", "skip", "overlap", "overlap_changed_mind", "last_cycle"]


class _Strategy:
    def __init__(self, log: list[tuple[str, float]]) -> None:
        self.log = log
        self.root_device = torch.device("cpu")
        self.is_offloaded = False

    def barrier(self, name: str | None = None) -> None:
        dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def offload_training_state(self) -> float:
        time.sleep(0.05)  # a real offload takes a while: rank 0 must not wake engines before it is done
        self.is_offloaded = True
        self.log.append(("offload_end", time.monotonic()))
        return 0.05

    def onload_training_state(self) -> float:
        self.is_offloaded = False
        self.log.append(("onload", time.monotonic()))
        return 0.0


class _Pool:
    """The hybrid pool as ``HybridReplicaPool`` behaves: a wake asks the trainer side for the devices first."""

    def __init__(self, cb: HybridRolloutCallback, log: list[tuple[str, float]]) -> None:
        self.cb, self.log = cb, log
        self.awake = False

    def wake_up_replicas(self) -> None:
        if self.awake:
            return
        self.cb._trainer_side.need_devices()
        self.log.append(("wake", time.monotonic()))
        self.awake = True

    def wake_prepared(self) -> None:  # overlap_sync: the callback offloaded every rank before calling this
        self.log.append(("wake", time.monotonic()))
        self.awake = True

    def sleep_replicas(self) -> None:
        self.awake = False

    def take_cycle_sync_s(self) -> float:
        return 0.0

    def __getattr__(self, name: str) -> Any:  # add/resume/remove/abort/sync/rebalance: nothing to do here
        return lambda *a, **k: None


class _Runtime(RuntimeQueries):
    def __init__(self, cb: HybridRolloutCallback, log: list[tuple[str, float]]) -> None:
        self.pool = _Pool(cb, log)
        self.standalone, self.hybrid = [object()], [object()]

    def queue_size(self) -> int:
        return 1000

    def samples_put(self) -> int:
        return 0

    def wait_for_samples(self, n: int, timeout: float) -> bool:
        return True

    def take_samples(self, n: int, timeout: float) -> list[Any]:
        return [SimpleNamespace(response_length=3) for _ in range(n)]

    def generated_samples(self) -> int:
        return 0

    def set_weight_version(self, version: int) -> None:
        pass

    def new_param_version(self, version: int) -> Any:
        return SimpleNamespace(history=[], step_generated_samples=0)

    def take_role_window(self) -> Any:
        return SimpleNamespace(serving_s={}, decoded_tokens={})

    def peek_role_window(self) -> Any:
        return self.take_role_window()

    def push_standalone(self, weights: Any, version: int) -> float:
        return 0.0

    def push_standalone_overlapped(self, weights: Any, version: int) -> OverlapReport:
        t0 = time.monotonic()
        self.pool.wake_prepared()
        t1 = time.monotonic()
        return OverlapReport(start_s=t0, standalone_end_s=t1, wake_end_s=t1, hybrid_end_s=t1, end_s=t1)

    def start_generation(self) -> None:
        pass

    def check_health(self) -> None:
        pass

    def trace_phase(self, *args: Any, **kwargs: Any) -> None:
        pass

    def trace_cycle(self, *args: Any, **kwargs: Any) -> None:
        pass

    def stop(self) -> None:
        pass


def main(rank: int, store: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    a = AsyncTrainingConfig(mini_batch_size=8, trigger_parameter_sync_step=1, overlap_sync=True)
    cb = HybridRolloutCallback(RolloutConfig(model_path="unused", hybrid_replicas=1), a, trace=False)
    log: list[tuple[str, float]] = []
    strategy = _Strategy(log)
    trainer = SimpleNamespace(
        global_step=0,
        is_global_zero=rank == 0,
        world_size=2,
        strategy=strategy,
        lightning_module=torch.nn.Linear(2, 2),
        loggers=[],
        callback_metrics={},
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)),
    )
    module = SimpleNamespace(param_version=0, log=lambda *args, **kwargs: None)
    if rank == 0:
        rt = _Runtime(cb, log)
        cb.run.runtime = rt
        cb.run.controller = DynamicResourceController(
            rt.pool, cb.policy, clock=time.monotonic, enable_rebalance=False, has_hybrid=True
        )

        def should_activate_after_step(step: int, active: bool, ctx: Any) -> bool:
            early, late = SCRIPT[step]
            asked_early = cb.run.call_log and cb.run.call_log[-1] == "overlap_should_activate"
            return bool(early if asked_early else late)

        cb.policy.should_activate_after_step = should_activate_after_step  # type: ignore[method-assign]
        cb.policy.should_deactivate = lambda step, active, ctx: active  # type: ignore[method-assign]
        cb.policy.deactivate_wait_samples = lambda ctx: 0  # type: ignore[method-assign]
    cb.on_train_start(trainer, module)  # type: ignore[arg-type]
    for step in range(len(SCRIPT) - 1):
        trainer.global_step = step
        cb.on_train_batch_start(trainer, module, None, step)  # type: ignore[arg-type]
        if rank == 0:
            cb.run.next_batch()
        trainer.global_step = step + 1
        cb.on_train_batch_end(trainer, module, None, None, step)  # type: ignore[arg-type]
    cb.on_train_end(trainer, module)  # type: ignore[arg-type]
    dist.barrier()
    protocol = cb._trainer_side.protocol
    with open(out, "w") as f:
        json.dump({"history": protocol.history, "log": log, "call_log": cb.run.call_log}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
