"""``log_rollouts: N``: the first N samples trained on in each cycle, written to ``<run dir>/rollouts/cycle_<k>.jsonl``
(one JSON object a line: messages, token ids, loss mask, log-probs, weight versions, reward), for reading what the
model and its tools actually said."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.rollout.sample import Sample

log = logging.getLogger(__name__)


def rollout_record(sample: Sample) -> dict[str, Any]:
    """One sample as plain data: its conversation (an episode's messages; None for a one-turn sample), its whole
    token sequence (prompt + response) with the prompt's length, the response's loss mask and log-probs, the
    weight version of each engine segment, and its reward."""
    episode = sample.metadata.get("episode") or {}
    return {
        "uid": sample.uid,
        "group_id": sample.group_id,
        "reward": sample.reward,
        "finish_reason": sample.finish_reason,
        "stop_reason": episode.get("stop_reason"),
        "turns": episode.get("turns", 1),
        "messages": episode.get("messages"),
        "prompt_length": len(sample.prompt_token_ids),
        "token_ids": [*sample.prompt_token_ids, *sample.response_token_ids],
        "loss_mask": list(sample.loss_mask) or [1] * len(sample.response_token_ids),
        "logprobs": list(sample.response_logprobs),
        "weight_versions": episode.get("weight_versions")
        or sorted({sample.min_weight_version, sample.max_weight_version}),
    }


class RolloutLog:
    """Keeps the first ``per_cycle`` samples each cycle trains on and writes them when the cycle closes.

    Args:
        run_dir: The run's directory (the files go to its ``rollouts/``).
        per_cycle: Samples kept per cycle (>= 1).
    """

    def __init__(self, run_dir: str | Path, per_cycle: int) -> None:
        self.dir = Path(run_dir) / "rollouts"
        self.per_cycle = int(per_cycle)
        self._kept: list[Sample] = []

    def keep(self, samples: Sequence[Sample]) -> None:
        """Keep samples of the cycle's batches until ``per_cycle`` are kept."""
        room = self.per_cycle - len(self._kept)
        if room > 0:
            self._kept.extend(samples[:room])

    def write(self, cycle: int) -> Path | None:
        """Write the kept samples to ``cycle_<cycle>.jsonl`` and start the next cycle's (None: nothing kept)."""
        kept, self._kept = self._kept, []
        if not kept:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"cycle_{cycle}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for sample in kept:
                f.write(json.dumps(rollout_record(sample), ensure_ascii=False) + "\n")
        log.debug("wrote %d rollouts to %s", len(kept), path)
        return path
