"""Partial rollout: how a segment a replica returns extends its sample, and how long a retried segment waits.

A sample is generated as one or more *segments* (engine requests ``<uid>:<attempt>``). An aborted segment
(deactivation, rebalance, pause) keeps what it generated and the sample continues with ``prompt + prefix`` and
``max_tokens`` reduced by it; with ``partial_rollout=False`` the prefix is thrown away and the sample restarts from
scratch. The kept segments' tokens and logprobs are concatenated and never exceed the response length.
"""

from __future__ import annotations

from collections.abc import Set

from lightning_hybrid_rollout.rollout.engine import GenerationResult
from lightning_hybrid_rollout.rollout.sample_state import SampleState


def settle_segment(
    st: SampleState,
    tokens: list[int],
    logprobs: list[float],
    result: GenerationResult,
    *,
    replica_id: str,
    overshoot: bool,
    partial_rollout: bool,
    response_length: int,
    stop_ids: Set[int],
) -> str | None:
    """Add a returned segment to its sample; the sample's finish reason, or ``None`` if it needs another segment.

    Args:
        st: The sample.
        tokens: The segment's tokens, already cut to the sample's remaining length.
        logprobs: Their logprobs.
        result: What the replica returned (finish reason and weight version).
        replica_id: The replica that produced it.
        overshoot: Whether the replica returned more tokens than asked for (a finished segment then ends the
            sample with ``"length"``).
        partial_rollout: Keep an aborted segment's tokens (else the sample restarts from scratch).
        response_length: The sample's length bound (``sampling.max_tokens``).
        stop_ids: Extra stop tokens (an aborted segment that ends with one finishes its sample).
    """
    if result.finish_reason == "abort":
        st.aborted_segments += 1
        if partial_rollout:
            st.keep_segment(tokens, logprobs, result.weight_version, replica_id)
        else:
            st.drop_segments()
        if len(st.tokens) >= response_length:
            return "length"
        if st.tokens and st.tokens[-1] in stop_ids:
            return "stop"
        return None
    st.keep_segment(tokens, logprobs, result.weight_version, replica_id, final=True)
    return "length" if overshoot else result.finish_reason


def is_refusal(result: GenerationResult, tokens: list[int]) -> bool:
    """The engine refused the request (it was parked or stopped) without generating anything.

    A routing-order bug upstream (sleep before remove, or add before wake); the engine's state is in
    ``result.info["rejected"]``.
    """
    return result.finish_reason == "abort" and not tokens and bool(result.info.get("rejected"))


def refusal_backoff_s(rejections: int) -> float:
    """Seconds to wait before retrying a sample refused ``rejections`` times (so it cannot become a hot loop)."""
    return min(0.5, 0.005 * 2 ** min(rejections, 7))


def failure_backoff_s(failures: int) -> float:
    """Seconds to wait before retrying a sample whose segments failed ``failures`` times."""
    return min(1.0, 0.02 * failures)
