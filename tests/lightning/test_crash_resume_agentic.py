"""A trainer killed with SIGKILL while multi-turn episodes are in flight resumes from its last checkpoint: every
episode is trained once, each environment step of it runs once, and the restarted ones are counted.

The harness of ``test_crash_resume.py`` (:func:`~tests.lightning.test_crash_resume.crash_and_resume`: run 1 killed at a
pause point after a checkpoint, run 2 resumed from it) with ``environment`` set: every sample is an episode of
``_crash_envs.StepLog`` (Gymnasium's convention, 3 model turns, every call logged by the episode's environment id).
Half of its environments cannot be saved, and run 1 is killed only once its last checkpoint holds in-flight episodes
past their first turn of both kinds. The test checks:

- every sample the checkpoint holds is trained exactly once in run 2, none trained before it again;
- an in-flight episode the checkpoint can continue continues at its turn: same environment (restored by
  ``load_state_dict``), its saved tokens kept, only the steps after its saved ones run in run 2;
- one it cannot continue (its environment cannot be saved, or its turn had ended) restarts from its prompt with a new
  environment that runs every step, and the old one is never stepped again; run 2's ``rollout/episodes_restarted``
  in ``metrics.csv`` adds up to exactly those episodes;
- every environment in run 2 runs each of its steps once, and every trained episode ends by its environment's done.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.lightning.test_callback import column, read_metrics
from tests.lightning.test_crash_resume import assert_nothing_left, crash_and_resume, model_dir  # noqa: F401

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow

STEPS = 3  # model turns of every episode: the environment says done after its third step
#: Spec keys of ``_crash_run.py`` over the single-turn test's: 16-token turns (3 of them per episode), the step log
#: in each run's own directory (the runs' working directory), every second environment unsavable.
AGENTIC: dict[str, Any] = {
    "environment": f"{HERE / '_crash_envs.py'}:StepLog",
    "environment_kwargs": {"log": "env_steps.jsonl", "steps": STEPS, "unsavable_every": 2},
    "response_length": 16,
    "max_turns": 8,
    "max_episode_tokens": 320,
    "max_model_len": 320,
}
ENV_ID = re.compile(r"episode ([0-9a-f]{8})")


def _env_id(episode: dict[str, Any]) -> str:
    """The episode's environment id, from the reset text its prompt carries."""
    for message in episode["messages"]:
        found = ENV_ID.search(message.get("content") or "")
        if found:
            return found.group(1)
    raise AssertionError(f"no environment id in {episode['messages']!r:.300}")


def _steps(log: Path) -> dict[str, list[int]]:
    """Each environment's steps, in the order they ran (a line cut by the SIGKILL is skipped)."""
    steps: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event["event"] == "step":
            steps[event["env"]].append(event["step"])
    return steps


def test_a_trainer_killed_with_episodes_in_flight_resumes_each_episode_once_restarts_counted(
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    cr = crash_and_resume(tmp_path, model_dir, **AGENTIC)
    in_flight = {u: s for u, s in cr.pending.items() if s["result"] is None}
    continued = {u: s for u, s in in_flight.items() if s["episode"] and s["episode"]["continuable"]}
    # the driver restarts an in-flight sample that had begun its episode and cannot continue it
    restarted = {u: s for u, s in in_flight.items() if (s["episode"] or s["tokens"]) and u not in continued}
    mid = {u for u, s in in_flight.items() if s["episode"] and s["episode"]["turns"] > 0}
    assert mid & set(continued) and mid & set(restarted), (len(mid), len(continued), len(restarted))

    steps1, steps2 = _steps(cr.run1 / "env_steps.jsonl"), _steps(cr.run2 / "env_steps.jsonl")
    for env, steps in steps2.items():  # each step of an environment once, in order, from where it was restored
        assert steps == list(range(steps[0], steps[0] + len(steps))) and steps[-1] <= STEPS, (env, steps)
    for r in cr.trained2:  # every trained episode ran its turns to the environment's done
        ep = r["episode"]
        assert ep["stop_reason"] == "environment_done" and ep["turns"] == ep["tool_calls"] == STEPS, (r["uid"], ep)

    for uid, s in cr.buffered.items():  # trained as buffered: its environment is not stepped again
        r = cr.by_uid[uid]
        assert r["tokens"] == s["tokens"] and _env_id(r["episode"]) not in steps2, uid
    for uid, s in cr.pending.items():  # finished in a group that was not: trained as it finished
        if s["result"] is not None:
            r = cr.by_uid[uid]
            assert r["tokens"] == s["result"]["tokens"] and _env_id(r["episode"]) not in steps2, uid
    for uid, s in continued.items():  # at its turn: the same environment, the saved tokens, the remaining steps
        saved, r = s["episode"], cr.by_uid[uid]
        env, done = saved["env_state"]["env_id"], saved["env_state"]["steps"]
        assert _env_id(r["episode"]) == env and done == saved["turns"], (uid, saved["env_state"], saved["turns"])
        assert steps1[env][:done] == list(range(1, done + 1)), (uid, steps1[env])  # its steps before the checkpoint
        assert steps2.get(env, []) == list(range(done + 1, STEPS + 1)), (uid, steps2.get(env))
        n = len(s["tokens"])
        assert r["tokens"][:n] == s["tokens"] and r["logprobs"][:n] == s["logprobs"], uid
    for uid, s in restarted.items():  # from its prompt: a new environment runs every step; the old one never again
        r = cr.by_uid[uid]
        env = _env_id(r["episode"])
        assert steps2[env] == list(range(1, STEPS + 1)), (uid, steps2[env])
        if s["episode"]:
            assert _env_id(s["episode"]) not in steps2 and _env_id(s["episode"]) != env, uid
    for uid in set(in_flight) - set(continued) - set(restarted):  # not begun at the checkpoint: started in run 2
        assert steps2[_env_id(cr.by_uid[uid]["episode"])] == list(range(1, STEPS + 1)), uid

    counted = column(read_metrics(str(cr.run2)), "rollout/episodes_restarted")
    assert counted and sum(counted) == len(restarted), (counted, sorted(restarted))
    assert_nothing_left(cr)

    numbers = {
        "checkpoint_step": cr.ck,
        "buffered": len(cr.buffered),
        "in_flight": len(in_flight),
        "in_flight_mid_episode": len(mid),
        "continued": len(continued),
        "restarted": len(restarted),
        "restarted_counted": sum(counted),
        "trained_once_after_resume": len(cr.expect),
        "wall_s": round(cr.wall_s, 1),
    }
    (tmp_path / "numbers.json").write_text(json.dumps(numbers))
    print(f"crash-resume-agentic: {json.dumps(numbers)}")
