"""Partial rollout: a sample is generated segment by segment, and an aborted segment is continued, not lost.

:class:`SampleGenerator` runs a sample's segments and :func:`settle_segment` holds the rule for one returned segment
(kept, continued from its prefix, retried after a dead replica or an error, or split per weight version after a
keep-mode update); the rules are described in docs/rollout.md, "Partial rollout".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence, Set
from typing import Protocol, runtime_checkable

from lightning_hybrid_rollout.errors import RolloutError, is_replica_dead_error
from lightning_hybrid_rollout.rollout.engine import GenerationResult, SamplingSpec, generate_group
from lightning_hybrid_rollout.rollout.load_balancer import LoadBalancer, ReplicaLike
from lightning_hybrid_rollout.rollout.role_window import RoleProduction, replica_role
from lightning_hybrid_rollout.rollout.sample_state import PromptGroup, SampleState

log = logging.getLogger("lightning_hybrid_rollout.rollout.rollouter")  # the Rollouter's records keep their logger


@runtime_checkable
class EpisodeRunner(Protocol):
    """Turns a sample into a multi-turn episode (:class:`~lightning_hybrid_rollout.agentic.runtime.EpisodeDriver`):
    the generator asks it for the episode's prompt, each model turn's token limit, and what follows a model turn."""

    async def begin(self, st: SampleState, group: PromptGroup) -> None:
        """Start ``st``'s episode (its environment reset, its prompt in ``st.prompt_ids``); a no-op once started."""
        ...

    def turn_limit(self, st: SampleState) -> int:
        """The most tokens the current model turn may still grow by (0: the turn or the episode is out of room)."""
        ...

    async def after_turn(self, st: SampleState, reason: str) -> str | None:
        """Run what follows the model turn that just finished with ``reason``: ``None`` when tool/environment tokens
        were appended and the next model turn follows, else the sample's finish reason."""
        ...


class SegmentHost(Protocol):
    """What the segments of a sample read from the rollouter (its settings, read live) and the counters they add to."""

    name: str
    sampling: SamplingSpec
    load_balancer: LoadBalancer
    partial_rollout: bool
    no_replica_timeout_s: float | None
    max_segment_failures: int
    aborted_segments: int
    retried_segments: int
    dead_replica_retries: int
    failed_segments: int
    rejected_segments: int
    replica_calls: int
    episodes: EpisodeRunner | None


