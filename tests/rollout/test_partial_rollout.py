"""settle_segment: a segment an engine continued across keep-mode weight updates becomes one segment per version."""

from __future__ import annotations

from typing import Any

from lightning_hybrid_rollout.rollout.engine import GenerationResult
from lightning_hybrid_rollout.rollout.partial_rollout import settle_segment, version_pieces
from lightning_hybrid_rollout.rollout.sample_state import SampleState


def result(tokens: list[int], reason: str, version: int, splits: list[tuple[int, int]] | None = None) -> Any:
    info = {"version_splits": splits} if splits else {}
    return GenerationResult("u:0", tokens, [float(-t) for t in tokens], reason, version, "standalone-0", info)


def settle(st: SampleState, res: GenerationResult, response_length: int = 100) -> str | None:
    return settle_segment(
        st,
        list(res.token_ids),
        list(res.logprobs),
        res,
        replica_id="standalone-0",
        overshoot=False,
        partial_rollout=True,
        response_length=response_length,
        stop_ids=set(),
    )


def test_a_segment_across_two_keep_mode_updates_is_kept_as_three_segments_of_their_versions() -> None:
    st = SampleState(uid="u", group_id="g", index=0, seed=0)
    reason = settle(st, result(list(range(10)), "length", 3, [(4, 4), (7, 5)]), response_length=10)
    assert reason == "length"
    assert st.tokens == list(range(10)) and st.logprobs == [float(-t) for t in range(10)]
    assert st.versions == [3, 4, 5] and st.replica_ids == ["standalone-0"] * 3
    sample_versions = (min(st.versions), max(st.versions), len(st.versions))
    assert sample_versions == (3, 5, 3)


def test_an_update_before_any_token_or_after_the_cut_leaves_no_empty_or_phantom_segment() -> None:
    assert [(t, v) for t, _, v in version_pieces([1, 2], [0.0, 0.0], result([1, 2], "stop", 3, [(0, 4)]))] == [
        ([1, 2], 4)
    ]
    # the segment was cut to the sample's remaining length before the update took effect
    pieces = version_pieces([1, 2, 3], [0.0] * 3, result([1, 2, 3, 4, 5], "length", 3, [(4, 4)]))
    assert [(t, v) for t, _, v in pieces] == [([1, 2, 3], 3), ([], 4)]
    st = SampleState(uid="u", group_id="g", index=0, seed=0)
    settle(st, result([9], "abort", 3, [(1, 4)]))  # an aborted segment: the empty tail is not kept
    assert st.versions == [3] and st.tokens == [9]


def test_a_segment_no_update_crossed_is_one_segment() -> None:
    st = SampleState(uid="u", group_id="g", index=0, seed=0)
    assert settle(st, result([5, 6], "stop", 7)) == "stop"
    assert st.versions == [7] and st.tokens == [5, 6]
