"""The vLLM driver's bookkeeping without an engine: logprob extraction and aborts that race the submission."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.logprobs import FlatLogprobs, Logprob

from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
from lightning_hybrid_rollout.rollout.vllm.driver import VLLMEngine, sampled_logprobs


def test_sampled_logprobs_reads_the_sampled_token_of_each_position_flat_or_nested() -> None:
    flat = FlatLogprobs()
    flat.append({7: Logprob(-0.5, rank=1)})
    flat.append({3: Logprob(-2.0, rank=4), 9: Logprob(-0.1, rank=1)})  # the sampled token need not come first
    assert sampled_logprobs(flat, [7, 9]) == [-0.5, -0.1]
    nested = [{7: Logprob(-0.5)}, {9: Logprob(-0.1)}]
    assert sampled_logprobs(nested, [7, 9]) == [-0.5, -0.1]
    missing = sampled_logprobs(flat, [7, 9, 11])  # the engine gave no entry for the third token
    assert missing[:2] == [-0.5, -0.1] and math.isnan(missing[2])
    assert all(math.isnan(x) for x in sampled_logprobs(None, [1, 2]))


class _FakeLLM:
    """vLLM's ``AsyncLLM`` as the driver's abort path sees it: ``abort`` and the frontend's request registry."""

    def __init__(self) -> None:
        self.output_processor = SimpleNamespace(external_req_ids={}, request_states={})
        self.aborts: list[list[str]] = []

    async def abort(self, request_ids: list[str]) -> None:
        self.aborts.append(list(request_ids))

    def register(self, request_id: str) -> None:
        """What vLLM's ``add_request`` does in its frontend: an internal id and that id's state."""
        self.output_processor.external_req_ids[request_id] = [f"{request_id}-internal"]
        self.output_processor.request_states[f"{request_id}-internal"] = SimpleNamespace(detokenizer=None)


def test_an_abort_that_arrives_before_vllm_knows_the_request_is_repeated_once_vllm_knows_it() -> None:
    engine = VLLMEngine(VLLMEngineConfig(model="unused", abort_timeout_s=5.0), "r0")
    llm = engine.llm = _FakeLLM()

    async def go() -> None:
        engine._inflight["early"] = 0  # submitted by generate(), not registered in vLLM yet
        engine._inflight["known"] = 0
        llm.register("known")
        await engine.abort(["early", "known"])
        assert llm.aborts == [["early", "known"]]  # vLLM ignored "early": it did not know it
        await asyncio.sleep(0.02)
        assert llm.aborts == [["early", "known"]]  # nothing to repeat until vLLM registers it
        llm.register("early")
        for _ in range(100):
            if len(llm.aborts) > 1:
                break
            await asyncio.sleep(0.005)
        assert llm.aborts == [["early", "known"], ["early"]]
        engine._inflight.clear()
        await asyncio.sleep(0.01)
        assert not engine._late_aborts  # the watcher ended with the requests

    asyncio.run(go())


def test_a_pending_late_abort_ends_with_the_engine_s_shutdown() -> None:
    engine = VLLMEngine(VLLMEngineConfig(model="unused", abort_timeout_s=30.0), "r0")
    llm = engine.llm = _FakeLLM()
    llm.shutdown = lambda timeout: None  # type: ignore[attr-defined]

    async def go() -> None:
        engine._inflight["early"] = 0  # vLLM never registers it: the watcher would wait for abort_timeout_s
        await engine.abort(["early"])
        (watcher,) = engine._late_aborts
        await engine.shutdown()
        await asyncio.sleep(0.01)
        assert watcher.done() and not engine._late_aborts and engine.llm is None
        assert watcher.cancelled() or watcher.exception() is None  # ended, not crashed on the closed engine

    asyncio.run(go())


def test_health_counts_a_request_vllm_just_forgot_at_its_last_reading_so_the_total_never_goes_back() -> None:
    """vLLM forgets a request as it hands its output over, a moment before ``generate`` counts its tokens: the
    replica's total (``tokens_generated + tokens_in_flight``, sampled at the trainer's step boundaries) must not dip."""
    engine = VLLMEngine(VLLMEngineConfig(model="unused"), "r0")
    llm = engine.llm = _FakeLLM()

    async def check_health() -> None:
        pass

    llm.check_health = check_health  # type: ignore[attr-defined]

    def total(health: dict) -> int:
        return int(health["tokens_generated"]) + int(health["tokens_in_flight"])

    async def go() -> None:
        engine._inflight["a"] = engine._inflight["b"] = 0
        llm.register("a")
        llm.register("b")
        for rid, tokens in (("a", 7), ("b", 3)):
            llm.output_processor.request_states[f"{rid}-internal"].detokenizer = SimpleNamespace(
                num_output_tokens=lambda n=tokens: n
            )
        assert total(await engine.health()) == 10
        # "a" finished: vLLM dropped its state, its generate() has not taken the output yet
        del llm.output_processor.request_states["a-internal"], llm.output_processor.external_req_ids["a"]
        assert total(await engine.health()) == 10

    asyncio.run(go())


