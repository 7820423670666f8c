"""The engine driver: a vLLM ``AsyncLLM``-backed :class:`~lightning_hybrid_rollout.rollout.engine.RolloutEngine` whose
worker is extended by :class:`~.worker_extension.LHRWorkerExtension`; it sleeps with vLLM's sleep mode on GPU and
parks on CPU (docs/rollout.md), and its weight methods are in :class:`~.weight_updates.WeightUpdates`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.rollout.drain import DrainReport, RequestProgress, drain_requests
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.vllm.config import (
    WORKER_EXTENSION_CLS,
    EngineState,
    VLLMEngineConfig,
    engine_kwargs_for,
    short_tmp_dir,
)
from lightning_hybrid_rollout.rollout.vllm.weight_updates import WeightUpdates

__all__ = ["WORKER_EXTENSION_CLS", "VLLMEngine", "sampled_logprobs"]

logger = logging.getLogger(__name__)


def sampled_logprobs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The log-probability of each sampled token, from a vLLM ``CompletionOutput.logprobs`` (``FlatLogprobs`` or a
    list of ``{token_id: Logprob}``); NaN where the engine gave none.

    Example::

        from vllm.logprobs import FlatLogprobs, Logprob

        flat = FlatLogprobs()
        flat.append({7: Logprob(-0.5, rank=1)})
        assert sampled_logprobs(flat, [7, 9])[0] == -0.5
    """
    nan = float("nan")
    if logprobs is None:
        return [nan] * len(token_ids)
    starts = getattr(logprobs, "start_indices", None)
    if starts is not None:  # FlatLogprobs: flat lists, position i's entries in [start_indices[i], end_indices[i])
        ends, ids, values = logprobs.end_indices, logprobs.token_ids, logprobs.logprobs
        out: list[float] = []
        for i, tok in enumerate(token_ids):
            found = nan
            if i < len(starts):
                for j in range(starts[i], ends[i]):
                    if ids[j] == tok:
                        found = float(values[j])
                        break
            out.append(found)
        return out
    return [
        float(logprobs[i][tok].logprob) if i < len(logprobs) and tok in (logprobs[i] or {}) else nan
        for i, tok in enumerate(token_ids)
    ]


