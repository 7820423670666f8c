"""Build a tiny random Llama + char-level tokenizer on disk, loadable by both vLLM and transformers, offline.

The defaults are the configuration design/notes.md §7 measured to learn small addition with GRPO on one CPU core in a
few
minutes (hidden 128, 2 layers, 4 heads, intermediate 512, tied embeddings, standard init). The tokenizer is a
WordLevel vocabulary over single characters (digits, a few operators, ASCII letters), prepends ``<s>`` and ends
answers with ``</s>``; unused ids are filled with ``<xN>`` placeholders so every id decodes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import string
import tempfile
import uuid
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Marker written last; its content (the build arguments) makes :func:`build_tiny_model` idempotent.
MARKER = "lhr_tiny_model.json"
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
CHARS = tuple(string.digits) + tuple("+-*/=()., ?!:") + tuple(string.ascii_lowercase) + tuple(string.ascii_uppercase)
_FORMAT_VERSION = 1


def tiny_vocab(vocab_size: int = 128) -> dict[str, int]:
    """The char-level vocabulary: special tokens, characters, then ``<xN>`` fillers up to ``vocab_size``."""
    toks = list(SPECIALS) + list(CHARS)
    if vocab_size < len(toks):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the {len(toks)} tokens the tokenizer needs")
    toks += [f"<x{i}>" for i in range(vocab_size - len(toks))]
    return {t: i for i, t in enumerate(toks)}


def build_tiny_tokenizer(vocab_size: int = 128, add_bos: bool = True) -> Any:
    """A ``PreTrainedTokenizerFast`` splitting text into single characters.

    Args:
        vocab_size: Size of the vocabulary (fillers pad it up).
        add_bos: Prepend ``<s>`` when encoding with special tokens (vLLM does for text prompts, so does
            ``tokenizer(text)``).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = tiny_vocab(vocab_size)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    hidden: int = 128,
    layers: int = 2,
    seed: int = 0,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    vocab_size: int = 128,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = True,
    init_scale: float = 1.0,
    add_bos: bool = True,
) -> Path:
    """Write a random float32 ``LlamaForCausalLM`` + tokenizer + generation config to ``out_dir``.

    Idempotent: if ``out_dir`` already holds a model built with the same arguments it is returned untouched; a
    model built with other arguments is replaced. Building goes through a temporary sibling directory and a rename,
    so concurrent builders (parallel test sessions) never see a half-written model.

    Args:
        out_dir: Target directory.
        hidden: Hidden size.
        layers: Number of decoder layers.
        seed: Seed of the random initialisation.
        heads: Attention heads (default ``hidden // 32``, head dim 32; vLLM's CPU attention needs a head dim in
            {32, 64, 80, 96, 112, 128, ...}).
        kv_heads: Key/value heads (default ``heads``).
        intermediate: MLP size (default ``4 * hidden``).
        vocab_size: Vocabulary size (>= 81).
        max_position_embeddings: Longest sequence the model accepts.
        tie_word_embeddings: Share the input embedding with the LM head.
        init_scale: Multiply every matrix by this after init (> 1 makes random greedy outputs more varied).
        add_bos: Tokenizer prepends ``<s>``.

    Returns:
        The model directory.
    """
    out = Path(out_dir).absolute()
    heads = heads if heads is not None else max(1, hidden // 32)
    kv_heads = kv_heads if kv_heads is not None else heads
    intermediate = intermediate if intermediate is not None else 4 * hidden
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not divisible by heads={heads}")
    if heads % kv_heads:
        raise ValueError(f"heads={heads} is not divisible by kv_heads={kv_heads}")
    args = {
        "format": _FORMAT_VERSION,
        "hidden": hidden,
        "layers": layers,
        "seed": seed,
        "heads": heads,
        "kv_heads": kv_heads,
        "intermediate": intermediate,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "init_scale": init_scale,
        "add_bos": add_bos,
    }
    if _build_args(_read_marker(out)) == args:
        logger.debug("tiny model at %s already built with %s", out, args)
        return out

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build_tiny_tokenizer(vocab_size, add_bos=add_bos).save_pretrained(tmp)
        cfg = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=hidden // heads,
            max_position_embeddings=max_position_embeddings,
            bos_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
            tie_word_embeddings=tie_word_embeddings,
            dtype="float32",
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(cfg).to(torch.float32)
            if init_scale != 1.0:
                with torch.no_grad():
                    for p in model.parameters():
                        if p.dim() > 1:
                            p.mul_(init_scale)
        model.save_pretrained(tmp, safe_serialization=True)
        GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(args, sort_keys=True))
        _install(tmp, out, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = sum(p.numel() for p in model.parameters())
    logger.info("built tiny model at %s (%d params, %s)", out, n, args)
    return out


def _build_args(marker: dict[str, Any] | None) -> dict[str, Any] | None:
    """The build arguments of a marker (without what later steps, like the format warm-up, recorded)."""
    if marker is None:
        return None
    return {k: v for k, v in marker.items() if k != "warmup"}


def warm_up_format(
    model_dir: str | os.PathLike[str],
    task: Any,
    steps: int = 100,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 1e-3,
    threads: int | None = None,
) -> Path:
    """Teach a tiny model the *shape* of the task's answers (prompt → random answer → end token), in place.

    design/notes.md §7: ~100 supervised steps on random answers of the right form (content uninformative, so the reward
    of
    the warmed model stays at chance) make GRPO from a random init reliable. The loss covers the answer and the end
    token only. Idempotent: a warm-up with the same task, steps and seed recorded in the marker is skipped.

    Args:
        model_dir: A model built by :func:`build_tiny_model` (weights are overwritten).
        task: A :class:`~lightning_hybrid_rollout.tasks.base.Task` (its prompts and ``random_response``).
        steps: Optimizer steps.
        seed: Seed of the prompts and random answers.
        batch_size: Examples per step.
        lr: AdamW learning rate.
        threads: torch threads during the warm-up (default: unchanged).

    Returns:
        ``model_dir``.
    """
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(model_dir)
    marker = _read_marker(out) or {}
    record = {"task": repr(task), "steps": steps, "seed": seed, "batch_size": batch_size, "lr": lr}
    if marker.get("warmup") == record:
        logger.debug("format warm-up already applied to %s", out)
        return out
    if steps <= 0:
        return out
    tok = AutoTokenizer.from_pretrained(out)
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
            rng = random.Random(seed)
            stream = task.prompts(seed=seed)
            loss = torch.zeros(())
            for _ in range(steps):
                rows, labels = [], []
                for _ in range(batch_size):
                    p = next(stream)
                    prompt_ids = tok(p.prompt).input_ids
                    answer_ids = [*tok(task.random_response(rng), add_special_tokens=False).input_ids, tok.eos_token_id]
                    rows.append(prompt_ids + answer_ids)
                    labels.append([-100] * len(prompt_ids) + answer_ids)
                width = max(len(r) for r in rows)
                ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
                lab = torch.full((len(rows), width), -100, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for i, (r, lb) in enumerate(zip(rows, labels)):
                    ids[i, : len(r)] = torch.tensor(r)
                    lab[i, : len(lb)] = torch.tensor(lb)
                    mask[i, : len(r)] = 1
                loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
            model.eval()
            model.save_pretrained(out, safe_serialization=True)
    finally:
        if threads:
            torch.set_num_threads(old_threads)
    marker["warmup"] = record
    (out / MARKER).write_text(json.dumps(marker, sort_keys=True))
    logger.info("format warm-up of %s: %d steps on %r, final loss %.3f", out, steps, task, loss.detach().item())
    return out


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _install(tmp: Path, out: Path, args: dict[str, Any]) -> None:
    """Move the finished build into place, tolerating a concurrent builder that got there first."""
    if out.exists():
        if _build_args(_read_marker(out)) == args:
            return
        # stale or foreign content: move it aside atomically, then delete
        trash = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(out, trash)
        except OSError:
            if _build_args(_read_marker(out)) == args:
                return
            raise
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(tmp, out)
    except OSError:
        if _build_args(_read_marker(out)) != args:
            raise RuntimeError(
                f"could not install the tiny model at {out}: the directory exists with other content "
                f"(another process building different arguments?); remove it or pick another out_dir"
            ) from None
