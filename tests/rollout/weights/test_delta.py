"""Exact delta weight sync (``rollout.weight_encoding: delta``) with in-process fake replicas that run the engine's
own :class:`DeltaShadow`: what each fake hashes is what a vLLM worker would load. Real replicas: ``test_delta_real``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from lightning_hybrid_rollout.config import WEIGHT_ENCODINGS, ConfigError, RolloutConfig
from lightning_hybrid_rollout.errors import WeightSyncError
from lightning_hybrid_rollout.rollout.weights.delta import (
    DELTA_HEADER,
    IDX,
    VAL,
    DeltaEncoder,
    DeltaShadow,
    changed_indices,
)
from lightning_hybrid_rollout.rollout.weights.delta import (
    WEIGHT_ENCODINGS as DELTA_ENCODINGS,
)
from lightning_hybrid_rollout.rollout.weights.format import (
    WeightBucket,
    checksum_state,
    parse_safetensors,
    plan_buckets,
    tensor_digest,
)
from lightning_hybrid_rollout.rollout.weights.push import seam
from lightning_hybrid_rollout.rollout.weights.router import WeightRouter
from tests.rollout.fakes import FakeWeightReceiver


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``ray`` path hands each fake the bucket itself (no Ray started: ``ray.put`` is the identity)."""
    import ray

    monkeypatch.setattr(ray, "put", lambda obj: obj)


