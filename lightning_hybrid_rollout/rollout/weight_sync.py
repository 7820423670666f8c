"""The weight sync's public names at their first import path; the code lives in :mod:`.weights`.

Trainer-side callers (``lightning/runtime.py``) push through this module, so a test can replace
``weight_sync.push_weights_async`` in one place. New code may import from the modules directly: the push from
:mod:`.weights.push`, the GPU transports from :mod:`.weights.transports`, the staging file from
:mod:`.weights.staging`, the wire format from :mod:`.weights.format`.
"""

from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.weights.format import (
    DEFAULT_BUCKET_BYTES,
    HASH_ALGO,
    WeightBucket,
    checksum_state,
    combine_digests,
    make_bucket,
    parse_safetensors,
    plan_buckets,
    tensor_digest,
)
from lightning_hybrid_rollout.rollout.weights.push import PushHooks, WeightSync, push_weights, push_weights_async, seam
from lightning_hybrid_rollout.rollout.weights.receiver import GpuWeightReceiver, WeightReceiver
from lightning_hybrid_rollout.rollout.weights.report import SyncReport
from lightning_hybrid_rollout.rollout.weights.staging import SharedStaging, release_node_stagings
from lightning_hybrid_rollout.rollout.weights.transports import (
    NcclWeightBroadcaster,
    cuda_ipc_bucket,
    push_weights_cuda_ipc_async,
    push_weights_nccl_async,
)

NodeStaging = SharedStaging
"""The trainer's node staging file (:class:`~.weights.staging.SharedStaging`), under its first name."""

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "HASH_ALGO",
    "GpuWeightReceiver",
    "NcclWeightBroadcaster",
    "NodeStaging",
    "PushHooks",
    "SharedStaging",
    "SyncReport",
    "WeightBucket",
    "WeightReceiver",
    "WeightSync",
    "WeightSyncError",
    "checksum_state",
    "combine_digests",
    "cuda_ipc_bucket",
    "make_bucket",
    "parse_safetensors",
    "plan_buckets",
    "push_weights",
    "push_weights_async",
    "push_weights_cuda_ipc_async",
    "push_weights_nccl_async",
    "release_node_stagings",
    "seam",
    "tensor_digest",
]