def test_a_cancelled_request_keeps_what_it_generated_in_the_running_total() -> None:
    """A ``generate`` cancelled mid-request (its caller gave up) leaves its tokens in ``tokens_generated``: the total
    the runtime samples at the trainer's step boundaries never goes back."""
    from lightning_hybrid_rollout.rollout.engine import SamplingSpec

    engine = VLLMEngine(VLLMEngineConfig(model="unused"), "r0")
    llm = engine.llm = _FakeLLM()
    engine.state = "active"
    engine._ready.set()

    async def check_health() -> None:
        pass

    async def generate(prompt, params, request_id):  # vLLM registers the request, then decodes 5 tokens and hangs
        llm.register(request_id)
        llm.output_processor.request_states[f"{request_id}-internal"].detokenizer = SimpleNamespace(
            num_output_tokens=lambda: 5
        )
        await asyncio.Event().wait()
        yield  # pragma: no cover - never reached

    llm.check_health = check_health  # type: ignore[attr-defined]
    llm.generate = generate  # type: ignore[attr-defined]

    def total(health: dict) -> int:
        return int(health["tokens_generated"]) + int(health["tokens_in_flight"])

    async def go() -> None:
        task = asyncio.ensure_future(engine.generate("a", [1, 2, 3], SamplingSpec(max_tokens=16)))
        for _ in range(100):
            await asyncio.sleep(0.001)
            if "a" in llm.output_processor.external_req_ids:
                break
        assert total(await engine.health()) == 5
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert total(await engine.health()) == 5 and not engine._inflight and not engine._tokens_seen

    asyncio.run(go())


class _SleepLLM:
    """vLLM's ``AsyncLLM`` as the driver's GPU sleep / wake path sees it: records each call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def pause_generation(self, mode: str = "abort") -> None:
        self.calls.append(f"pause_generation({mode})")

    async def release_kv_cache_memory(self) -> None:
        self.calls.append("release_kv_cache_memory")

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep({level})")

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(f"wake_up({tags})")
        return True

    async def reset_prefix_cache(self) -> bool:
        return True

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[dict]:
        assert method == "lhr_check_fingerprint"
        return [{"ok": True}]


@pytest.mark.parametrize(
    ("keep", "sleep_calls", "wake_calls"),
    [
        (True, ["pause_generation(abort)", "release_kv_cache_memory"], ["wake_up(['kv_cache'])"]),
        (False, ["sleep(1)"], ["wake_up(['weights'])", "wake_up(['kv_cache'])"]),
    ],
)
def test_a_gpu_engine_that_keeps_its_weights_releases_and_wakes_only_its_kv_cache(
    keep: bool, sleep_calls: list[str], wake_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollout.lora_keep_base``: the base stays on the device through a hybrid deactivation (vLLM's
    ``release_kv_cache_memory``); without it, vLLM's level-1 sleep moves the weights out and back."""
    monkeypatch.setattr(VLLMEngineConfig, "on_cuda", property(lambda self: True))  # the GPU path, on this CPU host
    engine = VLLMEngine(VLLMEngineConfig(model="unused", sleep_keeps_weights=keep), "h0")
    llm = engine.llm = _SleepLLM()
    engine.state, engine._checksum = "active", "c"

    async def go() -> None:
        await engine.sleep()
        assert engine.state == "parked" and llm.calls == sleep_calls
        llm.calls.clear()
        await engine.wake_up()
        assert engine.state == "active" and llm.calls == wake_calls

    asyncio.run(go())


def test_a_hub_id_engine_starts_vllm_from_the_snapshot_directory_resolved_on_its_own_node(
    tmp_path: Any, tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replica resolves ``model`` + ``revision`` through its node's HF cache: vLLM (and the worker extension,
    whose direct reload reads the checkpoint's files) gets a directory, not the id."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from tests.hub_cache import add_to_hub_cache

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = add_to_hub_cache(tmp_path / "hf" / "hub", "lhr-test/tiny-llama", tiny_model_dir, revision="v1")
    seen: dict[str, Any] = {}

    def capture(args: Any, **kwargs: Any) -> Any:
        seen.update(model=args.model, revision=args.revision)
        raise RuntimeError("stop here")

    monkeypatch.setattr(AsyncLLM, "from_engine_args", staticmethod(capture))
    cfg = VLLMEngineConfig(model="lhr-test/tiny-llama", revision="v1", run_dir=str(tmp_path / "run"))
    engine = VLLMEngine(cfg, "r0")
    with pytest.raises(RuntimeError, match="stop here"):
        engine._build()
    assert seen == {"model": str(snapshot), "revision": None}
