"""The transport registry, ``rollout.weight_transport``, and the ``collective`` transport over gloo with in-process
fake replicas (each fake runs the real engine-side receiver in a thread)."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid_rollout.config import WEIGHT_TRANSPORTS, ConfigError, RolloutConfig
from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.weights.base import BucketLayout, EngineReceiver, WeightTransport
from lightning_hybrid_rollout.rollout.weights.factory import (
    TRANSPORT_CHOICES,
    TRANSPORTS,
    create_receiver,
    create_transport,
)
from lightning_hybrid_rollout.rollout.weights.format import checksum_state
from lightning_hybrid_rollout.rollout.weights.report import SyncReport
from lightning_hybrid_rollout.rollout.weights.router import AUTO_CPU, WeightRouter, merge_reports
from tests.rollout.fakes import FakeWeightReceiver

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(32, 8, generator=g),
        **{f"model.layers.{i}.mlp.weight": torch.randn(8, 8, generator=g) for i in range(3)},
        "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
    }


def test_every_registered_transport_resolves_to_its_classes() -> None:
    assert TRANSPORT_CHOICES == WEIGHT_TRANSPORTS  # the config's choices are the registry's names
    for name, (module, sender, receiver) in TRANSPORTS.items():
        cls = getattr(__import__(module, fromlist=[sender]), sender)
        assert issubclass(cls, WeightTransport) and cls.name == name
        if receiver is not None:
            assert isinstance(create_receiver(name), EngineReceiver)
    with pytest.raises(ValueError, match="unknown weight transport 'nccl'"):
        create_transport("nccl")
    with pytest.raises(ValueError, match="no engine-side receiver"):
        create_receiver("ray")


def test_the_config_field_is_checked_in_one_line() -> None:
    assert RolloutConfig().weight_transport == "auto"
    assert RolloutConfig(weight_transport="collective").weight_transport == "collective"
    with pytest.raises(ConfigError) as err:
        RolloutConfig(weight_transport="nccl")  # type: ignore[arg-type]
    assert str(err.value).count("\n") == 0 and "rollout.weight_transport" in str(err.value)


@no_cuda
def test_cuda_ipc_without_cuda_is_one_line_before_anything_starts() -> None:
    with pytest.raises(RuntimeError, match=r"^rollout.weight_transport 'cuda_ipc' needs CUDA") as err:
        WeightRouter("cuda_ipc")
    assert "\n" not in str(err.value)


@no_cuda
def test_auto_without_cuda_keeps_the_per_replica_shm_or_ray_choice_and_a_named_transport_takes_every_replica() -> None:
    a, b = FakeWeightReceiver("a"), FakeWeightReceiver("b")
    assert WeightRouter("auto").plan([a, b]) == {AUTO_CPU: [a, b]}
    assert WeightRouter("collective").plan([a, b]) == {"collective": [a, b]}
    assert WeightRouter("ray").plan([]) == {}


def test_a_bucket_layout_slices_what_was_packed() -> None:
    items = list(_state().items())
    layout = BucketLayout.of(items)
    buf = BucketLayout.pack(items, torch.device("cpu"))
    assert layout.nbytes == buf.numel() == sum(t.numel() * t.element_size() for _, t in items)
    assert [m.offset for m in layout.tensors] == sorted(m.offset for m in layout.tensors)
    assert checksum_state(layout.views(buf)) == checksum_state(items)


def test_merged_report_names_every_transport_and_replica() -> None:
    a = SyncReport(3, 100, 1, 2, 0.5, 0.1, checksum="c", transport="collective")
    a.per_replica_transport, a.replica_checksums = {"s0": "collective"}, {"s0": "c"}
    b = SyncReport(3, 100, 1, 1, 0.2, 0.0, checksum="c", transport="cuda_ipc")
    b.per_replica_transport, b.replica_checksums = {"h0": "cuda_ipc"}, {"h0": "c"}
    m = merge_reports([a, b])
    assert m.transport == "collective+cuda_ipc" and m.num_replicas == 2 and m.seconds == 0.5
    assert m.per_replica_transport == {"s0": "collective", "h0": "cuda_ipc"}


def test_collective_pushes_verified_buckets_over_one_gloo_group_kept_across_pushes(run_async) -> None:
    fakes = [FakeWeightReceiver(f"r{i}") for i in range(2)]
    router = WeightRouter("collective")
    committed: list[bool] = []

    async def on_commit() -> None:
        committed.append(True)

    async def go() -> list[SyncReport]:
        out = [await router.push(_state(1), fakes, 1, bucket_bytes=600)]
        out.append(await router.push(_state(2), fakes, 2, bucket_bytes=600, staged=True, on_commit=on_commit))
        return out

    try:
        first, staged = run_async(go())
        group = router.transport("collective")._groups  # type: ignore[attr-defined]
        assert len(group) == 1  # the second push reused the group
        for report, seed in ((first, 1), (staged, 2)):
            assert report.transport == "collective" and report.num_buckets > 1
            assert set(report.per_replica_transport.values()) == {"collective"}
            assert report.replica_checksums == {f.replica_id: checksum_state(_state(seed)) for f in fakes}
        assert committed == [True]
        for f in fakes:
            joins = f.calls.count("receive_weights:collective")
            assert joins == 1 + first.num_buckets + staged.num_buckets + 1  # join, buckets, staged buckets, commit
            assert "attach_node_staging" not in f.calls and "load_weight_bucket" not in f.calls  # no other path
        # another set of replicas: a new group; the old one is shut down
        more = [*fakes, FakeWeightReceiver("r2")]
        report = run_async(router.push(_state(3), more, 3, bucket_bytes=600))
        assert set(report.replica_checksums.values()) == {checksum_state(_state(3))} and len(group) == 1
    finally:
        router.close()
        for f in fakes:
            for rx in f.receivers.values():
                rx.close()


def test_a_collective_replica_that_loads_something_else_fails_the_push(run_async, monkeypatch) -> None:
    from lightning_hybrid_rollout.rollout.weights import collective

    real = collective.BucketLayout.views

    def corrupt(self: BucketLayout, buf: torch.Tensor):  # the engine side sees one flipped byte
        buf = buf.clone()
        buf[len(buf) // 2] ^= 0x10
        return real(self, buf)

    fakes = [FakeWeightReceiver("r0")]
    router = WeightRouter("collective")
    monkeypatch.setattr(collective.BucketLayout, "views", corrupt)
    try:
        with pytest.raises(WeightSyncError, match="replica r0: checksum mismatch"):
            run_async(router.push(_state(1), fakes, 1))
    finally:
        router.close()
        fakes[0].receivers["collective"].close()