class SampleGenerator:
    """Generates a prompt group's samples segment by segment until they finish (one :meth:`generate` per batch).

    A *batch* is some unfinished samples of one prompt group (all of them, unless the in-flight cap had room for
    fewer). Each round sends the batch's unfinished samples to ONE replica in ONE call
    (:func:`~lightning_hybrid_rollout.rollout.engine.generate_group`: one Ray round trip for the group, and the
    engine shares the prompt's prefill), then settles every returned segment on its own sample; the samples that
    need another segment (aborted, failed, refused) go on together in the next round.

    With ``host.episodes`` each sample is a multi-turn episode and runs on its own (an episode waiting on a tool
    must not hold the others back), routed sticky per episode (its uid: each turn extends the replica's cached
    prefix); a model turn that finishes is handed to the runner, whose tool/environment tokens are appended before
    the next turn is generated from prompt + everything so far; the runner's turn is awaited through ``tool_turn``,
    which lets the rollouter count the episode out of the in-flight cap meanwhile. A turn aborted by a hybrid
    deactivation continues on another replica like any segment; the tool before it already ran, once.

    Args:
        host: The rollouter: its settings and segment counters.
        role_production: Where the tokens each replica returns are counted (aborted segments included).
        clock: Time source of the sample's ``started_at``.
    """

    def __init__(self, host: SegmentHost, role_production: RoleProduction, clock: Callable[[], float]) -> None:
        self._host = host
        self._role_production = role_production
        self._clock = clock

    async def generate(
        self,
        batch: Sequence[SampleState],
        group: PromptGroup,
        *,
        gate: asyncio.Event,
        park: Callable[[int], Awaitable[None]],
        stopping: Callable[[], bool],
        finished: Callable[[SampleState, str], None],
        tool_turn: Callable[[Awaitable[str | None]], Awaitable[str | None]] | None = None,
    ) -> None:
        """Run segments until every sample of ``batch`` finished or the rollouter stops (their state is kept).

        Args:
            batch: Unfinished samples of ``group`` (their kept segments are their prefixes).
            group: Their prompt group.
            gate: Open while segments may be sent; while it is closed the batch waits in ``park(n)``.
            park: Wait for the gate to open (the rollouter counts the ``n`` parked samples).
            stopping: Whether the rollouter is stopping.
            finished: Called once per sample as soon as it finishes, with its finish reason.
            tool_turn: Awaits an episode's ``after_turn`` for the rollouter (which frees the episode's in-flight
                slot meanwhile); None awaits it directly.
        """
        host = self._host
        episodes = host.episodes
        if episodes is not None and len(batch) > 1:
            try:
                async with asyncio.TaskGroup() as tasks:  # one raising cancels the others, like one batch would
                    for st in batch:
                        tasks.create_task(
                            self.generate(
                                [st],
                                group,
                                gate=gate,
                                park=park,
                                stopping=stopping,
                                finished=finished,
                                tool_turn=tool_turn,
                            )
                        )
            except ExceptionGroup as errors:  # the first error, as a one-sample batch would raise it
                raise errors.exceptions[0] from None
            return
        stop_ids = set(host.sampling.stop_token_ids)
        lb = host.load_balancer
        now = self._clock()
        for st in batch:
            if st.started_at is None:
                st.started_at = now
        if episodes is not None:
            for st in batch:
                await episodes.begin(st, group)
        pending = list(batch)
        while pending:
            if not gate.is_set():
                await park(len(pending))
            if stopping():
                return
            ready = []
            limits: dict[str, int] = {}
            for st in pending:
                limit = self._limit(st)
                if limit <= 0:  # restored from a checkpoint at full length, or an episode turn out of room
                    reason = "length" if episodes is None else await self._turn(episodes, st, "length", tool_turn)
                    limit = self._limit(st) if reason is None else 0
                    if limit <= 0:
                        finished(st, reason or "length")
                        continue
                ready.append(st)
                limits[st.uid] = limit
            pending = ready
            if not pending:
                return
            request_ids = [f"{st.uid}:{st.attempts}" for st in pending]
            for st in pending:
                st.attempts += 1
            sticky = group.group_id if episodes is None else pending[0].uid
            replica = await lb.acquire_many(request_ids, sticky_key=sticky, timeout=host.no_replica_timeout_s)
            if not gate.is_set() or stopping():
                lb.release_many(replica.replica_id, request_ids)
                continue
            requests = [
                (
                    rid,
                    self._prompt(st, group) + st.tokens,
                    dataclasses.replace(host.sampling, max_tokens=limits[st.uid], seed=st.seed),
                )
                for rid, st in zip(request_ids, pending)
            ]
            host.replica_calls += 1
            try:
                outcomes: list[GenerationResult | BaseException] = await generate_group(replica, requests)
            except Exception as exc:  # the call itself failed (a dead replica): every request's outcome
                outcomes = [exc] * len(pending)
            finally:
                lb.release_many(replica.replica_id, request_ids)
            if len(outcomes) != len(pending):
                outcomes = [
                    RolloutError(f"replica {replica.replica_id} returned {len(outcomes)} results for {len(pending)}")
                ] * len(pending)
            retry: list[SampleState] = []
            backoff = 0.0
            for st, (rid, prompt, spec), outcome in zip(pending, requests, outcomes):
                if isinstance(outcome, asyncio.CancelledError):
                    raise outcome
                if isinstance(outcome, BaseException):
                    retry.append(st)
                    backoff = max(backoff, self._failed(st, rid, replica, outcome))
                    continue
                bound = len(st.tokens) + spec.max_tokens  # where this turn (or plain response) must stop
                reason, wait = self._settle(st, outcome, len(prompt), spec.max_tokens, replica, rid, bound, stop_ids)
                if reason is not None and episodes is not None:
                    reason = await self._turn(episodes, st, reason, tool_turn)
                if reason is not None:
                    finished(st, reason)
                else:
                    retry.append(st)
                    backoff = max(backoff, wait)
            pending = retry
            if pending and backoff > 0:
                await asyncio.sleep(backoff)

    @staticmethod
    async def _turn(
        episodes: EpisodeRunner,
        st: SampleState,
        reason: str,
        tool_turn: Callable[[Awaitable[str | None]], Awaitable[str | None]] | None,
    ) -> str | None:
        """What follows ``st``'s finished model turn (its tool/environment turn), through ``tool_turn`` if given."""
        turn = episodes.after_turn(st, reason)
        return await (turn if tool_turn is None else tool_turn(turn))

    def _limit(self, st: SampleState) -> int:
        """The most tokens ``st``'s next segment may have: its response's room, or its episode turn's."""
        episodes = self._host.episodes
        if episodes is None:
            return self._host.sampling.max_tokens - len(st.tokens)
        return episodes.turn_limit(st)

    @staticmethod
    def _prompt(st: SampleState, group: PromptGroup) -> list[int]:
        return st.prompt_ids if st.prompt_ids is not None else group.prompt_token_ids

    def _failed(self, st: SampleState, request_id: str, replica: ReplicaLike, exc: BaseException) -> float:
        """Count a segment that raised; the backoff before its retry (0 for a dead replica: retry elsewhere now)."""
        host = self._host
        if is_replica_dead_error(exc):
            host.load_balancer.mark_dead(replica.replica_id)
            host.dead_replica_retries += 1
            log.warning("%s: replica %s died under %s; retrying elsewhere", host.name, replica.replica_id, st.uid)
            return 0.0
        st.failures += 1
        host.failed_segments += 1
        if st.failures > host.max_segment_failures:
            raise RolloutError(
                f"sample {st.uid} failed {st.failures} times (last on replica {replica.replica_id}): {exc!r}; "
                "check the replicas' health or raise max_segment_failures"
            ) from exc
        log.warning("%s: segment %s failed on %s: %r; retrying", host.name, request_id, replica.replica_id, exc)
        return failure_backoff_s(st.failures)

    def _settle(
        self,
        st: SampleState,
        result: GenerationResult,
        prompt_tokens: int,
        remaining: int,
        replica: ReplicaLike,
        request_id: str,
        response_length: int,
        stop_ids: Set[int],
    ) -> tuple[str | None, float]:
        """Settle one returned segment: the sample's finish reason (``None``: it needs another segment) and the
        backoff before that segment (a refusal's)."""
        host = self._host
        tokens = list(result.token_ids)
        self._role_production.add_tokens(replica_role(replica), len(tokens))
        logprobs = list(result.logprobs)
        overshoot = len(tokens) > remaining
        if overshoot:
            log.warning(
                "%s: replica %s returned %d tokens for max_tokens=%d (%s); truncating",
                host.name,
                replica.replica_id,
                len(tokens),
                remaining,
                request_id,
            )
            tokens, logprobs = tokens[:remaining], logprobs[:remaining]
        if is_refusal(result, tokens):
            st.rejections += 1
            host.rejected_segments += 1
            if st.rejections == 1:
                log.warning(
                    "%s: replica %s refused %s (engine state %s); remove_replicas before sleep_replicas and "
                    "wake_up before add_replicas",
                    host.name,
                    replica.replica_id,
                    request_id,
                    result.info.get("rejected"),
                )
            host.load_balancer.clear_sticky_key(st.group_id)
            return None, refusal_backoff_s(st.rejections)
        self._role_production.add_prompt(prompt_tokens, result.cached_prompt_tokens)
        if result.finish_reason == "abort":
            host.aborted_segments += 1
        reason = settle_segment(
            st,
            tokens,
            logprobs,
            result,
            replica_id=replica.replica_id,
            overshoot=overshoot,
            partial_rollout=host.partial_rollout,
            response_length=response_length,
            stop_ids=stop_ids,
        )
        if reason is None:
            host.retried_segments += 1
        return reason, 0.0


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
    pieces = version_pieces(tokens, logprobs, result)
    if result.finish_reason == "abort":
        st.aborted_segments += 1
        if partial_rollout:
            for piece_tokens, piece_logprobs, version in pieces:
                st.keep_segment(piece_tokens, piece_logprobs, version, replica_id)
        else:
            st.drop_segments()
        if len(st.tokens) >= response_length:
            return "length"
        if st.tokens and st.tokens[-1] in stop_ids:
            return "stop"
        return None
    for i, (piece_tokens, piece_logprobs, version) in enumerate(pieces):
        st.keep_segment(piece_tokens, piece_logprobs, version, replica_id, final=i == len(pieces) - 1)
    return "length" if overshoot else result.finish_reason


def version_pieces(
    tokens: list[int], logprobs: list[float], result: GenerationResult
) -> list[tuple[list[int], list[float], int]]:
    """A segment cut where each keep-mode weight update took effect (``result.info["version_splits"]``: the
    engine froze the request, loaded new weights and let it go on), as ``(tokens, logprobs, version)`` pieces;
    one piece of ``result.weight_version`` for a segment no update crossed. Empty pieces are left out except the
    last one."""
    pieces: list[tuple[list[int], list[float], int]] = []
    start, version = 0, result.weight_version
    for at, new_version in result.info.get("version_splits") or ():
        at = max(start, min(int(at), len(tokens)))
        if at > start:
            pieces.append((tokens[start:at], logprobs[start:at], version))
        start, version = at, int(new_version)
    pieces.append((tokens[start:], logprobs[start:], version))
    return pieces


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