class VLLMEngine(WeightUpdates):
    """A :class:`~lightning_hybrid_rollout.rollout.engine.RolloutEngine` on ``vllm.v1.engine.async_llm.AsyncLLM``.

    Create it with :meth:`create` (or the constructor, then :meth:`start`) inside the process that will own it.
    The weight methods are those of :class:`~.weight_updates.WeightUpdates`.

    Args:
        config: Engine settings.
        replica_id: Name used in results, logs and errors.
        weight_version: Version of the weights in ``config.model``.
    """

    def __init__(self, config: VLLMEngineConfig, replica_id: str = "engine", weight_version: int = 0) -> None:
        self.config = config
        self.replica_id = replica_id
        self.weight_version = weight_version
        self.state: EngineState = "starting"
        self.llm: Any = None
        self.start_seconds = 0.0
        #: The engine's KV-cache capacity in tokens (blocks x block size, as its core allocated it); None before start.
        self.kv_cache_tokens: int | None = None
        self.engine_pid: int | None = None
        self._inflight: dict[str, int] = {}
        self._progress: dict[str, RequestProgress] = {}  # per in-flight request: max tokens, submission (drain)
        self._tokens_seen: dict[str, int] = {}  # per in-flight request: its most tokens health() read (never back)
        #: Keep-mode weight updates a request lived through: ``(tokens before it, new version)`` each.
        self._version_splits: dict[str, list[tuple[int, int]]] = {}
        self._resume_task: Any = None
        self._late_aborts: set[asyncio.Task[None]] = set()
        self._ready = asyncio.Event()
        self._update_lock = asyncio.Lock()
        self._tmp_dir: Path | None = None
        self._tokens_generated = 0
        self._outputs_received = 0  # vLLM outputs the frontend handed over: one per request (FINAL_ONLY)
        self._sleep_seconds: list[float] = []
        self.timings: dict[str, float] = {}
        self._init_weight_updates()

    # ---- lifecycle ------------------------------------------------------------------------------------------------
    @classmethod
    async def create(cls, config: VLLMEngineConfig, replica_id: str = "engine", weight_version: int = 0) -> VLLMEngine:
        """Build and start an engine (runs the blocking start in a thread so the event loop stays responsive)."""
        eng = cls(config, replica_id, weight_version)
        await asyncio.to_thread(eng._build)
        await eng._post_start()
        return eng

    def start(self) -> None:
        """Blocking start (for synchronous callers, e.g. a Ray actor ``__init__``); call :meth:`post_start` after."""
        self._build()

    async def post_start(self) -> None:
        """Async part of the start (initial weight verification); :meth:`create` calls it for you."""
        await self._post_start()

    def _build(self) -> None:
        t_import = time.perf_counter()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.timings["import_vllm_s"] = time.perf_counter() - t_import
        from lightning_hybrid_rollout.hub import resolve_model_path

        # a hub id resolves on this replica's node (its HF cache), so the engine and the worker see a directory
        self.config = dataclasses.replace(
            self.config, model=resolve_model_path(self.config.model, self.config.revision), revision=None
        )
        cfg = self.config
        os.environ.update(cfg.process_env())
        run_dir = Path(cfg.run_dir) if cfg.run_dir else Path(tempfile.gettempdir()) / "lhr-vllm"
        run_dir.mkdir(parents=True, exist_ok=True)
        self._tmp_dir = short_tmp_dir(run_dir / "tmp" / uuid.uuid4().hex[:8])  # this engine's; removed at shutdown
        os.environ["TMPDIR"] = str(self._tmp_dir)
        tempfile.tempdir = None  # re-read TMPDIR
        kwargs = engine_kwargs_for(cfg)
        t = time.perf_counter()
        try:
            self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except Exception as e:
            self.state = "dead"
            raise RuntimeError(
                f"replica {self.replica_id}: vLLM engine failed to start for model {cfg.model!r} "
                f"({type(e).__name__}: {e}). On CPU check kv_cache_memory_bytes fits in memory and that the model "
                f"dir has config.json + safetensors + tokenizer."
            ) from e
        self.start_seconds = time.perf_counter() - t
        self.timings["engine_start_s"] = self.start_seconds
        # the engine core reported its KV cache at start-up (absent on a stand-in engine)
        cache = getattr(getattr(self.llm, "vllm_config", None), "cache_config", None)
        if getattr(cache, "num_gpu_blocks", None) and getattr(cache, "block_size", None):
            self.kv_cache_tokens = int(cache.num_gpu_blocks) * int(cache.block_size)

    async def _post_start(self) -> None:
        t = time.perf_counter()
        info = (
            await self.llm.collective_rpc(
                "lhr_init",
                args=(self.config.verify_initial_weights, self.config.direct_reload, self.config.lora),
            )
        )[0]
        self.timings["init_rpc_s"] = time.perf_counter() - t
        self.engine_pid = int(info["pid"])
        self.engine_dtype = info.get("dtype")
        self._checksum = info.get("checksum")
        self.timings["direct_reload"] = float(bool(info.get("direct_reload")))
        if self.config.presize_staging and info.get("checkpoint_bytes"):
            await self._ensure_staging(int(info["checkpoint_bytes"]) + (1 << 20), touch=True)
        self.state = "active"
        self._ready.set()
        logger.info(
            "replica %s: vLLM engine up in %.1f s (engine pid %s, initial checksum %s)",
            self.replica_id,
            self.start_seconds,
            self.engine_pid,
            self._checksum,
        )

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine (aborts everything; the engine core is killed if it does not exit within ``timeout``)."""
        if self.llm is None:
            return
        self._ready.set()
        self.state = "stopped"
        for task in list(self._late_aborts):
            task.cancel()
        with contextlib.suppress(Exception):  # leave any broadcast group before the worker goes
            await asyncio.wait_for(self._rpc("lhr_close_receivers"), timeout)
        llm, self.llm = self.llm, None
        with contextlib.suppress(Exception):
            await asyncio.to_thread(llm.shutdown, timeout)
        self._staging.close()
        if self._tmp_dir is not None:  # vLLM leaves its IPC socket files there
            shutil.rmtree(self._tmp_dir, ignore_errors=True)

    # ---- generation -----------------------------------------------------------------------------------------------
    def _aborted_result(self, request_id: str, reason: str) -> GenerationResult:
        return GenerationResult(
            request_id=request_id,
            token_ids=[],
            logprobs=[],
            finish_reason="abort",
            weight_version=self.weight_version,
            replica_id=self.replica_id,
            info={"rejected": reason},
        )

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        """Generate one response.

        A parked (sleeping) or stopped engine answers at once with ``finish_reason="abort"``, no tokens and
        ``info["rejected"]``; during a weight update the request waits for the new weights.

        Args:
            request_id: Unique id (also what :meth:`abort` takes).
            prompt_token_ids: The prompt (including any partial-rollout prefix).
            sampling: Sampling parameters.

        Returns:
            A :class:`GenerationResult` (``logprobs[i]`` is the log-probability of ``token_ids[i]``).
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if self.state in ("parked", "stopped", "dead") or self.llm is None:
            return self._aborted_result(request_id, self.state)
        if not self._ready.is_set():
            await self._ready.wait()
            if self.state != "active":
                return self._aborted_result(request_id, self.state)
        if sampling.max_tokens <= 0:
            return GenerationResult(request_id, [], [], "length", self.weight_version, self.replica_id)
        if request_id in self._inflight:
            raise ValueError(f"replica {self.replica_id}: request id {request_id!r} is already in flight")
        params = SamplingParams(
            n=1,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=getattr(sampling, "ignore_eos", False),
            logprobs=0 if self.config.return_logprobs else None,
            # One output per request, at its end (an aborted one included, with its partial tokens): a stream of
            # per-token deltas cost the frontend ~25% more CPU per token (~10% of the replica's throughput, measured
            # on a bare CPU engine); progress is read from vLLM's request state when needed (_generated_tokens).
            output_kind=RequestOutputKind.FINAL_ONLY,
            flat_logprobs=True,
            detokenize=False,
        )
        version, salt = self.weight_version, self.cache_salt()
        # the adapter of the latest adapter-only update, read at admission (none before it: the base alone)
        lora = {"lora_request": self._lora_request} if self._lora_request is not None else {}
        self._inflight[request_id] = version
        progress = self._progress[request_id] = RequestProgress(
            sampling.max_tokens, len(prompt_token_ids), submitted_s=time.monotonic()
        )
        tokens: list[int] = []
        logprobs: list[float] = []
        finish: str | None = None
        cached = 0
        t0 = time.perf_counter()
        try:
            async for out in self.llm.generate(
                TokensPrompt(prompt_token_ids=list(prompt_token_ids), cache_salt=salt),
                params,
                request_id=request_id,
                **lora,
            ):
                self._outputs_received += 1
                cached = int(out.num_cached_tokens or 0)
                comp = out.outputs[0]
                tokens = list(comp.token_ids)  # cumulative (FINAL_ONLY)
                if self.config.return_logprobs:
                    logprobs = sampled_logprobs(comp.logprobs, tokens)
                if comp.finish_reason is not None:
                    finish = comp.finish_reason
        except BaseException:  # cancelled or failed: what it generated still counts (the running total never goes back)
            self._tokens_generated += max(len(tokens), self._tokens_seen.get(request_id, 0))
            raise
        finally:
            self._inflight.pop(request_id, None)
            self._progress.pop(request_id, None)
            self._tokens_seen.pop(request_id, None)
            splits = self._version_splits.pop(request_id, [])
        progress.observe(len(tokens), time.monotonic(), finish)
        self._tokens_generated += len(tokens)
        reason = finish if finish in ("stop", "length", "abort") else "abort"
        info: dict[str, Any] = {"seconds": time.perf_counter() - t0, "vllm_finish_reason": finish}
        if splits:
            info["version_splits"] = splits
        return GenerationResult(
            request_id=request_id,
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason=reason,  # type: ignore[arg-type]
            weight_version=version,
            replica_id=self.replica_id,
            info=info,
            cached_prompt_tokens=cached,
        )

    async def generate_group(
        self, requests: list[tuple[str, list[int], SamplingSpec]]
    ) -> list[GenerationResult | BaseException]:
        """Generate a prompt group's samples together: one :meth:`generate` per ``(request_id, prompt, sampling)``,
        all submitted at once (they share the prompt's prefill through the prefix cache, as vLLM's own ``n > 1``
        does); one outcome per request, in order (a request's error is its outcome and leaves the others running).
        """
        return list(await asyncio.gather(*(self.generate(*req) for req in requests), return_exceptions=True))

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in-flight requests (unknown ids are ignored); their ``generate`` returns the partial output."""
        live = [r for r in request_ids if r in self._inflight]
        if not live or self.llm is None:
            return
        await self._abort_ids(live)

    async def _abort_ids(self, request_ids: list[str]) -> None:
        """Abort ``request_ids`` in vLLM; one that vLLM does not know yet (its submission still on the way) is
        aborted as soon as it knows it, by a task that ends when all of them ended."""
        await self.llm.abort(request_ids)
        early = [r for r in request_ids if r in self._inflight and self._request_state(r) is None]
        if early:
            task = asyncio.get_running_loop().create_task(self._abort_when_known(early))
            self._late_aborts.add(task)
            task.add_done_callback(self._late_aborts.discard)

    async def _abort_when_known(self, request_ids: list[str]) -> None:
        waiting = set(request_ids)
        deadline = time.monotonic() + self.config.abort_timeout_s
        while waiting and time.monotonic() < deadline and self.llm is not None:
            waiting &= self._inflight.keys()
            known = [r for r in waiting if self._request_state(r) is not None]
            if known:
                await self.llm.abort(known)
                waiting.difference_update(known)
            await asyncio.sleep(0.002)

    async def drain(self, budget_s: float) -> DrainReport:
        """Let the in-flight requests that will finish within ``budget_s`` complete; abort the others.

        Each request's finish time is its remaining tokens over its own measured decode rate: the ones that will not
        make it (or have no rate yet) are aborted at once; at the deadline (the budget plus a small margin) whatever
        still runs is aborted (:func:`~lightning_hybrid_rollout.rollout.drain.drain_requests`). Returns once every
        request in flight at the start has ended (bounded by ``abort_timeout_s``), so a drain never leaves one of
        them on the engine. ``budget_s <= 0`` aborts all at once.

        Args:
            budget_s: Seconds the drain may let requests run.

        Returns:
            A :class:`~lightning_hybrid_rollout.rollout.drain.DrainReport` of the requests in flight at the start.
        """
        if self.llm is None:
            return DrainReport()
        watched = {rid: self._progress[rid] for rid in self._inflight if rid in self._progress}
        now = time.monotonic()
        for rid, progress in watched.items():
            progress.observe(self._generated_tokens(rid), now)
        report = await drain_requests(
            watched, self._inflight.__contains__, self.abort, budget_s, self.config.abort_timeout_s
        )
        logger.debug("replica %s: drain with a %.3fs budget: %s", self.replica_id, budget_s, report)
        return report

    async def _freeze_all(self) -> None:
        """Freeze every in-flight request in place (KV cache kept) and wait until the tokens the engine produced
        before the pause reached their streams, so that each request's split point is exact."""
        assert self.llm is not None
        await self.llm.pause_generation(mode="keep", clear_cache=False)
        seen, quiet = self._tokens_in_flight(), 0
        deadline = time.monotonic() + 1.0
        while quiet < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            now = self._tokens_in_flight()
            quiet = quiet + 1 if now == seen else 0
            seen = now

    def _mark_version(self, version: int) -> None:
        for rid in self._inflight:
            self._version_splits.setdefault(rid, []).append((self._generated_tokens(rid), version))

    def _request_state(self, request_id: str) -> Any | None:
        """vLLM's frontend state of ``request_id`` (its output processor's ``RequestState``), or None while vLLM does
        not know the request (its submission still on the way, or it ended)."""
        processor = getattr(self.llm, "output_processor", None)
        if processor is None:
            return None
        for internal_id in processor.external_req_ids.get(request_id, ()):
            state = processor.request_states.get(internal_id)
            if state is not None:
                return state
        return None

    def _generated_tokens(self, request_id: str) -> int:
        """Tokens ``request_id`` has generated so far, as vLLM's frontend has received them (the request's output is
        delivered only at its end); 0 for a request vLLM does not know."""
        state = self._request_state(request_id)
        if state is None or state.detokenizer is None:
            return 0
        return int(state.detokenizer.num_output_tokens())

    def _tokens_in_flight(self) -> dict[str, int]:
        """:meth:`_generated_tokens` of every in-flight request."""
        return {rid: self._generated_tokens(rid) for rid in self._inflight}

    def _tokens_in_flight_total(self) -> int:
        """The in-flight requests' tokens for :meth:`health`, each at least what it was last read at.

        vLLM forgets a request when its output is handed over, a moment before :meth:`generate` takes the output and
        counts its tokens in ``tokens_generated``: read in that moment, the request would count 0 and the replica's
        total (``tokens_generated + tokens_in_flight``, which the runtime samples at the trainer's step boundaries)
        would go back.
        """
        seen = self._tokens_seen
        for rid, tokens in self._tokens_in_flight().items():
            seen[rid] = max(tokens, seen.get(rid, 0))
        return sum(seen.values())

    async def _abort_all(self) -> int:
        """Abort every in-flight request and wait (bounded) until their streams ended."""
        live = list(self._inflight)
        if live and self.llm is not None:
            await self._abort_ids(live)
        deadline = time.monotonic() + self.config.abort_timeout_s
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        if self._inflight:
            logger.warning(
                "replica %s: %d aborted requests still in flight after %.0f s",
                self.replica_id,
                len(self._inflight),
                self.config.abort_timeout_s,
            )
        return len(live)

    # ---- sleep / wake ---------------------------------------------------------------------------------------------
    async def sleep(self) -> float:
        """Stop serving: abort in-flight requests, refuse new ones; GPU: level-1 sleep, or with
        ``sleep_keeps_weights`` the KV cache alone is released (the weights stay on the device). Returns seconds
        taken."""
        t0 = time.perf_counter()
        if self.state == "parked":
            return 0.0
        async with self._update_lock:
            self.state = "parked"
            self._ready.set()  # waiters wake up and see "parked"
            await self._abort_all()
            if self.config.sleep_mode() and self.config.sleep_keeps_weights:
                # vLLM discards the KV cache's memory only after a completed pause with no request left
                await self.llm.pause_generation(mode="abort")
                await self.llm.release_kv_cache_memory()
            elif self.config.sleep_mode():
                await self.llm.sleep(level=1)
        dt = time.perf_counter() - t0
        self._sleep_seconds.append(dt)
        return dt

    async def wake_up(self) -> float:
        """Serve again; GPU: weights first (unless they stayed), then KV cache, then the weight fingerprint is
        re-checked."""
        t0 = time.perf_counter()
        if self.state != "parked":
            return 0.0
        async with self._update_lock:
            if self.config.sleep_mode():
                if not self.config.sleep_keeps_weights:
                    await self.llm.wake_up(tags=["weights"])
                await self.llm.wake_up(tags=["kv_cache"])  # fully awake again: vLLM resumes its scheduler
                self._kv_epoch += 1  # the KV memory came back empty: nothing cached before the sleep may serve
                reset = await self.llm.reset_prefix_cache()
                logger.debug("replica %s: prefix cache reset after wake-up: %s", self.replica_id, reset)
                await self.weights_checksum()
            self.state = "active"
            self._ready.set()
        return time.perf_counter() - t0

    # ---- introspection --------------------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """State, weight version, in-flight count, checksum, engine pid, KV-cache capacity in tokens; raises if the
        vLLM engine died."""
        if self.llm is not None:
            await self.llm.check_health()
        return {
            "replica_id": self.replica_id,
            "state": self.state,
            "weight_version": self.weight_version,
            "inflight": len(self._inflight),
            "tokens_in_flight": self._tokens_in_flight_total(),
            "checksum": self._checksum,
            "engine_pid": self.engine_pid,
            "frontend_pid": os.getpid(),
            "tokens_generated": self._tokens_generated,
            "outputs_received": self._outputs_received,
            "start_seconds": self.start_seconds,
            "kv_cache_tokens": self.kv_cache_tokens,
            "timings": dict(self.timings),
            "last_update": dict(self.last_update_info),
            "weight_syncs_by_transport": dict(self.syncs_by_transport),
            "cuda_device": self._cuda_device,
            "engine_dtype": self.engine_dtype,
        }
