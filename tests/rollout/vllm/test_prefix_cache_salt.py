"""The driver's prefix-cache salt per weight version, without an engine: what each request is submitted with, and what
a weight update asks of vLLM's cache (the real engine's behaviour: tests/rollout/test_prefix_cache_versions.py)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig
from lightning_hybrid_rollout.rollout.vllm.driver import VLLMEngine


class _FakeLLM:
    """vLLM's ``AsyncLLM`` as the driver's requests and weight updates see it.

    Args:
        reset_ok: What ``reset_prefix_cache`` answers (vLLM refuses while a request holds KV blocks).
        cached: ``num_cached_tokens`` of every output.
    """

    def __init__(self, reset_ok: bool = True, cached: int = 0) -> None:
        self.output_processor = SimpleNamespace(external_req_ids={}, request_states={})
        self.reset_ok, self.cached = reset_ok, cached
        self.prompts: dict[str, dict[str, Any]] = {}
        self.resets: list[bool] = []  # reset_running_requests of each reset_prefix_cache
        self.aborted: set[str] = set()
        self._abort = asyncio.Event()

    async def generate(self, prompt: dict[str, Any], params: Any, request_id: str):
        """One output: two tokens at once, or, for a request id starting with "hold", what it had when aborted."""
        self.prompts[request_id] = dict(prompt)
        self.output_processor.external_req_ids[request_id] = [request_id]
        self.output_processor.request_states[request_id] = SimpleNamespace(detokenizer=None)
        if request_id.startswith("hold"):
            while request_id not in self.aborted:
                await asyncio.sleep(0.001)
        del self.output_processor.request_states[request_id], self.output_processor.external_req_ids[request_id]
        finish = "abort" if request_id in self.aborted else "length"
        yield SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=[5, 6], logprobs=None, finish_reason=finish)],
            num_cached_tokens=self.cached,
        )

    async def abort(self, request_ids: list[str]) -> None:
        self.aborted.update(request_ids)

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        return [{"checksum": "c"} if method == "lhr_finish_update" else {}]

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.resets.append(reset_running_requests)
        return self.reset_ok

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        pass

    async def resume_generation(self) -> None:
        pass


def _engine(llm: _FakeLLM) -> VLLMEngine:
    engine = VLLMEngine(VLLMEngineConfig(model="unused", abort_timeout_s=5.0), "r0", weight_version=3)
    engine.llm = llm
    engine.state = "active"
    engine._ready.set()
    return engine


async def _salt(engine: VLLMEngine, llm: _FakeLLM, request_id: str) -> str:
    await engine.generate(request_id, [1, 2, 3], SamplingSpec(max_tokens=2))
    return str(llm.prompts[request_id]["cache_salt"])


async def _update(engine: VLLMEngine, version: int, keep: bool = False) -> None:
    await engine.begin_weight_update(version, keep=keep)
    await engine.finish_weight_update()


def test_the_salt_stays_within_a_version_and_changes_with_every_update_even_when_vllm_refuses_the_reset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm = _FakeLLM(reset_ok=False)  # what vLLM answers while a request holds KV blocks
    engine = _engine(llm)

    async def go() -> list[str]:
        salts = [await _salt(engine, llm, "a"), await _salt(engine, llm, "b")]
        await _update(engine, 4)
        salts.append(await _salt(engine, llm, "c"))
        await _update(engine, 4)  # the same version number pushed again (other weights)
        salts.append(await _salt(engine, llm, "d"))
        await engine.begin_weight_update(5)
        await engine.abort_weight_update()  # half-loaded: the weights are neither the old nor the new ones
        salts.append(await _salt(engine, llm, "e"))
        return salts

    with caplog.at_level(logging.DEBUG, logger="lightning_hybrid_rollout.rollout.vllm.weight_updates"):
        a, b, c, d, e = asyncio.run(go())
    assert a == b  # one version: the prefix cache stays useful
    assert len({a, c, d, e}) == 4  # each update: no KV of other weights is ever reused
    assert "v4" in c and "v4" in d
    assert llm.resets == [False, False]  # abort mode: a best-effort reset after each finished load
    ours = [r for r in caplog.records if r.name.startswith("lightning_hybrid_rollout")]
    assert any("prefix cache reset after v4: False" in r.getMessage() and r.levelno == logging.DEBUG for r in ours)
    assert not any(r.levelno >= logging.WARNING for r in ours)


def test_keep_mode_has_vllm_recompute_the_frozen_requests_and_aborts_them_if_it_cannot() -> None:
    async def go(reset_ok: bool) -> tuple[_FakeLLM, Any]:
        llm = _FakeLLM(reset_ok=reset_ok)
        engine = _engine(llm)
        frozen = asyncio.ensure_future(engine.generate("hold-0", [1, 2, 3], SamplingSpec(max_tokens=2)))
        while "hold-0" not in llm.prompts:
            await asyncio.sleep(0.001)
        await _update(engine, 4, keep=True)
        if reset_ok:
            llm.aborted.add("hold-0")  # end it (the fake never decodes a frozen request)
        return llm, await frozen

    llm, _ = asyncio.run(go(reset_ok=True))
    assert llm.resets == [True] and llm.aborted == {"hold-0"}  # preempted (recomputed), not aborted by the driver
    llm, result = asyncio.run(go(reset_ok=False))
    assert llm.resets == [True] and result.finish_reason == "abort"  # it continues from its prefix instead
    assert result.info["version_splits"] == [(0, 4)]


def test_the_result_carries_the_prompt_tokens_the_prefix_cache_served() -> None:
    llm = _FakeLLM(cached=128)
    engine = _engine(llm)
    result = asyncio.run(engine.generate("a", list(range(200)), SamplingSpec(max_tokens=2)))
    assert result.cached_prompt_tokens == 128 and result.token_ids == [5, 6]
