"""Multi-turn episodes on REAL vLLM-on-CPU replicas in Ray (slow): a hybrid deactivation in the middle of episodes
moves them, at their current turn, to the standalone replica; every environment step runs exactly once; the trained
sequence is the prompt, the engine's tokens of each turn (as the replicas returned them) and the environment's
turns as the chat template renders them, with the loss mask on the engine's tokens only.

Uses the session fixtures of ``tests/conftest.py`` (``r0`` standalone, ``r1`` hybrid, the tiny model).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from lightning_hybrid_rollout.agentic.runtime import AgenticConfig, EpisodeDriver
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter

pytestmark = pytest.mark.slow

#: Every environment made in this module, in order (the test maps each episode to its own by the texts it read).
ENVS: list[StepCounter] = []
_LOCK = threading.Lock()


class StepCounter:
    """Gymnasium's convention: answers 3 model turns, then says done; records every step it was given."""

    def __init__(self, steps: int = 3) -> None:
        self.steps = steps
        self.seen: list[str] = []
        with _LOCK:
            ENVS.append(self)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return "count", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.seen.append(action)
        done = len(self.seen) >= self.steps
        return f"step {len(self.seen)}", float(done), done, False, {}


class Recorder:
    """Driver-side wrapper of a replica handle recording each request's prompt and result (a ``ReplicaLike``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.replica_id = inner.replica_id
        self.calls: dict[str, dict[str, Any]] = {}
        self.forbidden = False
        self.violations: list[str] = []

    @property
    def is_alive(self) -> bool:
        return self.inner.is_alive

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        if self.forbidden:
            self.violations.append(request_id)
        call: dict[str, Any] = {"prompt": list(prompt_token_ids), "result": None}
        self.calls[request_id] = call
        call["result"] = await self.inner.generate(request_id, prompt_token_ids, sampling)
        return call["result"]

    async def abort(self, request_ids: list[str]) -> None:
        await self.inner.abort(request_ids)


def _ray_call(handle: Any, method: str, *args: Any) -> Any:
    import ray

    return ray.get(getattr(handle.actor, method).remote(*args), timeout=120)


def render(tok: Any, driver: EpisodeDriver, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
    return tok.apply_chat_template(
        messages, chat_template=driver.chat_template, add_generation_prompt=generation_prompt, tokenize=False
    )


def test_a_hybrid_deactivation_mid_episode_finishes_it_on_the_standalone_replica_each_step_run_once(
    vllm_replicas, tiny_model_dir
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    r0, r1 = vllm_replicas
    rec0, rec1 = Recorder(r0), Recorder(r1)
    ENVS.clear()
    driver = EpisodeDriver(
        AgenticConfig(environment=f"{__name__}:StepCounter", max_turns=6, max_episode_tokens=400),
        tok,
        max_turn_tokens=24,
    )
    n_prompts, n = 6, 2
    queue = MessageQueue(maxsize=n_prompts * n)
    ro = Rollouter(
        [{"prompt": f"{i}+{i}="} for i in range(n_prompts)],
        lambda text: tok(text)["input_ids"],
        lambda s: s.metadata["episode"]["env_reward"],
        queue,
        sampling=SamplingSpec(max_tokens=24, temperature=1.0),
        replicas=[rec0, rec1],
        n_samples_per_prompt=n,
        concurrent_samples_per_replica=6,
        episodes=driver,
    )
    try:
        with ro:
            t0 = time.monotonic()
            # wait until an episode past its first turn is generating on r1: a deactivation then lands mid-episode
            while not any(
                int(rid.rsplit(":", 1)[1]) > 0 and call["result"] is None for rid, call in list(rec1.calls.items())
            ) or not any(env.seen for env in ENVS):
                assert time.monotonic() - t0 < 120, f"r1 never served a later turn: {ro.error!r} {list(rec1.calls)}"
                time.sleep(0.005)
            ro.remove_replicas(["r1"])  # the seed's deactivation order: remove -> abort -> sleep
            rec1.forbidden = True
            routed_before = len(rec1.calls)
            ro.abort_replicas(["r1"])
            _ray_call(r1, "sleep")
            got = queue.get_batch(n_prompts * n, timeout=300)
            assert len(rec1.calls) == routed_before and not rec1.violations
    finally:
        _ray_call(r1, "wake_up")  # leave the shared replica active
    assert ro.error is None and len(got) == n_prompts * n and len(ENVS) == n_prompts * n

    moved = []
    for sample in got:
        ep = sample.metadata["episode"]
        said = [m["content"] for m in ep["messages"] if m["role"] == "assistant"]
        mine = [env for env in ENVS if env.seen == said[: len(env.seen)] and len(env.seen) == ep["turns"]]
        # the environment stepped once per model turn: never twice for a turn aborted and continued elsewhere
        assert ep["stop_reason"] == "environment_done" and ep["turns"] == 3, ep
        assert len(mine) >= 1 and all(len(env.seen) == 3 for env in ENVS)
        assert sample.reward == 1.0

        # the chain of requests: each one's prompt is the episode so far; the model tokens are what they returned
        calls = {}
        for rec in (rec0, rec1):
            for rid, call in rec.calls.items():
                if rid.rsplit(":", 1)[0] == sample.uid:
                    calls[int(rid.rsplit(":", 1)[1])] = (rec.replica_id, call)
        sequence = sample.prompt_token_ids + sample.response_token_ids
        engine: list[int] = []
        replicas = []
        for attempt in sorted(calls):
            replica_id, call = calls[attempt]
            prompt = call["prompt"]
            assert sequence[: len(prompt)] == prompt, f"{sample.uid}:{attempt} was not sent the episode so far"
            result = call["result"]
            engine += list(result.token_ids)
            if result.token_ids:
                replicas.append(replica_id)
        model = [t for t, m in zip(sample.response_token_ids, sample.loss_mask) if m == 1]
        assert model == engine
        # each environment turn: what the template renders after the model turn's own text, up to the next
        # generation prompt (the tiny tokenizer has no newline, so this compares tokens, not decoded text)
        env_runs, run = [], []
        for t, m in zip(sample.response_token_ids, sample.loss_mask):
            if m == 0:
                run.append(t)
            elif run:
                env_runs.append(run)
                run = []
        messages = ep["messages"]
        expected = []
        for j, message in enumerate(messages):
            if message["role"] != "user" or j == 0 or messages[j - 1]["role"] != "assistant":
                continue
            before = render(tok, driver, messages[:j], generation_prompt=False)
            cut = before.rfind(messages[j - 1]["content"]) + len(messages[j - 1]["content"])
            after = render(tok, driver, messages[: j + 1], generation_prompt=True)
            expected.append(tok(after[cut:], add_special_tokens=False)["input_ids"])
        assert env_runs == expected and len(expected) == 2
        if "r1" in replicas and replicas[-1] == "r0":
            moved.append(sample.uid)
    assert moved, "no episode continued on the standalone replica after the deactivation"