class ShadowReceiver(FakeWeightReceiver):
    """A fake replica whose loads go through the engine's :class:`DeltaShadow` (``held``: what it would hold)."""

    def __init__(self, replica_id: str, dtype: str = "bfloat16", **kwargs: Any) -> None:
        super().__init__(replica_id, **kwargs)
        self.info = {"engine_dtype": dtype}
        self.shadow = DeltaShadow()
        self.held: dict[str, torch.Tensor] = {}
        self.encodings: list[str] = []

    def _feed(self, items: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in self.shadow.take(items):
            self._digests[name] = tensor_digest(name, t)
            self.held[name] = t.clone()

    def _load(self, buf: Any, offset: int, nbytes: int) -> dict[str, Any]:
        if self._version is None:
            raise RuntimeError(f"{self.replica_id}: load outside begin/finish")
        items, size = parse_safetensors(buf, offset)
        assert size == nbytes
        self._feed(items)
        return {"tensors": len(items), "bytes": nbytes}

    async def receive_weights(self, transport: str, request: Any) -> dict[str, Any]:
        from lightning_hybrid_rollout.rollout.weights.factory import create_receiver

        self._record(f"receive_weights:{transport}")
        if transport not in self.receivers:
            self.receivers[transport] = create_receiver(transport)
        items = await asyncio.to_thread(self.receivers[transport].receive, request)
        if items:
            self._feed(items)
        return {"tensors": len(items)}

    async def begin_weight_update(self, version: int, total_bytes: int = 0, keep: bool = False) -> None:
        await super().begin_weight_update(version, total_bytes, keep)
        self.shadow.begin()

    async def finish_weight_update(self) -> str:
        try:
            self._feed_pending()
        except Exception:
            self.shadow.abandon()
            raise
        self.encodings.append(self.shadow.mode or "plain")
        checksum = await super().finish_weight_update()
        self.shadow.commit(checksum)
        return checksum

    def _feed_pending(self) -> None:
        for name, t in self.shadow.pending():
            self._digests[name] = tensor_digest(name, t)
            self.held[name] = t.clone()

    async def abort_weight_update(self) -> None:
        await super().abort_weight_update()
        self.shadow.abandon()


class Trainer:
    """A small float32 model trained by AdamW (lr 3e-5, the SmolLM2 example's): its weights change like an RL step's
    do, every element a little, so in bfloat16 most elements keep their bits."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.params = {
            "model.embed_tokens.weight": torch.randn(64, 16, generator=g) * 0.05,
            **{f"model.layers.{i}.mlp.up_proj.weight": torch.randn(32, 16, generator=g) * 0.05 for i in range(3)},
            **{f"model.layers.{i}.mlp.down_proj.weight": torch.randn(16, 32, generator=g) * 0.05 for i in range(3)},
            "model.norm.weight": torch.ones(16),
        }
        for p in self.params.values():
            p.requires_grad_(True)
        self.opt = torch.optim.AdamW(self.params.values(), lr=3e-5, betas=(0.9, 0.99), weight_decay=0.0)
        self.g = g

    def step(self) -> None:
        x = torch.randn(8, 16, generator=self.g)
        h = x
        for i in range(3):
            h = torch.relu(h @ self.params[f"model.layers.{i}.mlp.up_proj.weight"].T)
            h = h @ self.params[f"model.layers.{i}.mlp.down_proj.weight"].T
        loss = ((h * self.params["model.norm.weight"]) @ self.params["model.embed_tokens.weight"].T).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def state(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p.detach()) for n, p in self.params.items()]

    def cast(self, dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
        return [(n, p.detach().to(dtype)) for n, p in self.params.items()]


def _bits_equal(held: dict[str, torch.Tensor], state: list[tuple[str, torch.Tensor]]) -> bool:
    return set(held) == {n for n, _ in state} and all(
        held[n].dtype == t.dtype and torch.equal(held[n].view(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
        for n, t in state
    )


# ---------------------------------------------------------------------------------------------------------------
def test_the_config_field_defaults_to_auto_and_is_checked_in_one_line() -> None:
    assert WEIGHT_ENCODINGS == DELTA_ENCODINGS
    assert RolloutConfig().weight_encoding == "auto"
    assert RolloutConfig(weight_encoding="full").weight_encoding == "full"
    with pytest.raises(ConfigError) as err:
        RolloutConfig(weight_encoding="xor")  # type: ignore[arg-type]
    assert str(err.value).count("\n") == 0 and "rollout.weight_encoding" in str(err.value)
    with pytest.raises(ValueError, match="weight encoding must be one of"):
        WeightRouter("auto", "sparse")


def test_changed_indices_compare_bits_and_a_bf16_adam_step_changes_few_elements() -> None:
    old = torch.tensor([0.0, 1.0, float("nan"), 2.0])
    new = torch.tensor([-0.0, 1.0, float("nan"), 2.5])
    assert changed_indices(new, old).tolist() == [0, 3]  # -0.0 is a change, the same NaN is not
    assert changed_indices(new, old).dtype == torch.int32
    trainer = Trainer()
    enc = DeltaEncoder(torch.bfloat16)
    enc.advance(trainer.state(), 1)
    trainer.step()
    enc.advance(trainer.state(), 2)
    assert enc.changed_fraction is not None and 0 < enc.changed_fraction < 0.5
    pay = enc.payload(1)
    assert pay.encoding == "delta" and pay.items[0][0] == DELTA_HEADER
    assert any(n.endswith(IDX) for n, _ in pay.items) and any(n.endswith(VAL) for n, _ in pay.items)
    assert all(t.numel() * t.element_size() % 8 == 0 for _, t in pay.items)  # aligned for zero-copy views
    assert sum(t.numel() * t.element_size() for _, t in pay.items) < enc.full_bytes / 2
    assert enc.advance(trainer.state(), 2) is False  # built once per version
    # pairs stay in one bucket, whatever the bucket size
    for bucket in plan_buckets(pay.items[1:], bucket_bytes=64):
        names = {n for n, _ in bucket}
        assert all((n[: -len(IDX)] + VAL in names) for n in names if n.endswith(IDX))


def test_delta_synced_weights_are_bit_identical_to_the_engine_dtype_cast_after_many_steps_on_every_transport(
    run_async,
) -> None:
    """Three fakes, one per transport, bf16 engines: after 12 AdamW steps each holds exactly the trainer's weights
    cast to bfloat16, every sync a verified delta but the first, and each delta smaller than a full sync."""
    trainer = Trainer()
    routers = {t: WeightRouter(t, "delta") for t in ("node_shm", "ray", "collective")}
    fakes = {t: ShadowReceiver(f"r-{t}") for t in routers}

    expected: list[str] = []

    async def go() -> list[list[Any]]:
        out = []
        for v in range(1, 13):
            if v > 1:
                trainer.step()
            expected.append(checksum_state(trainer.cast(torch.bfloat16)))
            out.append([await routers[t].push(trainer.state(), [fakes[t]], v, bucket_bytes=4096) for t in routers])
        return out

    try:
        reports = run_async(go())
    finally:
        for r in routers.values():
            r.close()
    for t, f in fakes.items():
        assert _bits_equal(f.held, trainer.cast(torch.bfloat16)), t
        assert f.encodings == ["full"] + ["delta"] * 11
    full = reports[0][0].bytes
    for v, row in enumerate(reports, start=1):
        for rep in row:
            assert rep.checksum == expected[v - 1]  # what a bf16 engine holds after a full sync of version v
            assert set(rep.replica_checksums.values()) == {rep.checksum}
            assert rep.encoding == ("full" if v == 1 else "delta")
            assert rep.full_bytes == sum(t.numel() * 2 for _, t in trainer.state())
            if v > 1:
                assert rep.bytes < full / 2 and 0 < rep.changed_fraction < 0.5
    # a float32 trainer, bf16 engine: even the first (full) sync moves half of weight_encoding: full's bytes
    assert full < sum(t.numel() * 4 for _, t in trainer.state()) / 2 + 4096


def test_a_corrupted_delta_is_caught_by_the_checksum_and_repaired_by_a_full_sync(run_async) -> None:
    trainer = Trainer(1)
    a, b = ShadowReceiver("a"), ShadowReceiver("b")
    router = WeightRouter("ray", "delta")

    def flip(rid: str, bucket: WeightBucket) -> WeightBucket:
        hits = [i for i, n in enumerate(bucket.names) if n.endswith(VAL)]
        if rid != "a" or not hits:
            return bucket
        payload = list(bucket.payload)
        payload[hits[0]] = payload[hits[0]] ^ 0x40  # every value of one changed tensor (a padded entry repeats one)
        return WeightBucket(bucket.header, payload, list(bucket.names), bucket.index)

    async def go() -> Any:
        await router.push(trainer.state(), [a, b], 1)
        trainer.step()
        with seam.installed(bucket_hook=flip):
            repaired = await router.push(trainer.state(), [a, b], 2)
        trainer.step()
        after = await router.push(trainer.state(), [a, b], 3)
        return repaired, after

    repaired, after = run_async(go())
    assert repaired.repaired == ["a"] and repaired.per_replica_encoding == {"a": "full", "b": "delta"}
    assert repaired.replica_checksums == {"a": repaired.checksum, "b": repaired.checksum}
    assert a.encodings == ["full", "delta", "full", "delta"] and b.encodings == ["full", "delta", "delta"]
    assert repaired.bytes > repaired.full_bytes  # the failed delta and the repair both moved
    assert after.encoding == "delta" and _bits_equal(a.held, trainer.cast(torch.bfloat16))


def test_a_replica_that_slept_through_versions_gets_the_squashed_chain_or_a_full_sync(run_async) -> None:
    trainer = Trainer(2)
    awake, asleep = ShadowReceiver("standalone"), ShadowReceiver("hybrid")
    router = WeightRouter("node_shm", "delta")

    async def go() -> tuple[Any, Any]:
        await router.push(trainer.state(), [awake, asleep], 1)
        for v in range(2, 6):  # the hybrid replica sleeps through versions 2-5
            trainer.step()
            await router.push(trainer.state(), [awake], v)
        trainer.step()
        woke = await router.push(trainer.state(), [awake, asleep], 6)
        for v in range(7, 9):
            with torch.no_grad():  # a version where every element moves: no chain across it is smaller
                for p in trainer.params.values():
                    p.mul_(1.5)
            await router.push(trainer.state(), [awake], v)
        trainer.step()
        return woke, await router.push(trainer.state(), [awake, asleep], 9)

    woke, far = run_async(go())
    assert woke.per_replica_encoding == {"standalone": "delta", "hybrid": "delta"}
    assert woke.bytes < woke.full_bytes  # two payloads: the one-step delta and the five-step chain, squashed
    assert far.per_replica_encoding == {"standalone": "delta", "hybrid": "full"}
    assert asleep.encodings == ["full", "delta", "full"]
    assert _bits_equal(asleep.held, trainer.cast(torch.bfloat16))
    assert set(far.replica_checksums.values()) == {far.checksum}


def test_a_restarted_replica_or_one_that_lost_its_shadow_gets_a_full_sync(run_async) -> None:
    trainer = Trainer(3)
    router = WeightRouter("ray", "delta")
    r0 = ShadowReceiver("r0")

    async def go() -> tuple[Any, Any, ShadowReceiver]:
        await router.push(trainer.state(), [r0], 1)
        fresh = ShadowReceiver("r0")  # the supervisor's replacement: same id, new handle
        trainer.step()
        restarted = await router.push(trainer.state(), [fresh], 2)
        fresh.shadow.drop()  # e.g. a plain (weight_encoding: full) push reached it meanwhile
        trainer.step()
        lost = await router.push(trainer.state(), [fresh], 3)  # the engine refuses the delta; repaired at once
        return restarted, lost, fresh

    restarted, lost, fresh = run_async(go())
    assert restarted.encoding == "full" and restarted.repaired == []
    assert lost.repaired == ["r0"] and lost.per_replica_encoding == {"r0": "full"}
    assert fresh.encodings == ["full", "full"]  # the refused delta never finished
    assert _bits_equal(fresh.held, trainer.cast(torch.bfloat16))


def test_a_replica_whose_full_repair_fails_too_fails_the_push(run_async) -> None:
    trainer = Trainer(4)
    router = WeightRouter("ray", "delta")
    r0 = ShadowReceiver("r0")

    def corrupt(rid: str, bucket: WeightBucket) -> WeightBucket:
        payload = list(bucket.payload)
        payload[-1] = payload[-1] ^ 0x40
        return WeightBucket(bucket.header, payload, list(bucket.names), bucket.index)

    async def go() -> None:
        await router.push(trainer.state(), [r0], 1)
        trainer.step()
        with seam.installed(bucket_hook=corrupt):
            await router.push(trainer.state(), [r0], 2)

    with pytest.raises(WeightSyncError) as err:
        run_async(go())
    assert set(err.value.failures) == {"r0"} and "checksum mismatch" in err.value.failures["r0"]
    assert err.value.report is not None and err.value.report.bytes > 0
    assert router.delta is not None and router.delta.held_seq(r0, "bfloat16") is None


def test_a_delta_cannot_start_from_weights_the_engine_does_not_hold() -> None:
    enc = DeltaEncoder(torch.float32)
    enc.advance([("w", torch.zeros(1024))], 1)
    enc.advance([("w", torch.arange(1024.0) * (torch.arange(1024) < 2))], 2)
    assert enc.payload(1).encoding == "delta"
    shadow = DeltaShadow()
    shadow.begin()
    with pytest.raises(RuntimeError, match="full sync is needed"):
        shadow.take(enc.payload(1).items)
    shadow.begin()
    shadow.take(enc.payload(None).items)  # a full payload: kept as the shadow
    shadow.commit("c2")
    assert shadow.checksum == "c2" and torch.equal(shadow.tensors["w"], enc.current["w"])
    shadow.begin()
    assert [n for n, _ in shadow.take([("w", torch.ones(16))])] == ["w"]  # loaded as it is
    assert shadow.checksum is None and shadow.tensors == {}  # a plain push (no header) drops the shadow


def test_auto_sends_deltas_to_a_16_bit_engine_and_full_weights_to_a_float32_one(run_async) -> None:
    """``weight_encoding: auto``: float32 weights change almost everywhere under Adam, so only the bf16 engine gets
    deltas; the float32 engine gets the trainer's tensors as they are, with nothing encoded for it."""
    trainer = Trainer()
    router = WeightRouter("ray", "auto")
    b16, f32 = ShadowReceiver("b16"), ShadowReceiver("f32", dtype="float32")

    async def go() -> list[Any]:
        out = []
        for v in range(1, 4):
            if v > 1:
                trainer.step()
            out.append(await router.push(trainer.state(), [b16, f32], v, bucket_bytes=4096))
        return out

    try:
        reports = run_async(go())
    finally:
        router.close()
    assert b16.encodings == ["full", "delta", "delta"]
    assert [r.per_replica_encoding.get("b16") for r in reports] == ["full", "delta", "delta"]
    assert [r.per_replica_encoding.get("f32", "full") for r in reports] == ["full"] * 3
    assert router.delta is not None and set(router.delta.encoders) == {"bfloat16"}  # no float32 copy kept
    assert _bits_equal(b16.held, trainer.cast(torch.bfloat16)) and _bits_equal(f32.held, trainer.state())
