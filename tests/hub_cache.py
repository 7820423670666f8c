"""Write a Hugging Face hub cache in the hub's own layout (``<kind>s--org--name/{blobs,refs,snapshots}``), so tests
resolve hub ids offline exactly as ``huggingface_hub`` reads a cache it downloaded itself."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def add_to_hub_cache(cache: Path, repo_id: str, source: Path, repo_type: str = "model", revision: str = "main") -> Path:
    """Put every file under ``source`` into ``cache`` as repository ``repo_id`` at branch ``revision``.

    Files go to ``blobs/<sha256>``, the snapshot holds relative symlinks to them, ``refs/<revision>`` names the
    commit. Returns the snapshot directory.
    """
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    files = sorted(p for p in source.rglob("*") if p.is_file())
    commit = hashlib.sha1(b"".join(p.relative_to(source).as_posix().encode() for p in files)).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for f in files:
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snapshot / f.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot
