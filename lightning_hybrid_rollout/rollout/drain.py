"""Drain-aware deactivation: which in-flight requests finish within a budget, and what a drain did.

Requests expected to finish within the budget (remaining tokens over their own measured decode rate) complete; the
others are aborted at once and a deadline aborts any still running, so no request is left on a sleeping replica
(docs/callback.md, "Drain-aware deactivation"). :func:`split_by_finish` is the pure decision, :func:`drain_requests`
the drain over an engine's requests, :class:`DrainReport` its result.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass

__all__ = [
    "DEADLINE_MARGIN_S",
    "DrainReport",
    "RequestProgress",
    "drain_deadline_s",
    "drain_requests",
    "split_by_finish",
]

#: Slack added to the budget before the deadline aborts the requests still running (a request predicted to finish
#: right at the budget gets a few more decode steps).
DEADLINE_MARGIN_S = 0.02


def drain_deadline_s(budget_s: float) -> float:
    """Seconds after the start of a drain at which every request still running is aborted (0 for no budget)."""
    return 0.0 if budget_s <= 0 else 1.2 * budget_s + DEADLINE_MARGIN_S


@dataclass
class RequestProgress:
    """One in-flight request's progress, as the engine sees it (``time.monotonic()`` readings).

    Args:
        max_tokens: Tokens the request may generate at most.
        prompt_tokens: Prompt length (prefix of an earlier segment included): what a continuation re-prefills.
        tokens: Tokens generated so far.
        first_token_s: When the first output arrived (None: not yet).
        first_tokens: Tokens generated at ``first_token_s`` (the rate counts the tokens after them).
        finish_reason: The engine's finish reason once the request ended (None while running).
        submitted_s: When the request was submitted. Where no output was observed before the current one (an engine
            that delivers a request's output only at its end, read for progress on demand), the rate counts from
            here: an under-estimate by the prefill and queueing time, so a drain keeps fewer requests, never more.
    """

    max_tokens: int
    prompt_tokens: int = 0
    tokens: int = 0
    first_token_s: float | None = None
    first_tokens: int = 0
    finish_reason: str | None = None
    submitted_s: float | None = None

    def observe(self, tokens: int, now: float, finish_reason: str | None = None) -> None:
        """Record an output: ``tokens`` generated in total at ``now``, and the finish reason if it ended."""
        if self.first_token_s is None and tokens > 0:
            self.first_token_s, self.first_tokens = now, tokens
        self.tokens = tokens
        if finish_reason is not None:
            self.finish_reason = finish_reason

    def rate(self, now: float) -> float | None:
        """Measured decode rate (tokens/s since the first token; since submission when the first observation is the
        only one), or None without tokens to count."""
        if self.first_token_s is not None and self.tokens > self.first_tokens and now > self.first_token_s:
            return (self.tokens - self.first_tokens) / (now - self.first_token_s)
        if self.submitted_s is not None and self.tokens > 0 and now > self.submitted_s:
            return self.tokens / (now - self.submitted_s)
        return None

    def seconds_to_finish(self, now: float) -> float:
        """Estimated seconds until ``max_tokens`` is reached at the measured rate (``inf`` without a rate)."""
        remaining = self.max_tokens - self.tokens
        if remaining <= 0:
            return 0.0
        rate = self.rate(now)
        return remaining / rate if rate else math.inf


def split_by_finish(
    progress: Mapping[str, RequestProgress], now: float, budget_s: float
) -> tuple[list[str], list[str]]:
    """Split requests into those predicted to finish within ``budget_s`` (kept) and the others (to abort now).

    A request without a measured rate yet (fewer than two outputs) counts as not finishing; so does every request
    when ``budget_s <= 0``. A request may still stop earlier (an end-of-sequence token): the estimate is an upper
    bound, so the kept ones are never over-optimistic on that account.

    Args:
        progress: Request id -> its progress.
        now: The current ``time.monotonic()`` reading.
        budget_s: The drain budget in seconds.

    Returns:
        ``(keep, abort)``: request ids, each in ``progress``'s order.
    """
    keep: list[str] = []
    cut: list[str] = []
    for rid, p in progress.items():
        (keep if budget_s > 0 and p.seconds_to_finish(now) <= budget_s else cut).append(rid)
    return keep, cut


@dataclass
class DrainReport:
    """What a drain of in-flight requests did (one replica, or summed over several with ``+``).

    Args:
        requests: Requests in flight when the drain began.
        drained: Of those, requests that finished on their own (``stop``/``length``) within the budget.
        aborted: Requests aborted (at once, or at the deadline); they continue elsewhere from their prefix.
        aborted_tokens: Tokens the aborted requests had generated (their prefixes).
        reprefill_tokens: Prompt + prefix tokens of the aborted requests: what their continuations re-prefill.
        seconds: Wall time of the drain (``+`` sums it: the load balancer sets its own wall time over replicas).
    """

    requests: int = 0
    drained: int = 0
    aborted: int = 0
    aborted_tokens: int = 0
    reprefill_tokens: int = 0
    seconds: float = 0.0

    def __add__(self, other: DrainReport) -> DrainReport:
        return DrainReport(
            requests=self.requests + other.requests,
            drained=self.drained + other.drained,
            aborted=self.aborted + other.aborted,
            aborted_tokens=self.aborted_tokens + other.aborted_tokens,
            reprefill_tokens=self.reprefill_tokens + other.reprefill_tokens,
            seconds=self.seconds + other.seconds,
        )

    def to_dict(self) -> dict[str, float]:
        """The fields as a flat dict (trace span arguments, logs)."""
        return asdict(self)

    @classmethod
    def of(cls, progress: Mapping[str, RequestProgress], seconds: float) -> DrainReport:
        """The report of ended requests: those with a ``stop``/``length`` finish drained, the rest aborted."""
        report = cls(requests=len(progress), seconds=seconds)
        for p in progress.values():
            if p.finish_reason in ("stop", "length"):
                report.drained += 1
            else:
                report.aborted += 1
                report.aborted_tokens += p.tokens
                report.reprefill_tokens += p.prompt_tokens + p.tokens
        return report


async def drain_requests(
    progress: Mapping[str, RequestProgress],
    is_running: Callable[[str], bool],
    abort: Callable[[list[str]], Awaitable[None]],
    budget_s: float,
    settle_timeout_s: float,
    *,
    poll_s: float = 0.002,
) -> DrainReport:
    """Drain an engine's running requests: keep those that finish within ``budget_s``, abort the rest.

    The ones :func:`split_by_finish` does not keep are aborted at once; at :func:`drain_deadline_s` the kept ones
    still running are aborted too. Returns once every request of ``progress`` has ended (or ``settle_timeout_s``
    after the last abort), with the report of their outcomes (``RequestProgress.finish_reason``, which the engine
    keeps updating in the same objects).

    Args:
        progress: The requests to drain (the engine's in-flight ones), id -> progress.
        is_running: Whether a request is still in flight on the engine.
        abort: The engine's abort (unknown or ended ids are ignored).
        budget_s: Seconds the kept requests may run.
        settle_timeout_s: Longest wait for aborted requests to end.
        poll_s: Polling interval.

    Returns:
        The :class:`DrainReport` of ``progress``'s requests.
    """
    t0 = time.monotonic()
    watched = dict(progress)
    if not watched:
        return DrainReport()
    keep, cut = split_by_finish(watched, t0, budget_s)
    if cut:
        await abort(cut)
    deadline = t0 + drain_deadline_s(budget_s)
    while any(is_running(r) for r in keep) and time.monotonic() < deadline:
        await asyncio.sleep(poll_s)
    late = [r for r in keep if is_running(r)]
    if late:
        await abort(late)
    end = time.monotonic() + settle_timeout_s
    while any(is_running(r) for r in watched) and time.monotonic() < end:
        await asyncio.sleep(poll_s)
    return DrainReport.of(watched, time.monotonic() - t0)
