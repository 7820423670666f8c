"""The trainer ranks' protocol at a sync boundary: rank 0 broadcasts exactly one ``"offload"`` or ``"stay"`` per
boundary, so the other ranks know whether hybrid engines will wake on their devices; misuse raises
:class:`RankProtocolError` on rank 0 instead of deadlocking (docs/callback.md).

Example::

    sent = []
    protocol = BoundaryProtocol(
        broadcast=lambda msg: sent.append(msg) or msg, offload=lambda: None, barrier=lambda: None
    )
    protocol.open()
    protocol.need_devices()  # activation: "offload"
    protocol.need_devices()  # again in the same boundary: nothing more
    protocol.close()
    protocol.open()
    protocol.close()  # nothing needed the devices: "stay"
    assert sent == ["offload", "stay"]
"""

from __future__ import annotations

from collections.abc import Callable

from lightning_hybrid_rollout.errors import RankProtocolError
from lightning_hybrid_rollout.run.recent import RecentList

__all__ = ["OFFLOAD", "STAY", "BoundaryProtocol"]

OFFLOAD = "offload"
STAY = "stay"


class BoundaryProtocol:
    """One broadcast per sync boundary from rank 0; every other rank follows it (rules in the module docstring).

    Args:
        broadcast: ``broadcast(message) -> message`` from rank 0 to every rank (the strategy's ``broadcast``; on one
            rank, the identity). Rank 0 passes its message; the others pass anything and get rank 0's.
        offload: Offload this rank's training state (a no-op when already offloaded).
        barrier: Every rank meets there (the strategy's ``barrier``; on one rank, a no-op).
    """

    def __init__(
        self, broadcast: Callable[[str], str], offload: Callable[[], None], barrier: Callable[[], None]
    ) -> None:
        self._broadcast = broadcast
        self._offload = offload
        self._barrier = barrier
        self._open = False
        self._sent: str | None = None
        #: The newest messages this rank sent or received, in order (one per boundary; bounded for long fits).
        self.history: list[str] = RecentList(32)

    @property
    def is_open(self) -> bool:
        """Whether a boundary is open on rank 0."""
        return self._open

    @property
    def offloaded_this_boundary(self) -> bool:
        """Whether rank 0 sent ``"offload"`` in the open (or last) boundary."""
        return self._sent == OFFLOAD

    def open(self) -> None:
        """Rank 0: a boundary starts."""
        if self._open:
            raise RankProtocolError("a sync boundary opened while the previous one is still open (close it first)")
        self._open, self._sent = True, None

    def need_devices(self) -> None:
        """Rank 0, right before hybrid engines wake: every rank offloads (the one ``"offload"`` of the boundary)."""
        if not self._open:
            raise RankProtocolError("need_devices() outside a sync boundary: open() it first")
        if self._sent is None:
            self._send(OFFLOAD)
            self._offload()
            self._barrier()  # every rank has offloaded
        else:
            self._offload()

    def close(self) -> str:
        """Rank 0: the boundary is over; sends ``"stay"`` if nothing needed the devices. Returns the message sent."""
        if not self._open:
            raise RankProtocolError("close() without an open sync boundary")
        if self._sent is None:
            self._send(STAY)
        self._open = False
        assert self._sent is not None
        return self._sent

    def follow(self) -> str:
        """Every rank but 0, once per boundary: receive rank 0's message and offload on ``"offload"``."""
        message = self._broadcast("")
        if message not in (OFFLOAD, STAY):
            raise RankProtocolError(f"rank 0 sent {message!r} at a sync boundary; expected 'offload' or 'stay'")
        self.history.append(message)
        if message == OFFLOAD:
            self._offload()
            self._barrier()  # rank 0 wakes the engines only after this
        return message

    def _send(self, message: str) -> None:
        self._sent = message
        self.history.append(message)
        self._broadcast(message)
