"""Training-step memory: the trainer's peak RSS for one GRPO step, the step as it was vs the token-budget step.

Both arms train the same model on the same batch (``--rows`` samples of ``--tokens`` tokens each, random token ids,
rewards that differ inside each group of 8), one Lightning step each, each in a fresh interpreter so one arm's
allocator cannot lend pages to the other:

- **old**: the whole mini-batch in one forward (``max_tokens_per_forward`` = the batch's tokens) and the full
  float32 ``[rows, tokens, vocab]`` logits, as the step was before micro-batching;
- **new**: the defaults (``max_tokens_per_forward`` derived from the model, the LM head scored in chunks).

Peak RSS is ``getrusage(RUSAGE_SELF).ru_maxrss`` of the arm's process after its step; "before" is the same reading
after the model and optimizer are built, so "step" (peak - before) is what the step alone added. Both arms print their
loss: it must agree (the same step, cut differently). The model is SmolLM2-135M-Instruct where it was prepared
(``--model``, default ``runs/smollm2/model``), else a tiny random Llama (``--tiny``). Mind the old arm's size: its
logits are ``rows x tokens x vocab x 4`` bytes (SmolLM2's vocabulary is 49,152: 32 x 256 tokens is 1.6 GB, several
times that with its gradient and the log-softmax).

The LAST line is ``ratio: X.XX`` = old peak RSS / new peak RSS (the whole process's; the line before it gives the
step-only ratio).

Usage::

    python benchmarks/train_memory.py [--rows 32 --tokens 256] [--model runs/smollm2/model | --tiny]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def batch(rows: int, tokens: int, vocab: int, group: int = 8) -> list:
    import torch

    from lightning_hybrid_rollout.rollout.sample import Sample

    g = torch.Generator().manual_seed(0)
    prompt_len = max(1, tokens // 4)
    out = []
    for i in range(rows):
        k, j = divmod(i, group)
        n = tokens - prompt_len
        out.append(
            Sample(
                uid=f"{k}-{j}",
                group_id=str(k),
                prompt="",
                prompt_token_ids=torch.randint(3, vocab, (prompt_len,), generator=g).tolist(),
                response_token_ids=torch.randint(3, vocab, (n,), generator=g).tolist(),
                response_logprobs=(-math.log(vocab) + 0.3 * torch.randn(n, generator=g)).tolist(),
                reward=float(j % 2),
                min_weight_version=0,
                max_weight_version=0,
            )
        )
    return out


def arm(name: str, model_dir: str, rows: int, tokens: int) -> dict:
    """One arm, in this (fresh) process: build, then one step; returns what it measured."""
    import logging

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

    from lightning_hybrid_rollout.lightning.cycle_report import peak_rss_bytes
    from lightning_hybrid_rollout.lightning.data import RolloutDataModule
    from lightning_hybrid_rollout.lightning.module import GRPOModule

    logging.getLogger("lightning").setLevel(logging.ERROR)
    old = name == "old"
    module = GRPOModule(model_path=model_dir, lr=1e-6, max_tokens_per_forward=rows * tokens if old else None)
    seen: dict = {}

    class Measure(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen["before"] = peak_rss_bytes()
            if old:
                pl_module._chunked_head_ok = False  # the full logits at once, as the step was

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            seen["loss"] = float(trainer.callback_metrics.get("train/loss", float("nan")))

    samples: list = []

    def source() -> list:
        if not samples:
            vocab = int(module.policy_model.get_output_embeddings().weight.shape[0])
            samples.extend(batch(rows, tokens, vocab))
        return list(samples)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=1,
            logger=False,
            callbacks=[Measure()],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp,
        )
        trainer.fit(module, datamodule=RolloutDataModule(source=source))
    return {
        "arm": name,
        "before": seen["before"],
        "peak": peak_rss_bytes(),
        "loss": seen["loss"],
        "tokens_per_forward": module.tokens_per_forward,
    }


def run_arm(name: str, model_dir: str, rows: int, tokens: int) -> dict:
    cmd = [sys.executable, __file__, "--arm", name, "--model", model_dir, "--rows", str(rows), "--tokens", str(tokens)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"the {name} arm failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--model", default=str(REPO / "runs" / "smollm2" / "model"))
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama instead of --model")
    p.add_argument("--arm", choices=["old", "new"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.model, args.rows, args.tokens)))
        return
    model_dir = args.model
    tmp = None
    if args.tiny or not Path(model_dir, "config.json").is_file():
        from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

        tmp = tempfile.TemporaryDirectory()
        model_dir = str(build_tiny_model(Path(tmp.name) / "tiny", hidden=128, layers=2, seed=0))
    print(f"model {model_dir}; batch {args.rows} rows x {args.tokens} tokens ({args.rows * args.tokens} tokens)")
    res = {name: run_arm(name, model_dir, args.rows, args.tokens) for name in ("old", "new")}
    print(f"{'arm':<5} {'before GB':>10} {'peak GB':>8} {'step GB':>8} {'tok/forward':>12} {'loss':>12}")
    for name, r in res.items():
        step = r["peak"] - r["before"]
        print(
            f"{name:<5} {r['before'] / 1e9:>10.2f} {r['peak'] / 1e9:>8.2f} {step / 1e9:>8.2f} "
            f"{r['tokens_per_forward']:>12} {r['loss']:>12.6f}"
        )
    old, new = res["old"], res["new"]
    if not math.isclose(old["loss"], new["loss"], rel_tol=1e-3, abs_tol=1e-5):
        raise SystemExit(f"the arms' losses disagree: {old['loss']} vs {new['loss']}")
    step_ratio = (old["peak"] - old["before"]) / max(1, new["peak"] - new["before"])
    print(f"step-only peak ratio (old/new): {step_ratio:.2f}")
    print(f"ratio: {old['peak'] / new['peak']:.2f}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
