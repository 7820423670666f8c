"""The checkpoint form of in-flight samples: plain data, a snapshot, and continued from its prefix after a restore
(into copies of its own: generating after a restore does not change the loaded state)."""

from __future__ import annotations

import json
import time

from lightning_hybrid_rollout.rollout.engine import SamplingSpec
from lightning_hybrid_rollout.rollout.message_queue import MessageQueue
from lightning_hybrid_rollout.rollout.rollouter import Rollouter
from lightning_hybrid_rollout.rollout.sample import Sample
from lightning_hybrid_rollout.rollout.sample_state import PromptGroup
from tests.rollout.fakes import FakeReplica, char_tokenize, expected_logprob, expected_token, wait_for

P = 5  # prompt length: prompts are "p0000".."p9999"


def _group() -> PromptGroup:
    group = PromptGroup.admit(
        7, "p0007", char_tokenize("p0007"), {"answer": 7, "lhr_prompt": {"index": 7}}, n_samples=2, base_seed=3,
        param_version=1,
    )  # fmt: skip
    a, b = group.samples
    a.keep_segment([11, 12], [-0.1, -0.2], version=1, replica_id="s0")
    a.keep_segment([13], [-0.3], version=2, replica_id="h0")
    a.aborted_segments, a.attempts = 2, 3
    b.keep_segment([21, 22, 23], [-1.0, -2.0, -3.0], version=2, replica_id="s0", final=True)
    b.result = Sample(uid=b.uid, group_id=b.group_id, prompt=group.prompt, prompt_token_ids=group.prompt_token_ids,
                      response_token_ids=[21, 22, 23], response_logprobs=[-1.0, -2.0, -3.0], reward=1.0,
                      min_weight_version=2, max_weight_version=2, replica_ids=["s0"])  # fmt: skip
    return group


def test_the_checkpoint_form_keeps_prompt_prefix_logprobs_and_each_segments_version_as_plain_data() -> None:
    group = _group()
    state = group.to_state()
    back = PromptGroup.from_state(json.loads(json.dumps(state)))  # plain data: survives JSON, so any serializer
    assert (back.group_id, back.prompt, back.prompt_token_ids) == ("g7", "p0007", char_tokenize("p0007"))
    assert back.metadata == {"answer": 7, "lhr_prompt": {"index": 7}}
    a, b = back.samples
    assert (a.uid, a.index, a.seed) == ("g7-0", 0, 3 + 7 * 2)
    assert (a.tokens, a.logprobs) == ([11, 12, 13], [-0.1, -0.2, -0.3])
    assert (a.versions, a.replica_ids) == ([1, 2], ["s0", "h0"])  # per segment
    assert (a.aborted_segments, a.attempts, a.admitted_version, a.started_at) == (2, 3, 1, None)
    assert a.result is None
    assert b.result == group.samples[1].result  # a finished sample of an unfinished group, reward included


def test_the_checkpoint_form_is_a_snapshot_of_the_live_state() -> None:
    group = _group()
    state = group.to_state()
    frozen = json.dumps(state)
    live = group.samples[0]
    live.keep_segment([14], [-0.4], version=3, replica_id="s0")  # the loop goes on after the snapshot
    group.samples[1].result.response_token_ids.append(99)  # type: ignore[union-attr]
    assert json.dumps(state) == frozen


def test_a_restored_in_flight_sample_continues_from_its_prefix_under_its_saved_versions() -> None:
    """Run 1 (replica ``a``, weights v1) is stopped mid-generation; run 2 (replica ``b``, v5) restores its JSON'd
    state: each in-flight sample asks for ``prompt + prefix`` with ``max_tokens`` reduced, and keeps its first
    segments' tokens, logprobs, replicas and weight versions."""
    max_tokens = 12
    a = FakeReplica("a", token_latency=(0.002, 0.004), seed=1, weight_version=1)
    q1 = MessageQueue(maxsize=64)
    prompts = [{"prompt": f"p{i:04d}", "answer": i} for i in range(6)]
    ro = Rollouter(prompts, char_tokenize, lambda s: 0.0, q1, sampling=SamplingSpec(max_tokens=max_tokens),
                   replicas=[a], n_samples_per_prompt=2, max_required_samples=12,
                   concurrent_samples_per_replica=4)  # fmt: skip
    ro.start()
    wait_for(a.has_partial_request)
    ro.stop()  # aborts the running segments: what they generated is kept as prefixes
    frozen = json.dumps(ro.state_dict())
    state = json.loads(frozen)
    saved = {s["uid"]: s for g in state["pending_groups"] for s in g["samples"] if s["result"] is None}
    with_prefix = {uid: s for uid, s in saved.items() if s["tokens"]}
    assert with_prefix, saved

    b = FakeReplica("b", weight_version=5)
    q2 = MessageQueue(maxsize=64)
    ro2 = Rollouter(prompts[ro.total_prompts :], char_tokenize, lambda s: 0.0, q2,
                    sampling=SamplingSpec(max_tokens=max_tokens), replicas=[b], n_samples_per_prompt=2,
                    max_required_samples=12, concurrent_samples_per_replica=4)  # fmt: skip
    ro2.load_state_dict(state)
    got: dict[str, Sample] = {}
    with ro2:
        deadline = time.monotonic() + 10
        while not set(saved) <= set(got) and time.monotonic() < deadline:
            got.update((s.uid, s) for s in q2.get_batch(2, timeout=10))
    assert set(saved) <= set(got)
    assert json.dumps(state) == frozen  # the restored samples own their lists: the loaded state is left as it was
    calls = {c.request_id.rsplit(":", 1)[0]: c for c in b.calls}
    for uid, s in with_prefix.items():
        n = len(s["tokens"])
        assert (calls[uid].prompt_len, calls[uid].max_tokens) == (P + n, max_tokens - n)  # partial rollout
        sample = got[uid]
        assert sample.response_token_ids[:n] == s["tokens"] and sample.response_logprobs[:n] == s["logprobs"]
        assert sample.response_token_ids == [expected_token(P + i) for i in range(max_tokens)]
        assert sample.response_logprobs == [expected_logprob(P + i) for i in range(max_tokens)]
        assert sample.replica_ids == [*s["replica_ids"], "b"] and sample.num_segments == len(s["versions"]) + 1
        assert (sample.min_weight_version, sample.max_weight_version) == (1, 5)
