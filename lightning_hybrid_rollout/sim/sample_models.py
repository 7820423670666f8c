"""What one sample of a scenario is: its response length (:class:`LengthModel`, the scenario's ``lengths:``) and, for
multi-turn episodes, its turns and tool calls (:class:`AgenticModel`, ``agentic:``). Each field's rule is declared
on the field (:mod:`~lightning_hybrid_rollout.config.fields`); a bad value raises a one-line
:class:`~lightning_hybrid_rollout.errors.ScenarioError` naming ``section.field``.

Example::

    from lightning_hybrid_rollout.sim.sample_models import AgenticModel, LengthModel

    lengths = LengthModel(mean_tokens=1000, sigma=0.0, mean_schedule=[[0, 1], [10, 2]])
    assert lengths.mean_at(5) == 1500.0 and lengths.mean_schedule == [[0.0, 1.0], [10.0, 2.0]]
    assert AgenticModel(min_turns=2, max_turns=4).mean_turns == 3.0
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning_hybrid_rollout.config.base import Checker, ConfigBase
from lightning_hybrid_rollout.config.fields import custom, integer, is_real, real
from lightning_hybrid_rollout.errors import ScenarioError

__all__ = ["AgenticModel", "LengthModel"]

_SCHEDULE_EXAMPLE = "Write e.g. `mean_schedule: [[0, 1.0], [20, 1.5]]` (the mean 50% longer by version 20)."


def _schedule_problems(_lengths: Any, key: str, points: Any) -> list[str]:
    """Problems of ``lengths.mean_schedule``: ``[version, factor]`` pairs, versions >= 0 increasing, factors > 0."""
    if not isinstance(points, (list, tuple)):
        return [f"{key} must be a list of [version, factor] points, got {points!r}. {_SCHEDULE_EXAMPLE}"]
    problems: list[str] = []
    last: float | None = None
    for i, point in enumerate(points):
        where = f"{key}[{i}]"
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            problems.append(f"{where} must be a [version, factor] pair, got {point!r}. {_SCHEDULE_EXAMPLE}")
            continue
        version, factor = point
        if not is_real(version) or version < 0:
            problems.append(f"{where}[0] must be a number >= 0 (a param version), got {version!r}. {_SCHEDULE_EXAMPLE}")
        elif last is not None and version <= last:
            problems.append(
                f"{where}[0] must be > {last:g} (the version of the point before), got {version!r}. The points' "
                f"versions must increase: sort them."
            )
        else:
            last = version
        if not is_real(factor) or factor <= 0:
            problems.append(f"{where}[1] must be a number > 0 (a factor of the mean), got {factor!r}. Use e.g. 1.5.")
    return problems


@dataclass
class LengthModel(ConfigBase):
    """Response lengths: log-normal around a mean that can drift with the param version, clipped.

    ``mean(version) = mean_tokens × (1 + drift_per_step × version) × schedule(version)``, where ``schedule`` linearly
    interpolates the ``mean_schedule`` points ``[[version, factor], ...]`` (1.0 when empty; held constant outside
    the points); a length is ``clip(round(mean(version) × exp(sigma·z − sigma²/2)), min_tokens, max_tokens)`` with
    ``z`` standard normal (so the unclipped mean is ``mean(version)``). The ``z`` of the i-th admitted sample is the
    same in every run of a scenario (common random numbers), so runs differ by their schedule, not by luck.
    """

    SECTION: ClassVar[str] = "lengths"
    ERROR = ScenarioError

    mean_tokens: float = real(4000.0, above=0.0, fix="Give the mean response length in tokens, e.g. 4000.")
    """Mean decode length at version 0."""

    sigma: float = real(0.6, at_least=0.0, fix="Use 0 (every sample has the mean length) or a shape such as 0.6.")
    """Log-normal shape (0 = every sample has the mean length)."""

    min_tokens: int = integer(16, at_least=1, fix="Use at least one token, e.g. 16.")
    """Lower clip."""

    max_tokens: int = integer(20480, at_least=1, fix="Give the response length limit in tokens, e.g. 20480.")
    """Upper clip (the response length limit)."""

    drift_per_step: float = real(
        0.0, at_least=-1.0, fix="Use 0 (no drift) or a relative growth per version such as 0.01 (+1%)."
    )
    """Relative growth of the mean per param version (0.01 = +1% per version)."""

    prompt_tokens: int = integer(512, at_least=0, fix="Give the prompt length in tokens, e.g. 512.")
    """Prompt length (trained over, never generated)."""

    mean_schedule: list[list[float]] = custom(
        default_factory=list,
        requirement="a list of [version, factor] points (versions >= 0 increasing, factors > 0)",
        check=_schedule_problems,
    )
    """Optional ``[[version, factor], ...]`` multiplier of the mean (versions increasing); stored as float pairs
    (null: none)."""

    def prepare(self) -> None:
        points = self.mean_schedule
        if points is None:
            self.mean_schedule = []
        elif isinstance(points, (list, tuple)):  # each point a list, its numbers floats (the check reports the rest)
            self.mean_schedule = [
                [float(x) if is_real(x) else x for x in p] if isinstance(p, (list, tuple)) else p for p in points
            ]

    def check(self, c: Checker) -> None:
        if self.max_tokens < self.min_tokens:
            c.add(
                "max_tokens",
                f">= lengths.min_tokens ({self.min_tokens})",
                self.max_tokens,
                "Raise max_tokens or lower min_tokens.",
            )

    def context_at(self, version: float) -> float:
        """Average context (tokens) of an in-flight sample at ``version``: ``prompt + 0.7 × mean length``."""
        return self.prompt_tokens + 0.7 * self.mean_at(version)

    def schedule_at(self, version: float) -> float:
        """The ``mean_schedule`` factor at ``version`` (linear interpolation; 1.0 without points)."""
        pts = self.mean_schedule
        if not pts:
            return 1.0
        if version <= pts[0][0]:
            return pts[0][1]
        for (v0, f0), (v1, f1) in itertools.pairwise(pts):
            if version <= v1:
                return f0 + (f1 - f0) * (version - v0) / (v1 - v0)
        return pts[-1][1]

    def mean_at(self, version: float) -> float:
        """The (unclipped) mean length at ``version``; never below ``min_tokens``."""
        drift = 1.0 + self.drift_per_step * version
        return max(float(self.min_tokens), self.mean_tokens * drift * self.schedule_at(version))

    def length(self, z: float, version: float) -> int:
        """The length for standard-normal draw ``z`` at ``version``."""
        mean = self.mean_at(version)
        raw = mean * math.exp(self.sigma * z - 0.5 * self.sigma * self.sigma)
        return int(min(self.max_tokens, max(self.min_tokens, round(raw))))


@dataclass
class AgenticModel(ConfigBase):
    """Multi-turn episodes: model turns (decode) alternating with tool calls (waits). Off by default (one turn).

    With it, a sample is an *episode*: ``turns`` model turns drawn uniformly from ``[min_turns, max_turns]``, each
    turn's length drawn from :class:`LengthModel` (which then describes one turn: its long tail is the per-turn
    tail), and between two turns a tool call whose latency is log-normal, ``clip(median × exp(sigma·z),
    0, max_s)``. A turn occupies a replica's batch slot and decodes like a single-turn sample; during a tool call
    the episode holds no decode capacity (its replica serves other episodes) but still holds its place in the
    rollouter's concurrency cap, as the runtime's episode loop does. The next turn goes to the least-loaded routable
    replica (no sticky routing, no prefix-cache reuse: its context is re-prefilled at no modelled cost). The episode
    reaches the queue when its last turn ends; its length is the sum of its turns' lengths and the trainer trains
    over ``prompt_tokens + length + tool_output_tokens × (turns − 1)`` tokens. All draws of the i-th admitted episode
    are the same in every run of a scenario (common random numbers).
    """

    SECTION: ClassVar[str] = "agentic"
    ERROR = ScenarioError

    min_turns: int = integer(1, at_least=1, fix="Use 1 (an episode may be a single-turn sample) or more.")
    """Fewest model turns of an episode (1 = an episode may be a single-turn sample)."""

    max_turns: int = integer(1, at_least=1, fix="Use 1 (single-turn samples) or the most model turns of an episode.")
    """Most model turns of an episode."""

    tool_latency_median_s: float = real(0.0, at_least=0.0, fix="Give seconds, e.g. 1.5.")
    """Median seconds of one tool call."""

    tool_latency_sigma: float = real(
        0.0, at_least=0.0, fix="Use 0 (every call takes the median) or a log-normal shape such as 0.8."
    )
    """Log-normal shape of the tool latency (0 = every call takes the median)."""

    tool_latency_max_s: float = real(60.0, at_least=0.0, fix="Give the tool timeout in seconds, e.g. 60.")
    """Upper clip of one tool call (a tool timeout)."""

    tool_output_tokens: int = integer(0, at_least=0, fix="Give the tokens one tool result adds, e.g. 200.")
    """Tokens a tool result adds to the context (prefilled and trained over, never decoded)."""

    def check(self, c: Checker) -> None:
        if self.max_turns < self.min_turns:
            c.add(
                "max_turns",
                f">= agentic.min_turns ({self.min_turns})",
                self.max_turns,
                "Raise max_turns or lower min_turns.",
            )

    @property
    def mean_turns(self) -> float:
        """Mean model turns of an episode."""
        return 0.5 * (self.min_turns + self.max_turns)

    def tool_latency(self, z: float) -> float:
        """Seconds of a tool call for standard-normal draw ``z``."""
        return min(self.tool_latency_max_s, self.tool_latency_median_s * math.exp(self.tool_latency_sigma * z))
