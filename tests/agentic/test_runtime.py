"""EpisodeDriver inside a real Rollouter, on scripted in-process replicas: the trained sequence of a multi-turn
episode, its loss mask, tool errors reported to the model, tools off the loop, and a turn aborted mid-way and
continued elsewhere running each tool call once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, ClassVar

import pytest

from lightning_hybrid_rollout.agentic.runtime import AgenticConfig, EpisodeDriver
from lightning_hybrid_rollout.errors import AgentEnvironmentError, ConfigError, ToolError
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter

CALLS: list[tuple[int, int]] = []
LOCK = threading.Lock()


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    with LOCK:
        CALLS.append((a, b))
    return a + b


def explode(x: int) -> int:
    """Raise.

    Args:
        x: Anything.
    """
    raise ValueError("boom")


def slow(x: int) -> int:
    """Sleep past the timeout.

    Args:
        x: Anything.
    """
    time.sleep(0.5)
    return x


MEETING: list[str] = []  # "start" / "end" of each call of ``meet``
MEETING_ROOM = threading.Condition()


def meet(peers: int, seconds: float) -> str:
    """Wait until this many calls are in the tool at once.

    Args:
        peers: Calls to wait for, this one included.
        seconds: The longest wait.
    """
    with MEETING_ROOM:
        MEETING.append("start")
        MEETING_ROOM.notify_all()
        met = MEETING_ROOM.wait_for(lambda: MEETING.count("start") >= peers, seconds)
        MEETING.append("end")
    return "met" if met else "alone"


class ScriptedReplica:
    """A ``ReplicaLike`` answering turn ``k`` of an episode with ``script[k]`` (text, then the end token).

    The turn is read from the prompt: the end tokens it holds beyond the episode's first request's (two per turn:
    the model's, the tool message's). ``abort_after`` aborts the first request of each turn after that many tokens
    (as a hybrid deactivation does), so the turn continues from its prefix.
    """

    def __init__(
        self, replica_id: str, tok: Any, script: list[str], abort_after: int | None = None, delay: float = 0.0
    ) -> None:
        self.replica_id, self.tok, self.script = replica_id, tok, script
        self.is_alive = True
        self.abort_after = abort_after
        self.delay = delay
        self.requests: list[tuple[str, list[int], int]] = []
        self.aborted_turns: set[tuple[str, int]] = set()
        self.base_ends: dict[str, int] = {}
        self.hold_from: int | None = None  # from this turn on, requests are held (a checkpoint mid-episode)
        self.held: set[str] = set()
        self._holds: dict[str, asyncio.Event] = {}

    async def generate(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec) -> GenerationResult:
        self.requests.append((request_id, list(prompt_token_ids), sampling.max_tokens))
        eos = self.tok.eos_token_id
        uid = request_id.rsplit(":", 1)[0]
        base = self.base_ends.setdefault(uid, prompt_token_ids.count(eos))  # the prompt's own end tokens
        turn = (prompt_token_ids.count(eos) - base) // 2  # each turn: the model's end token, the tool message's
        full = self.tok(self.script[min(turn, len(self.script) - 1)], add_special_tokens=False)["input_ids"] + [eos]
        # the part of this turn already kept (a continuation after an abort): after the last end token/tool turn
        done = self._kept(prompt_token_ids, full)
        rest = full[done:][: sampling.max_tokens]
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.hold_from is not None and turn >= self.hold_from:
            self.held.add(uid)
            released = self._holds.setdefault(request_id, asyncio.Event())
            await released.wait()  # until aborted (the rollouter's stop): nothing generated
            return GenerationResult(request_id, [], [], "abort", 4, self.replica_id, {})
        if self.abort_after is not None and (uid, turn) not in self.aborted_turns and len(rest) > self.abort_after:
            self.aborted_turns.add((uid, turn))
            cut = rest[: self.abort_after]
            return GenerationResult(request_id, cut, [-0.5] * len(cut), "abort", 3, self.replica_id, {})
        reason = "stop" if rest and rest[-1] == eos else "length"
        return GenerationResult(request_id, rest, [-0.25] * len(rest), reason, 4, self.replica_id, {})

    def _kept(self, prompt: list[int], full: list[int]) -> int:
        for n in range(min(len(full), len(prompt)), 0, -1):
            if prompt[-n:] == full[:n]:
                return n
        return 0

    async def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            if rid in self._holds:
                self._holds[rid].set()


def run_episodes(replicas: list[Any], driver: EpisodeDriver, n: int = 2, prompts: int = 1) -> list[Any]:
    queue = MessageQueue(maxsize=n * prompts)
    rollouter = Rollouter(
        [{"prompt": "What is 2+3?"} for _ in range(prompts)],
        lambda text: [1],
        lambda sample: 0.0,
        queue,
        sampling=SamplingSpec(max_tokens=64),
        replicas=replicas,
        n_samples_per_prompt=n,
        episodes=driver,
    )
    rollouter.start()
    try:
        samples = queue.get_batch(n * prompts, timeout=30)
    finally:
        rollouter.stop()
    assert rollouter.error is None
    return samples


def call(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    CALLS.clear()


def driver_for(tok: Any, tools: list[str], **kw: Any) -> EpisodeDriver:
    return EpisodeDriver(AgenticConfig(tools=tuple(tools), **kw), tok, max_turn_tokens=64)


def test_the_trained_sequence_is_prompt_then_engine_tokens_then_rendered_tool_turns(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    script = [call(2, 3), call(5, 1), "It is 6."]
    replica = ScriptedReplica("r0", tok, script)
    driver = driver_for(tok, [add])
    [sample, _] = run_episodes([replica], driver)
    ep = sample.metadata["episode"]
    assert ep["turns"] == 3 and ep["tool_calls"] == 2 and ep["stop_reason"] == "no_tool_call"
    assert sorted(CALLS) == sorted([(2, 3), (5, 1)] * 2)  # two episodes, each call once
    # the model tokens are exactly what the engine returned, in order, under mask 1
    eos = tok.eos_token_id
    engine = [tok(text, add_special_tokens=False)["input_ids"] + [eos] for text in script]
    mask, resp = sample.loss_mask, sample.response_token_ids
    assert len(mask) == len(resp) == len(sample.response_logprobs)
    runs, cur, cur_mask = [], [], None
    for t, m in zip(resp, mask):
        if m != cur_mask and cur:
            runs.append((cur_mask, cur))
            cur = []
        cur_mask = m
        cur.append(t)
    runs.append((cur_mask, cur))
    assert [r for m, r in runs if m == 1] == engine
    assert [m for m, _ in runs] == [1, 0, 1, 0, 1]
    # the tool turns are the template's rendering: the whole sequence decodes to the conversation's rendering
    rendered = tok.apply_chat_template(ep["messages"], tokenize=False)
    decoded = tok.decode(sample.prompt_token_ids + resp, skip_special_tokens=False)
    assert decoded.rstrip("\n") == rendered.rstrip("\n")  # the template ends its last turn with a newline
    assert [m["content"] for m in ep["messages"] if m["role"] == "tool"] == ["5", "6"]
    # log-probs: the engine's on model tokens, 0 on tool tokens
    assert all(lp == -0.25 for lp, m in zip(sample.response_logprobs, mask) if m == 1)
    assert all(lp == 0.0 for lp, m in zip(sample.response_logprobs, mask) if m == 0)
    window = driver.take_window().metrics()
    assert window["rollout/turns_mean"] == 3 and window["rollout/tool_calls"] == 4
    assert 0 < window["rollout/model_token_fraction"] < 1


def test_malformed_json_a_raising_tool_and_a_hanging_tool_are_counted_and_read_by_the_model(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    script = [
        '<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>',
        '<tool_call>{"name": "explode", "arguments": {"x": 1}}</tool_call>',
        '<tool_call>{"name": "slow", "arguments": {"x": 1}}</tool_call>',
        "ok",
    ]
    driver = driver_for(tok, [add, explode, slow], tool_timeout_s=0.2)
    [sample] = run_episodes([ScriptedReplica("r0", tok, script)], driver, n=1)
    ep = sample.metadata["episode"]
    assert ep["turns"] == 4 and ep["tool_errors"] == 3
    tool_texts = [m["content"] for m in ep["messages"] if m["role"] == "tool"]
    assert "JSON" in tool_texts[0] or "json" in tool_texts[0].lower()
    assert "ValueError: boom" in tool_texts[1]
    assert "timed out" in tool_texts[2]
    assert driver.take_window().metrics()["rollout/tool_errors"] == 3


def test_each_turn_aborted_mid_way_continues_from_its_prefix_and_each_tool_runs_once(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    script = [call(2, 3), call(5, 1), "It is 6."]
    hybrid = ScriptedReplica("h0", tok, script, abort_after=5)
    driver = driver_for(tok, [add])
    [sample] = run_episodes([hybrid], driver, n=1)
    ep = sample.metadata["episode"]
    assert ep["turns"] == 3 and CALLS == [(2, 3), (5, 1)]
    assert sample.num_segments == 6  # every turn: an aborted segment, then its continuation
    assert ep["weight_versions"] == [3, 4, 3, 4, 3, 4] and sample.min_weight_version == 3
    engine = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in script]
    model = [t for t, m in zip(sample.response_token_ids, sample.loss_mask) if m == 1]
    assert model == [t for turn in engine for t in turn]


def test_a_slow_tool_does_not_hold_the_loop_other_episodes_keep_generating(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    MEETING.clear()
    # each of four episodes calls a sync tool that returns only once all four calls are in it at once: possible
    # only if the calls run in the pool together, not one after another on the loop
    wait = '<tool_call>{"name": "meet", "arguments": {"peers": 4, "seconds": 3.0}}</tool_call>'
    replica = ScriptedReplica("r0", tok, [wait, "done"])
    driver = driver_for(tok, [meet], tool_timeout_s=10)
    samples = run_episodes([replica], driver, n=4)
    assert len(samples) == 4
    assert MEETING == ["start"] * 4 + ["end"] * 4, MEETING
    answers = [m["content"] for s in samples for m in s.metadata["episode"]["messages"] if m["role"] == "tool"]
    assert answers == ["met"] * 4, answers


def test_bad_input_is_one_line_before_anything_starts(smollm2_tokenizer) -> None:
    with pytest.raises(ConfigError, match="max_turns must be >= 1"):
        AgenticConfig(tools=("x.py:f",), max_turns=0)

    def undocumented(a: int) -> int:
        return a

    with pytest.raises(ToolError, match="undocumented"):
        driver_for(smollm2_tokenizer, [undocumented])
    with pytest.raises(AgentEnvironmentError, match=r"no_such_env\.py") as err:
        EpisodeDriver(AgenticConfig(environment="no_such_env.py:Env"), smollm2_tokenizer, max_turn_tokens=8)
    assert "\n" not in str(err.value)


class Ledger:
    """TRL's convention, with ``state_dict``/``load_state_dict``: its tool appends to a list that is its state."""

    made: ClassVar[list[Ledger]] = []

    def __init__(self) -> None:
        self.entries: list[int] = []
        Ledger.made.append(self)

    def reset(self, **row: Any) -> None:
        self.entries = []

    def add(self, a: int, b: int) -> int:
        """Add two integers and record the sum.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.entries.append(a + b)
        CALLS.append((a, b))
        return a + b

    def get_reward(self) -> float:
        return float(self.entries == [5, 6])

    def state_dict(self) -> dict[str, Any]:
        return {"entries": list(self.entries)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = list(state["entries"])


class ForgetfulLedger(Ledger):
    """The same without a saved state: an episode in flight at a checkpoint restarts."""

    state_dict = None  # type: ignore[assignment]


class UnloadableLedger(Ledger):
    """Saves its state, but cannot load it back (a corrupt or incompatible saved state)."""

    closed: ClassVar[int] = 0

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise ValueError("saved by another version")

    def close(self) -> None:
        UnloadableLedger.closed += 1


def _checkpoint_mid_episode(tok: Any, config: dict[str, Any]) -> tuple[list[Any], EpisodeDriver, int]:
    """Run 2 episodes until both made a tool call, checkpoint, resume in a new rollouter to the end; the samples,
    the second driver and the tool calls made before the checkpoint."""
    script = [call(2, 3), call(5, 1), "It is 6."]
    kwargs: dict[str, Any] = {"sampling": SamplingSpec(max_tokens=64), "n_samples_per_prompt": 2}
    replica = ScriptedReplica("r0", tok, script)
    replica.hold_from = 1  # both episodes stop in their second turn, their first tool call made
    first = Rollouter(
        [{"prompt": "What is 2+3?"}], lambda t: [1], lambda s: 0.0, MessageQueue(maxsize=2), replicas=[replica],
        episodes=EpisodeDriver(AgenticConfig(**config), tok, max_turn_tokens=64), **kwargs,
    )  # fmt: skip
    first.start()
    deadline = time.monotonic() + 10
    while len(replica.held) < 2:  # both episodes past their first tool call, generating their second turn
        assert time.monotonic() < deadline
        time.sleep(0.01)
    first.stop()
    state = first.state_dict()
    [pending] = state["pending_groups"]
    assert all(s["episode"]["turns"] == 1 and s["result"] is None for s in pending["samples"])
    calls_at_checkpoint = len(CALLS)
    driver = EpisodeDriver(AgenticConfig(**config), tok, max_turn_tokens=64)
    queue = MessageQueue(maxsize=2)
    resumed = ScriptedReplica("r1", tok, script)
    resumed.base_ends = replica.base_ends  # where each episode's turns start: read from its first request
    second = Rollouter(
        [], lambda t: [1], lambda s: 0.0, queue, replicas=[resumed], episodes=driver,
        **kwargs,
    )  # fmt: skip
    second.load_state_dict(state)
    second.start()
    try:
        samples = queue.get_batch(2, timeout=30)
    finally:
        second.stop()
    assert second.error is None
    return samples, driver, calls_at_checkpoint


def test_an_episode_in_flight_at_a_checkpoint_continues_at_its_turn_each_tool_call_once(smollm2_tokenizer) -> None:
    Ledger.made.clear()
    env = f"{__name__}:Ledger"
    samples, driver, _ = _checkpoint_mid_episode(smollm2_tokenizer, {"environment": env})
    assert driver.episodes_restarted == 0
    assert sorted(CALLS) == sorted([(2, 3), (5, 1)] * 2)  # each call once across the two runs
    for sample in samples:
        ep = sample.metadata["episode"]
        assert ep["turns"] == 3 and ep["tool_calls"] == 2 and ep["env_reward"] == 1.0  # the env's state came back
        assert [m for m, _ in _runs(sample.loss_mask)] == [1, 0, 1, 0, 1]
        assert "state" not in ep  # the checkpoint's copy is dropped from the finished sample


def test_an_episode_whose_environment_cannot_be_saved_restarts_from_its_prompt_counted(smollm2_tokenizer) -> None:
    env = f"{__name__}:ForgetfulLedger"
    samples, driver, before = _checkpoint_mid_episode(smollm2_tokenizer, {"environment": env})
    assert driver.episodes_restarted == 2 and driver.take_window().metrics()["rollout/episodes_restarted"] == 2
    assert len(CALLS) == before + 4  # the first run's calls, then the restarted episodes' own, all of them
    for sample in samples:  # restarted whole: three turns from the prompt, nothing of the first run's left
        assert sample.metadata["episode"]["turns"] == 3
        assert [m for m, _ in _runs(sample.loss_mask)] == [1, 0, 1, 0, 1]


def test_an_episode_whose_environment_cannot_load_its_state_restarts_counted_the_run_goes_on(
    smollm2_tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    UnloadableLedger.closed = 0
    env = f"{__name__}:UnloadableLedger"
    samples, driver, before = _checkpoint_mid_episode(smollm2_tokenizer, {"environment": env})
    assert driver.episodes_restarted == 2 and driver.take_window().metrics()["rollout/episodes_restarted"] == 2
    assert len(CALLS) == before + 4  # the restarted episodes' own calls, all of them
    assert all(s.metadata["episode"]["turns"] == 3 for s in samples)
    assert UnloadableLedger.closed == 2 + 2  # the unusable restored instances, then the episodes' own at their end
    assert "cannot load its saved state (ValueError: saved by another version)" in caplog.text


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for m in mask:
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + 1)
        else:
            out.append((m, 1))
    return out


def test_every_turn_of_an_episode_is_routed_to_the_replica_that_served_its_first(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    script = [call(2, 3), call(5, 1), "It is 6."]
    # r0 slow, r1 fast: least-loaded routing alone would move r0's episodes to r1 after their first turn
    replicas = [ScriptedReplica("r0", tok, script, delay=0.3), ScriptedReplica("r1", tok, script, delay=0.01)]
    samples = run_episodes(replicas, driver_for(tok, [add]), n=4, prompts=2)
    served = {s.uid: {r.replica_id for r in replicas for rid, _, _ in r.requests if rid.startswith(f"{s.uid}:")}
              for s in samples}  # fmt: skip
    assert all(len(ids) == 1 for ids in served.values()), served
    assert {i for ids in served.values() for i in ids} == {"r0", "r1"}  # and the episodes spread over both
    assert all(s.metadata["episode"]["turns"] == 3 for s in samples)


def test_each_tool_call_and_environment_call_is_one_span_with_its_status(smollm2_tokenizer) -> None:
    tok = smollm2_tokenizer
    spans: list[tuple[str, float, float, dict[str, Any]]] = []

    def record(name: str, start: float, end: float, args: Any) -> None:
        spans.append((name, start, end, dict(args)))

    script = [
        call(2, 3),
        '<tool_call>{"name": "explode", "arguments": {"x": 1}}</tool_call>',
        '<tool_call>{"name": "slow", "arguments": {"x": 1}}</tool_call>',
        "ok",
    ]
    driver = driver_for(tok, [add, explode, slow], tool_timeout_s=0.2)
    driver.on_span = record
    [sample] = run_episodes([ScriptedReplica("r0", tok, script)], driver, n=1)
    assert [s[0] for s in spans] == ["add", "explode", "slow"]
    assert len(spans) == sample.metadata["episode"]["tool_calls"]
    assert all(end >= start for _, start, end, _ in spans)
    assert [a["status"] for *_, a in spans] == ["ok", "error", "timeout"]
    assert [a["turn"] for *_, a in spans] == [1, 2, 3]
    assert {a["episode"] for *_, a in spans} == {sample.uid} and {a["kind"] for *_, a in spans} == {"tool"}
    assert [a.get("error") for *_, a in spans] == [None, "raised", "timeout"]  # the ToolRunner's error kinds

    spans.clear()  # an environment: its reset and each step
    env = EpisodeDriver(
        AgenticConfig(environment="tests.agentic.my_envs:make", environment_kwargs={"env_id": "guess"}),
        tok,
        max_turn_tokens=64,
        on_span=record,
    )
    [sample] = run_episodes([ScriptedReplica("r0", tok, ["1", "3"])], env, n=1)
    assert [s[0] for s in spans] == ["env.reset", "env.step", "env.step"]
    assert [a["turn"] for *_, a in spans] == [0, 1, 2] and {a["kind"] for *_, a in spans} == {"environment"}
    assert all(a["status"] == "ok" and end >= start for _, start, end, a in spans)
