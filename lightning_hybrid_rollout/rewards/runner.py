"""Score a finished prompt group with the reward functions, in a worker pool, off the rollouter's event loop.

For one group (:meth:`RewardRunner.score_group`, awaited on the rollouter's loop; :meth:`~RewardRunner.score_group_sync`
does the same without a loop): each function is handed to the pool once, as ``fn(prompts=, completions=,
completion_ids=, **columns)`` (lists copied per call), at most ``workers`` calls at a time over all groups; each call
gets ``timeout_s`` from when it has a worker; its result must be one finite number or ``None`` ("does not apply") per
completion. A sample's reward is the weighted sum over the functions that returned a number for it (0.0 if none
did, as TRL's ``nansum``).

A failed call (raised, timed out, NaN/inf, a non-number, the wrong type or length) raises
:class:`RewardFunctionError` (``on_error="fail"``), or (``"zero"``) scores that function 0.0 on the whole group,
counts in ``train/reward_errors`` and is logged at WARNING once per (function, kind of failure), then at DEBUG.
A timeout frees the group, not the worker: a thread running a stuck function cannot be killed (it keeps its worker
until it returns, and delays interpreter exit); :meth:`RewardRunner.close` terminates a process pool's workers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import multiprocessing
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_hybrid_rollout.errors import ConfigError, RewardFunctionError
from lightning_hybrid_rollout.rewards.config import RewardConfig
from lightning_hybrid_rollout.rewards.loading import TRL_ARGUMENTS, RewardFunction, load_reward_functions

__all__ = ["GroupRewardInput", "GroupRewards", "RewardRunner"]

log = logging.getLogger(__name__)


@dataclass
class GroupRewardInput:
    """One finished prompt group, in TRL's per-completion layout (every list has one entry per completion).

    Args:
        prompt_index: The prompt record's index in its data set (named in error messages).
        prompts: The prompt of each completion: its message list (chat) or its string.
        completions: Each completion: ``[{"role": "assistant", "content": text}]`` (chat) or its text.
        completion_ids: Each completion's token ids.
        columns: The record's other fields, one value per completion (``{"answer": ["7", "7", ...]}``).
        is_chat: Whether prompts and completions are message lists.
    """

    prompt_index: int
    prompts: list[Any]
    completions: list[Any]
    completion_ids: list[list[int]]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    is_chat: bool = False

    def __post_init__(self) -> None:
        n, where = len(self.completions), f"GroupRewardInput of prompt {self.prompt_index}"
        lengths = {"prompts": len(self.prompts), "completion_ids": len(self.completion_ids)}
        wrong = {k: m for k, m in {**lengths, **{k: len(v) for k, v in self.columns.items()}}.items() if m != n}
        if n == 0 or wrong:
            raise ValueError(f"{where}: each list needs one entry per completion ({n}), got lengths {wrong}")
        clash = [k for k in self.columns if k in TRL_ARGUMENTS]
        if clash:
            raise ValueError(f"{where}: column {clash[0]!r} has the name of a TRL argument; rename the column")

    @classmethod
    def from_prompt(
        cls,
        prompt_index: int,
        prompt: str | Sequence[Mapping[str, Any]],
        completion_texts: Sequence[str],
        completion_ids: Sequence[Sequence[int]],
        columns: Mapping[str, Any] | None = None,
    ) -> GroupRewardInput:
        """The group of one prompt record: its completions' texts and ids, its other fields broadcast.

        Args:
            prompt_index: The record's index in its data set.
            prompt: The prompt string, or its message list (chat: each completion becomes an assistant message).
            completion_texts: The decoded text of each completion.
            completion_ids: The token ids of each completion.
            columns: The record's other fields (one value each, repeated for every completion).
        """
        n, is_chat = len(completion_texts), not isinstance(prompt, str)
        texts = list(completion_texts)
        return cls(
            prompt_index=prompt_index,
            prompts=[prompt] * n,
            completions=[[{"role": "assistant", "content": t}] for t in texts] if is_chat else texts,
            completion_ids=[list(ids) for ids in completion_ids],
            columns={k: [v] * n for k, v in (columns or {}).items()},
            is_chat=is_chat,
        )

    def call_kwargs(self) -> dict[str, list[Any]]:
        """The keyword arguments of a call: ``prompts``, ``completions``, ``completion_ids`` and the columns."""
        trl = {"prompts": self.prompts, "completions": self.completions, "completion_ids": self.completion_ids}
        return trl | self.columns


@dataclass(frozen=True)
class GroupRewards:
    """The rewards of one group.

    Args:
        rewards: Each sample's reward (weighted sum over the functions that returned a number for it).
        per_function: Each function's values, by name (``None``: did not apply; a failed call in ``zero`` mode: 0.0).
        errors: Failed calls in this group (``zero`` mode).
    """

    rewards: list[float]
    per_function: dict[str, list[float | None]]
    errors: int = 0


@dataclass
class _Outcome:
    values: list[float | None] | None = None
    kind: str = ""  # failure kind, "" on success
    detail: str = ""
    cause: BaseException | None = None
    elapsed: float = 0.0


def _describe(err: BaseException | str) -> str:
    if isinstance(err, str):
        return err
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}" if text else type(err).__name__


def _invoke(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, fn(**{k: list(v) for k, v in kwargs.items()})  # fresh lists: in-place edits stay the function's
    except Exception as err:
        return False, err


_WORKER_FUNCTIONS: list[Any] = []  # in a process-pool worker: each function, or why it did not load there


def _init_worker(payloads: list[Any]) -> None:
    """Process-pool initializer: load each function again from its ``reward_funcs`` item (or take it pickled)."""
    from lightning_hybrid_rollout.rewards.loading import resolve_reward_item

    for p in payloads:
        try:
            _WORKER_FUNCTIONS.append(resolve_reward_item(p) if isinstance(p, (str, Mapping)) else p)
        except Exception as err:  # reported by each call, instead of a pool that breaks with no reason given
            _WORKER_FUNCTIONS.append(f"it does not load in a worker process: {_describe(err)}")


def _invoke_in_worker(index: int, kwargs: dict[str, Any]) -> tuple[bool, Any]:
    fn = _WORKER_FUNCTIONS[index]
    ok, value = (False, fn) if isinstance(fn, str) else _invoke(fn, kwargs)
    return (True, value) if ok else (False, _describe(value))  # the error as text: it may not pickle


def _check_values(raw: Any, n: int) -> _Outcome:
    if isinstance(raw, (str, bytes, Mapping)) or not hasattr(raw, "__len__") or not hasattr(raw, "__iter__"):
        return _Outcome(kind="wrong_type", detail=f"returned {type(raw).__name__} {raw!r:.60}, not a list of {n}")
    values = list(raw)
    if len(values) != n:
        return _Outcome(kind="wrong_length", detail=f"returned {len(values)} values for {n} completions")
    out: list[float | None] = []
    for j, v in enumerate(values):
        try:
            if v is not None and (isinstance(v, (str, bytes)) or not hasattr(v, "__float__")):
                raise TypeError
            out.append(None if v is None else float(v))
        except (TypeError, ValueError):
            return _Outcome(kind="not_a_number", detail=f"value {j} is {type(v).__name__} {v!r:.40}, not a number")
        if out[-1] is not None and not math.isfinite(out[-1]):
            return _Outcome(kind="not_finite", detail=f"value {j} is {out[-1]} (return None for 'does not apply')")
    return _Outcome(values=out)


class _Window:
    """Per-function sums since a point in time: the last take, or the start of the run."""

    def __init__(self, names: Sequence[str]) -> None:
        self.sums, self.counts = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
        self.seconds, self.calls = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
        self.errors = 0

    def add(self, name: str, o: _Outcome) -> None:
        self.calls[name] += 1
        self.seconds[name] += o.elapsed
        got = [v for v in o.values or () if v is not None]
        self.sums[name] += sum(got)
        self.counts[name] += len(got)
        self.errors += bool(o.kind)

    def as_metrics(self) -> dict[str, float]:
        out = {f"train/rewards/{k}_mean": self.sums[k] / c for k, c in self.counts.items() if c}
        out |= {f"train/rewards/{k}_time_s": self.seconds[k] / c for k, c in self.calls.items() if c}
        return out | {"train/reward_errors": float(self.errors)}


class RewardRunner:
    """Runs reward functions on finished prompt groups in a thread or process pool (see the module doc).

    Args:
        functions: The loaded functions (:func:`~lightning_hybrid_rollout.rewards.loading.load_reward_functions`).
        workers: Pool size: calls running at once, over all groups.
        pool: ``"thread"`` or ``"process"`` (spawned processes that load each function again from its item).
        timeout_s: Longest one call may run, from when it gets a worker.
        on_error: ``"fail"`` (raise :class:`RewardFunctionError`) or ``"zero"`` (score the failed call 0.0).
        clock: Seconds, for the ``train/rewards/<name>_time_s`` call durations (not for the timeout).

    Example::

        >>> with RewardRunner.from_config(RewardConfig(reward_funcs=["exact_match"])) as runner:
        ...     chat = [{"role": "user", "content": "3+4="}]
        ...     group = GroupRewardInput.from_prompt(3, chat, ["7"], [[7]], {"answer": 7})
        ...     asyncio.run(runner.score_group(group)).rewards
        [1.0]
    """

    def __init__(
        self,
        functions: Sequence[RewardFunction],
        *,
        workers: int = 1,
        pool: Literal["thread", "process"] = "thread",
        timeout_s: float = 60.0,
        on_error: Literal["fail", "zero"] = "fail",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not functions:
            raise ConfigError("rewards.reward_funcs is empty: give a RewardRunner at least one reward function.")
        if pool not in ("thread", "process") or on_error not in ("fail", "zero") or workers < 1 or timeout_s <= 0:
            raise ConfigError(
                f"RewardRunner needs workers >= 1, pool thread|process, timeout_s > 0, on_error fail|zero; got "
                f"workers={workers!r}, pool={pool!r}, timeout_s={timeout_s!r}, on_error={on_error!r}."
            )
        self.functions = list(functions)
        self.workers, self.pool, self.timeout_s, self.on_error = workers, pool, float(timeout_s), on_error
        self._clock = clock
        self._lock = threading.Lock()
        self._window, self._total = _Window([f.name for f in functions]), _Window([f.name for f in functions])
        self._logged: set[tuple[str, str]] = set()
        self._running = 0  # calls handed to the pool and not finished (timed-out ones included)
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._closed = self._broken = False
        self._executor = self._make_executor()

    @classmethod
    def from_config(cls, cfg: RewardConfig, columns: Collection[str] | None = None) -> RewardRunner:
        """Load ``cfg``'s functions (``load_reward_functions(cfg, columns)``) and build a runner with its settings."""
        return cls(
            load_reward_functions(cfg, columns),
            workers=cfg.reward_workers,
            pool=cfg.reward_pool,
            timeout_s=cfg.reward_timeout_s,
            on_error=cfg.reward_error,
        )

    def _make_executor(self) -> concurrent.futures.Executor:
        if self.pool == "thread":
            return concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="reward")
        payloads = [f.item if f.item is not None else f.fn for f in self.functions]
        spawn = multiprocessing.get_context("spawn")  # fork is unsafe in a process running Ray/vLLM threads
        return concurrent.futures.ProcessPoolExecutor(self.workers, spawn, _init_worker, (payloads,))

    def _submit(self, index: int, kwargs: dict[str, Any]) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("RewardRunner is closed")
        if self._broken:
            log.warning("the reward process pool broke (a worker died); starting a new one")
            self._broken = False
            self._executor = self._make_executor()
        if self.pool == "thread":
            fut = self._executor.submit(_invoke, self.functions[index].fn, kwargs)
        else:
            fut = self._executor.submit(_invoke_in_worker, index, kwargs)
        with self._lock:
            self._running += 1
        fut.add_done_callback(self._call_done)
        return fut

    def _call_done(self, fut: concurrent.futures.Future) -> None:
        with self._lock:
            self._running -= 1
            if not fut.cancelled() and isinstance(fut.exception(), concurrent.futures.BrokenExecutor):
                self._broken = True

    def _outcome(self, result: tuple[bool, Any] | BaseException, n: int) -> _Outcome:
        """A call's result (``(ok, value)``) or what waiting for it raised, as an outcome."""
        if isinstance(result, TimeoutError):
            return _Outcome(kind="timeout", detail=f"timed out after {self.timeout_s:g} s (reward_timeout_s)")
        if isinstance(result, BaseException):  # the pool itself failed (e.g. a dead worker process)
            result = (False, result)
        ok, value = result
        if ok:
            return _check_values(value, n)
        cause = value if isinstance(value, BaseException) else None
        return _Outcome(kind=f"raised {_describe(value).split(':')[0]}", detail=_describe(value), cause=cause)

    async def _call(self, index: int, kwargs: dict[str, Any], n: int) -> _Outcome:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.workers))
        async with self._slots[1]:
            start = self._clock()
            try:  # = loop.run_in_executor, keeping the concurrent future to track a timed-out call
                fut = asyncio.wrap_future(self._submit(index, kwargs), loop=loop)
                outcome = self._outcome(await asyncio.wait_for(fut, self.timeout_s), n)
            except Exception as err:
                outcome = self._outcome(err, n)
            outcome.elapsed = self._clock() - start
        return outcome

    async def score_group(self, group: GroupRewardInput) -> GroupRewards:
        """Score one group off the event loop (each function once, in the pool); await it on the rollouter's loop.

        Raises:
            RewardFunctionError: A call failed and ``on_error="fail"``.
        """
        kwargs, n = group.call_kwargs(), len(group.completions)
        return self._combine(
            group, await asyncio.gather(*(self._call(i, kwargs, n) for i in range(len(self.functions))))
        )

    def score_group_sync(self, group: GroupRewardInput) -> GroupRewards:
        """:meth:`score_group` without an event loop (e.g. validation): same pool, checks and combination."""
        kwargs, n, outcomes = group.call_kwargs(), len(group.completions), []
        for first in range(0, len(self.functions), self.workers):  # `workers` calls at a time: each gets a worker
            start, deadline = self._clock(), time.monotonic() + self.timeout_s
            for fut in [self._submit(i, kwargs) for i in range(first, min(first + self.workers, len(self.functions)))]:
                try:
                    outcome = self._outcome(fut.result(max(0.0, deadline - time.monotonic())), n)
                except Exception as err:
                    outcome = self._outcome(err, n)
                outcome.elapsed = self._clock() - start
                outcomes.append(outcome)
        return self._combine(group, outcomes)

    def _combine(self, group: GroupRewardInput, outcomes: Sequence[_Outcome]) -> GroupRewards:
        n, per_function, errors = len(group.completions), {}, 0
        for f, o in zip(self.functions, outcomes, strict=True):
            with self._lock:
                self._window.add(f.name, o)
                self._total.add(f.name, o)
            if o.kind:
                errors += 1
                self._report(f, o, group.prompt_index)
            per_function[f.name] = [0.0] * n if o.kind else list(o.values or ())
        rewards: list[float] = []
        for j in range(n):
            got = [f.weight * v for f in self.functions if (v := per_function[f.name][j]) is not None]
            if not got:
                self._log_once(
                    ("*", "none"),
                    f"every function returned None on a sample of prompt {group.prompt_index}; its reward is 0.0",
                )
            rewards.append(float(sum(got)))
        return GroupRewards(rewards=rewards, per_function=per_function, errors=errors)

    def _report(self, f: RewardFunction, o: _Outcome, prompt_index: int) -> None:
        message = f"reward function {f.name!r} ({f.spec or f.name}) failed on prompt {prompt_index}: {o.detail}"
        if self.on_error == "fail":
            fix = "make it faster, raise reward_timeout_s," if o.kind == "timeout" else "fix the function"
            raise RewardFunctionError(
                f"{message}; {fix} or set reward_error: zero to score such samples 0"
            ) from o.cause
        if o.kind == "timeout":
            message += f" (its worker stays busy until it returns; {self._running} call(s) running)"
        self._log_once((f.name, o.kind), f"{message}; scored 0 (reward_error: zero)", o.cause)

    def _log_once(self, key: tuple[str, str], message: str, exc: BaseException | None = None) -> None:
        with self._lock:
            first, _ = key not in self._logged, self._logged.add(key)
        if not first:
            log.debug("%s", message)
            return
        log.warning("%s (repeats are logged at DEBUG)", message)
        if exc is not None:
            log.debug("traceback of the first such failure", exc_info=exc)

    def take_stats(self) -> dict[str, float]:
        """Metrics since the last take, then reset: ``train/rewards/<name>_mean`` (over the values that were not
        ``None``; failed calls left out; absent if there were none), ``train/rewards/<name>_time_s`` (mean seconds
        per call, queueing for a worker excluded) and ``train/reward_errors`` (failed calls)."""
        with self._lock:
            window, self._window = self._window, _Window([f.name for f in self.functions])
        return window.as_metrics()

    def cumulative_stats(self) -> dict[str, float]:
        """The same metrics as :meth:`take_stats` over the whole run (never reset)."""
        with self._lock:
            return self._total.as_metrics()

    def close(self) -> None:
        """Shut the pool down, cancelling queued calls. A thread still running a call cannot be stopped (it ends
        when the function returns); a process pool's workers still running one are terminated."""
        if self._closed:
            return
        self._closed, running = True, self._running
        procs = list((getattr(self._executor, "_processes", None) or {}).values())  # shutdown() forgets them
        self._executor.shutdown(wait=False, cancel_futures=True)
        if running and procs:
            for proc in procs:
                proc.terminate()
            log.info("terminated the reward worker processes (%d call(s) were still running)", running)
        elif running:
            log.warning("%d reward call(s) still running at close: their threads end when they return", running)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
