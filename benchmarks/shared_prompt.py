"""What the shared-prompt forward saves: a GRPO training step with ``shared_prompt_forward`` on vs off, side by side.

One :class:`~lightning_hybrid_rollout.lightning.module.GRPOModule` per mode, both on the same model weights and the
same batch, in this process pinned to one core with one torch thread (the trainer's setting on the CPU miniature).
The batch is shaped like the CPU miniature's step (``benchmarks/cpu_miniature.py``): ``--groups`` prompts of
``--prompt-tokens`` tokens, ``--n`` sampled responses each of 10 to ``--response-tokens`` tokens (right-padded),
micro-batches of ``--micro-batch-size`` rows; a step is what ``GRPOModule``'s manual optimisation does (the loss of
every micro-batch, backward, gradient clipping, AdamW). The modes alternate step by step, so the machine's drift
cancels; the first ``--warmup`` steps of each are not counted. It prints each mode's median step time and, as its
LAST line, ``shared / plain step time: X.XX``.

By default the model is the CPU miniature's (the tiny char-level Llama, hidden 64, 2 layers, built in a temporary
directory); ``--model PATH`` takes any Hugging Face causal LM directory (e.g. SmolLM2-135M-Instruct, design/notes.md §8:
use smaller ``--groups``).

Usage::

    python benchmarks/shared_prompt.py                     # the miniature's step: 32 groups of 8, 23 + 17 tokens
    python benchmarks/shared_prompt.py --model ~/models/SmolLM2-135M-Instruct --groups 2 --prompt-tokens 128
    python benchmarks/shared_prompt.py --model DIR --device cuda --autocast-bf16 --groups 4 --prompt-tokens 512 \
        --response-tokens 256 --micro-batch-size 8 --core -1      # a GPU's step, mixed precision
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lightning_hybrid_rollout.lightning.data import RolloutBatch
from lightning_hybrid_rollout.lightning.module import GRPOModule


def make_batch(groups: int, n: int, prompt_tokens: int, response_tokens: int, vocab: int, seed: int) -> RolloutBatch:
    """``groups * n`` rows: each group's prompt repeated ``n`` times, responses of 10..``response_tokens`` tokens."""
    g = torch.Generator().manual_seed(seed)
    rows, width = groups * n, prompt_tokens + response_tokens
    prompts = torch.randint(4, vocab, (groups, prompt_tokens), generator=g).repeat_interleave(n, dim=0)
    lengths = torch.randint(min(10, response_tokens), response_tokens + 1, (rows,), generator=g)
    response_mask = (torch.arange(response_tokens)[None] < lengths[:, None]).float()
    responses = torch.randint(4, vocab, (rows, response_tokens), generator=g) * response_mask.long()
    mask = torch.cat([torch.zeros(rows, prompt_tokens), response_mask], dim=1)
    return RolloutBatch(
        input_ids=torch.cat([prompts, responses], dim=1),
        attention_mask=torch.cat([torch.ones(rows, prompt_tokens, dtype=torch.long), response_mask.long()], dim=1),
        response_mask=mask,
        rollout_logprobs=-torch.rand(rows, width, generator=g) * mask,
        rewards=torch.rand(rows, generator=g),
        advantages=torch.randn(rows, generator=g),
        group_ids=torch.arange(rows) // n,
        group_reward_std=torch.ones(rows),
        weight_version_min=torch.zeros(rows, dtype=torch.long),
        weight_version_max=torch.zeros(rows, dtype=torch.long),
        truncated=torch.zeros(rows),
    )


def step(module: GRPOModule, optimizer: torch.optim.Optimizer, batch: RolloutBatch, micro: int) -> float:
    """One optimizer step as ``GRPOModule._manual_update`` takes it; returns its seconds."""
    if batch.input_ids.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    token_count = module.loss_mask(batch).sum()
    optimizer.zero_grad()
    for mb in batch.split(micro):
        loss, _ = module.compute_loss(mb, token_count=token_count)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
    optimizer.step()
    if batch.input_ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a Hugging Face causal LM directory (default: the tiny model)")
    p.add_argument("--groups", type=int, default=32, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="responses per prompt (GRPO group size)")
    p.add_argument("--prompt-tokens", type=int, default=23)
    p.add_argument("--response-tokens", type=int, default=17)
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=20, help="counted steps per mode")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--core", type=int, default=0, help="the core to pin to (-1: no pinning)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (then a GPU's step: the timings synchronize)")
    p.add_argument(
        "--autocast-bf16", action="store_true", help="run the step under torch.autocast(bfloat16) (mixed precision)"
    )
    args = p.parse_args()
    if args.core >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

            model_dir = str(Path(tmp) / "tiny")
            build_tiny_model(model_dir, hidden=64, layers=2, seed=0)
        modules = {}
        for mode in ("plain", "shared"):
            module = GRPOModule(
                model_path=model_dir,
                micro_batch_size=args.micro_batch_size,
                grad_clip=1.0,
                shared_prompt_forward=mode == "shared",
            )
            module.configure_model()
            module.to(args.device)
            if modules:  # the same weights in both modes
                module.policy_model.load_state_dict(next(iter(modules.values()))[0].policy_model.state_dict())
            modules[mode] = (module, torch.optim.AdamW(module.parameters(), lr=1e-6))
        vocab = int(modules["plain"][0].policy_model.config.vocab_size)
        batch = make_batch(args.groups, args.n, args.prompt_tokens, args.response_tokens, vocab, seed=0)
        batch = batch.to(args.device)
        autocast = torch.autocast(batch.input_ids.device.type, torch.bfloat16, enabled=args.autocast_bf16)
        times: dict[str, list[float]] = {mode: [] for mode in modules}
        for i in range(args.warmup + args.steps):
            for mode in ("plain", "shared") if i % 2 == 0 else ("shared", "plain"):
                with autocast:
                    seconds = step(*modules[mode], batch, args.micro_batch_size)
                if i >= args.warmup:
                    times[mode].append(seconds)
        auto = GRPOModule(model=modules["plain"][0].policy_model)  # shared_prompt_forward=None: the default
        default_on = auto._shared_prompt_wanted(batch)
    rows = len(batch)
    print(
        f"step of {rows} rows ({args.groups} prompts x {args.n}, {args.prompt_tokens} prompt + up to "
        f"{args.response_tokens} response tokens, micro-batches of {args.micro_batch_size}), {args.steps} steps each:"
    )
    med = {mode: statistics.median(ts) for mode, ts in times.items()}
    for mode, ts in times.items():
        print(f"  {mode:6} median {med[mode] * 1e3:7.1f} ms  (min {min(ts) * 1e3:.1f}, max {max(ts) * 1e3:.1f})")
    default = "shared" if default_on else "plain"
    print(f"the default (shared_prompt_forward=None) on {batch.input_ids.device.type}: the {default} forward")
    print(f"shared / plain step time: {med['shared'] / med['plain']:.2f}")


if __name__ == "__main__":
    main()
