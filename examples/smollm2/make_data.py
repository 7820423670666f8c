"""Write the SmolLM2 example's data files: verifiable sums from reasoning-gym's ``chain_sum``, as chat prompts.

    python examples/smollm2/make_data.py --out runs/smollm2/data

Writes ``train.jsonl`` and ``val.jsonl``: each row has ``prompt`` (a list of chat messages) and ``answer`` (the
sum, a string), which reaches the reward function ``examples/smollm2/rewards.py:sum_correct`` as a column.
Offline: reasoning-gym generates the problems from a seed (``pip install 'lightning-hybrid-rollout[smollm2]'``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

INSTRUCTION = "Compute the sum. Reply with only the final number."


def rows(size: int, seed: int, max_terms: int, max_digits: int) -> list[dict[str, object]]:
    """``size`` chain-sum problems as rows of ``{"prompt": [messages], "answer": str}``."""
    import reasoning_gym

    data = reasoning_gym.create_dataset(
        "chain_sum", size=size, seed=seed, min_terms=2, max_terms=max_terms, min_digits=1, max_digits=max_digits
    )
    out = []
    for item in data:
        expression = item["metadata"]["expression"]
        out.append(
            {"prompt": [{"role": "user", "content": f"{INSTRUCTION}\n{expression} ="}], "answer": item["answer"]}
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/smollm2/data", help="directory for train.jsonl and val.jsonl")
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--val-size", type=int, default=64)
    parser.add_argument("--max-terms", type=int, default=2)
    parser.add_argument("--max-digits", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, size, seed in (("train", args.train_size, args.seed), ("val", args.val_size, args.seed + 1)):
        path = out / f"{name}.jsonl"
        with path.open("w") as f:
            for row in rows(size, seed, args.max_terms, args.max_digits):
                f.write(json.dumps(row) + "\n")
    print(f"wrote {args.train_size} training and {args.val_size} validation prompts to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
