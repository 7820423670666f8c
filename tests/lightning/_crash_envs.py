"""The environment of the multi-turn crash-and-resume test (``_crash_run.py`` with ``environment``): Gymnasium's
convention, so the tiny model (which writes no tool call) still plays several turns. Each episode's environment
draws an id that its reset text carries into the prompt (the trained sample names it), answers ``steps`` model turns
and says done, and appends every ``reset``, ``step`` and ``load_state_dict`` to a JSON-lines log, so the test counts
each environment step by episode. Every ``unsavable_every``-th id's ``state_dict()`` raises: a checkpoint cannot
continue that episode, which restarts from its prompt (``rollout/episodes_restarted``); the others continue at
their turn."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

_LOCK = threading.Lock()  # the driver's worker pool calls environments from several threads


class StepLog:
    """Answers ``steps`` model turns (``"step k"``), then says done; logs each call to ``log``.

    Args:
        log: The JSON-lines file every call is appended to (``{"env", "event", "step"}``).
        steps: Model turns the environment answers; the last one ends the episode.
        unsavable_every: Every this-many-th id (by its number) cannot be saved; 0: every id can.
    """

    def __init__(self, log: str, steps: int = 3, unsavable_every: int = 0) -> None:
        self.log, self.max_steps, self.unsavable_every = log, steps, unsavable_every
        self.env_id = ""
        self.steps = 0

    @property
    def savable(self) -> bool:
        return not self.unsavable_every or int(self.env_id, 16) % self.unsavable_every != 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.env_id, self.steps = uuid.uuid4().hex[:8], 0
        self._write("reset")
        return f"episode {self.env_id}", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        self._write("step")
        done = self.steps >= self.max_steps
        return f"step {self.steps}", float(done), done, False, {}

    def state_dict(self) -> dict[str, Any]:
        if not self.savable:
            raise NotImplementedError(f"episode {self.env_id}'s environment cannot be saved")
        return {"env_id": self.env_id, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.env_id, self.steps = state["env_id"], int(state["steps"])
        self._write("load")

    def _write(self, event: str) -> None:
        line = json.dumps({"env": self.env_id, "event": event, "step": self.steps, "savable": self.savable})
        with _LOCK, open(self.log, "a") as f:
            f.write(line + "\n")
