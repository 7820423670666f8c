"""Production per replica role: the tokens each role's replicas decoded and the seconds the role was serving.

The ``rate_matched`` policy's inputs, read once per sync cycle with
:meth:`~lightning_hybrid_rollout.rollout.rollouter.Rollouter.take_role_window`. A role serves while one of its
replicas is routable and not under a weight sync and the rollouter runs unpaused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lightning_hybrid_rollout.rollout.load_balancer import LoadBalancer

ROLES = ("standalone", "hybrid")


@dataclass
class RoleWindow:
    """Decode work per replica role between two :meth:`Rollouter.take_role_window` calls.

    Args:
        serving_s: ``role -> seconds`` during which at least one replica of the role was serving: routable in the
            load balancer, not under a weight sync (:meth:`Rollouter.set_syncing`), the rollouter running and not
            paused. Always has the ``"standalone"`` and ``"hybrid"`` keys.
        decoded_tokens: ``role -> tokens`` the role's replicas returned in the window, aborted partial segments
            included (they were decoded, even when ``partial_rollout=False`` throws them away).
        start_s: Clock reading at the window's start.
        end_s: Clock reading at the window's end.
        prompt_tokens: Prompt tokens (partial-rollout prefixes included) of the segments the replicas returned in the
            window, all roles.
        cached_prompt_tokens: Those of them the replicas' prefix caches served instead of prefilling.
    """

    serving_s: dict[str, float]
    decoded_tokens: dict[str, int]
    start_s: float
    end_s: float
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached prompt tokens over prompt tokens (0 when no segment came back)."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def replica_role(replica: object) -> str:
    """The role of a replica: its ``role`` attribute, ``"standalone"`` when it has none."""
    return str(getattr(replica, "role", None) or "standalone")


class RoleProduction:
    """Cumulative decoded tokens and serving seconds per role, and the start of the current window.

    Serving time is credited by :meth:`tick`, which the owner calls right after every change of what serves (pool
    change, pause/resume, sync marks, start, stop) with the roles serving from then on. Not thread-safe: the
    rollouter touches it on its event loop only.
    """

    def __init__(self) -> None:
        self.decoded_tokens: dict[str, int] = dict.fromkeys(ROLES, 0)
        self.serving_s: dict[str, float] = dict.fromkeys(ROLES, 0.0)
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.syncing: set[str] = set()
        self._serving_roles: frozenset[str] = frozenset()
        self._serving_t: float | None = None
        self._window_tokens0: dict[str, int] = dict(self.decoded_tokens)
        self._window_serving0: dict[str, float] = dict(self.serving_s)
        self._window_start: float | None = None
        self._window_prompt0 = (0, 0)

    def add_tokens(self, role: str, n: int) -> None:
        """Count ``n`` tokens a replica of ``role`` returned."""
        self.decoded_tokens[role] = self.decoded_tokens.get(role, 0) + n

    def add_prompt(self, prompt_tokens: int, cached_prompt_tokens: int) -> None:
        """Count a returned segment's prompt and how much of it the replica's prefix cache served."""
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached_prompt_tokens

    def set_syncing(self, replica_ids: Iterable[str], syncing: bool) -> None:
        """Mark replicas as under (or done with) a weight sync; call :meth:`tick` next."""
        if syncing:
            self.syncing.update(replica_ids)
        else:
            self.syncing.difference_update(replica_ids)

    def serving_roles(self, load_balancer: LoadBalancer) -> frozenset[str]:
        """Roles with at least one routable replica that is not syncing."""
        lb = load_balancer
        routable = lb.routable_replica_ids()
        return frozenset(replica_role(lb.get_replica(rid)) for rid in routable if rid not in self.syncing)

    def tick(self, now: float, serving_roles: frozenset[str]) -> None:
        """Credit the time since the last tick to the roles that were serving; ``serving_roles`` serve from ``now``.

        The first tick starts the first window.
        """
        if self._serving_t is not None:
            dt = max(0.0, now - self._serving_t)
            for role in self._serving_roles:
                self.serving_s[role] = self.serving_s.get(role, 0.0) + dt
        if self._window_start is None:
            self._window_start = now
        self._serving_t = now
        self._serving_roles = serving_roles

    def window(self, now: float, *, restart: bool = True) -> RoleWindow:
        """The window from its start to ``now`` (the last tick's time); with ``restart`` a new one starts at ``now``."""
        start = self._window_start if self._window_start is not None else now
        window = RoleWindow(
            serving_s={k: v - self._window_serving0.get(k, 0.0) for k, v in self.serving_s.items()},
            decoded_tokens={k: v - self._window_tokens0.get(k, 0) for k, v in self.decoded_tokens.items()},
            start_s=start,
            end_s=now,
            prompt_tokens=self.prompt_tokens - self._window_prompt0[0],
            cached_prompt_tokens=self.cached_prompt_tokens - self._window_prompt0[1],
        )
        if not restart:
            return window
        self._window_serving0 = dict(self.serving_s)
        self._window_tokens0 = dict(self.decoded_tokens)
        self._window_prompt0 = (self.prompt_tokens, self.cached_prompt_tokens)
        self._window_start = now
        return window
