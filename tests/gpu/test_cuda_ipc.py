"""The ``cuda_ipc`` transport between two processes on one GPU (``rollout/weights/cuda_ipc.py``).

A spawned child (``_ipc_child.py``) stands in for the engine's worker: it rebuilds the parent's tensors from their
IPC handles with the real ``CudaIpcReceiver`` and sends back plain bytes, so the checks are:

- handles round-trip a state dict bit-exactly: names, dtypes (float32/64, bfloat16, float16, int64, int8, uint8,
  bool), shapes, strides and every byte, NaN / inf / -0.0 / subnormals included, for tensors that share a caching
  allocator segment, a transposed view and a slice with a storage offset; and nothing is copied (a write by the child
  through its mapping is what the parent then reads);
- ``CudaIpcTransport.push`` from CPU or CUDA tensors to a replica whose engine side is the child: the child's
  checksum of what it loaded is the trainer's, and its bytes are the state's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

MIB = 2**20
REPLY_TIMEOUT_S = 120

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


def _state(device: str | torch.device) -> dict[str, torch.Tensor]:
    """A small HF-like state dict with every dtype the weight path sends and the float values equality misjudges."""
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, 3.4e38, -1.5])
    state = {
        "model.embed_tokens.weight": torch.randn(257, 64, generator=g),  # odd rows
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(96, 64, generator=g).to(torch.float16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(1024, 4096, generator=g),  # 16 MiB: its own segment
        "model.norm.weight": special,
        "model.norm.bias": special.to(torch.bfloat16),
        "model.rotary_emb.inv_freq": torch.rand(32, generator=g, dtype=torch.float64),
        "counts": torch.randint(-(2**40), 2**40, (33,), generator=g, dtype=torch.int64),
        "small_ints": torch.randint(-128, 127, (17,), generator=g, dtype=torch.int8),
        "bytes": torch.randint(0, 255, (5, 3), generator=g, dtype=torch.uint8),
        "mask": torch.rand(9, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
    }
    return {k: v.to(device) for k, v in state.items()}


class Child:
    """The spawned receiver process and its pipe."""

    def __init__(self) -> None:
        from tests.gpu import _ipc_child

        ctx = torch.multiprocessing.get_context("spawn")  # never fork a process that holds a CUDA context
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_ipc_child.serve, args=(child_conn,), daemon=True)
        self.process.start()
        child_conn.close()

    def call(self, *request: Any) -> Any:
        self.conn.send(request)
        if not self.conn.poll(REPLY_TIMEOUT_S):
            raise AssertionError(f"the IPC child gave no answer to {request[0]!r} within {REPLY_TIMEOUT_S} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise AssertionError(f"the IPC child failed on {request[0]!r}:\n{value}")
        return value

    def close(self) -> None:
        try:
            if self.process.is_alive():
                self.call("stop")
        finally:
            self.process.join(30)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(10)


@pytest.fixture(scope="module")
def ipc_child() -> Iterator[Child]:
    child = Child()
    try:
        yield child
    finally:
        child.close()


def test_ipc_handles_round_trip_a_state_dict_bit_exactly_and_without_a_copy(
    ipc_child: Child, gpu_record: dict[str, Any]
) -> None:
    from lightning_hybrid_rollout.rollout.weights.cuda_ipc import ipc_handles

    state = _state("cuda")
    state["model.layers.0.self_attn.q_proj.weight.T"] = state["model.layers.0.self_attn.q_proj.weight"].t()
    state["model.embed_tokens.weight[5:17]"] = state["model.embed_tokens.weight"][5:17]
    torch.cuda.synchronize()
    items = list(state.items())
    nbytes = sum(t.numel() * t.element_size() for _, t in items)
    t0 = time.perf_counter()
    reply = ipc_child.call("receive", ipc_handles(items))
    seconds = time.perf_counter() - t0
    got = {name: rest for name, *rest in reply["tensors"]}
    gpu_record.update(
        ipc_mib=round(nbytes / MIB, 1),
        ipc_s=round(seconds, 4),
        child_alloc_mib=round(reply["alloc_bytes"] / MIB, 1),
        note=f"{len(items)} tensors, child device {reply['device']}",
    )
    assert list(got) == list(state)
    for name, t in items:
        dtype, shape, stride, is_cuda, raw = got[name]
        assert (dtype, tuple(shape), tuple(stride), is_cuda) == (str(t.dtype), tuple(t.shape), t.stride(), True), name
        assert raw == _raw(t), f"{name}: the bytes the child read differ from the parent's"
    # zero copy: the child writes through its mapping and the parent's own tensor changes
    name = "model.layers.0.mlp.up_proj.weight"
    ipc_child.call("fill", name, 7.0)
    assert torch.equal(state[name], torch.full_like(state[name], 7.0)), "the child's tensor is a copy, not a mapping"
    gpu_record["note"] += "; zero copy (a child write is seen by the parent)"


class ChildReplica:
    """A ``WeightReceiver`` whose engine side is the child process (only what a ``cuda_ipc`` push calls)."""

    replica_id = "ipc-child"

    def __init__(self, child: Child) -> None:
        self.child = child
        self.info: dict[str, Any] = {}
        self.calls: list[str] = []
        self.described: list[Any] = []

    async def begin_weight_update(self, version: int, total_bytes: int = 0, keep: bool = False) -> None:
        self.calls.append("begin_weight_update")

    async def receive_weights(self, transport: str, request: Any) -> dict[str, Any]:
        self.calls.append(f"receive_weights:{transport}")
        reply = await asyncio.to_thread(self.child.call, "push_load", request.handles)
        self.described = reply.pop("described")
        return reply

    async def abort_weight_update(self) -> None:
        self.calls.append("abort_weight_update")

    async def finish_weight_update(self) -> str:
        self.calls.append("finish_weight_update")
        return await asyncio.to_thread(self.child.call, "finish")


@pytest.mark.parametrize("source", ["cpu", "cuda"])
def test_cuda_ipc_transport_push_is_verified_by_a_receiver_in_another_process(
    source: str, ipc_child: Child, gpu_record: dict[str, Any]
) -> None:
    from lightning_hybrid_rollout.rollout.weights.cuda_ipc import CudaIpcTransport
    from lightning_hybrid_rollout.rollout.weights.format import checksum_state

    state = _state(source)  # cpu: what iter_full_weights streams; the transport moves it to the device
    replica = ChildReplica(ipc_child)
    report = asyncio.run(CudaIpcTransport().push(state, [replica], version=3))
    gpu_record.update(
        ipc_mib=round(report.bytes / MIB, 1), ipc_s=round(report.seconds, 4), note=f"push from {source} tensors"
    )
    assert report.transport == "cuda_ipc" and report.per_replica_transport == {"ipc-child": "cuda_ipc"}
    assert report.checksum == checksum_state(state)
    assert report.replica_checksums == {"ipc-child": report.checksum}
    assert report.bytes == sum(t.numel() * t.element_size() for t in state.values())
    assert replica.calls == ["begin_weight_update", "receive_weights:cuda_ipc", "finish_weight_update"]
    got = {name: raw for name, _dtype, _shape, _stride, _is_cuda, raw in replica.described}
    assert list(got) == list(state)
    assert all(got[name] == _raw(t) for name, t in state.items())
