"""Hugging Face hub ids for models and data sets, resolved to local snapshot directories through the hub's own cache.

``rollout.model_path`` and ``dataset.path`` take a directory or a hub id (``org/name``), as ``from_pretrained`` and
``load_dataset`` do. An id is resolved once on the node that needs it (the trainer's ranks in the callback's
``setup``, each replica before its engine starts) with ``huggingface_hub.snapshot_download``: the cache under
``HF_HUB_CACHE`` / ``HF_HOME`` is used, ``HF_HUB_OFFLINE=1`` reads the cache only, and the result is the snapshot
directory every later step loads like any local one. A wrong id, a missing revision or an id absent from an offline
cache is one :class:`~lightning_hybrid_rollout.errors.ConfigError` line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lightning_hybrid_rollout.errors import ConfigError

__all__ = ["MODEL_FILES", "hub_cache_dir", "hub_offline", "is_hub_id", "resolve_dataset_path", "resolve_model_path"]

#: The files of a model snapshot a run loads (weights, config, tokenizer, chat template); everything else in the
#: repository (other formats, images, ONNX exports) is not downloaded.
MODEL_FILES: tuple[str, ...] = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py")
_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_TRUE = {"1", "on", "true", "yes"}
#: Snapshot directories resolved in this process, by (id, revision, kind, patterns, cache, offline).
_RESOLVED: dict[tuple[object, ...], str] = {}
_FILE_SUFFIXES = {".jsonl", ".json", ".parquet", ".csv", ".arrow", ".txt", ".yaml", ".yml", ".py", ".gguf"}


def is_hub_id(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a hub repository rather than a local path: ``org/name``, nothing on disk there."""
    text = str(path)
    if Path(text).suffix.lower() in _FILE_SUFFIXES:  # 'data/train.jsonl' is a missing file, not a repository
        return False
    return bool(_ID.match(text)) and not text.startswith(".") and not Path(text).expanduser().exists()


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (read per call, so a run's environment counts, not the one at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hub_cache_dir() -> Path:
    """The hub cache ``huggingface_hub`` uses: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache``'s."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def _download_command(repo_id: str, revision: str | None, repo_type: str) -> str:
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    return f"hf download {repo_id}{kind}" + (f" --revision {revision}" if revision else "")


def _snapshot(repo_id: str, revision: str | None, repo_type: str, key: str, allow: tuple[str, ...] | None) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    cache = hub_cache_dir()
    seen = (repo_id, revision, repo_type, allow, str(cache), offline)
    if seen in _RESOLVED:  # once per process: setup, the engine-args check and val_path ask for the same id
        return _RESOLVED[seen]
    what = f"{key} {repo_id!r}" + (f" (revision {revision!r})" if revision else "")
    try:
        _RESOLVED[seen] = snapshot_download(
            repo_id,
            repo_type=repo_type,
            revision=revision,
            cache_dir=str(cache),
            local_files_only=offline,
            allow_patterns=list(allow) if allow else None,
        )
        return _RESOLVED[seen]
    except RevisionNotFoundError:
        raise ConfigError(
            f"{what}: the hub repository has no such revision; give a branch, tag or commit it has, or drop it."
        ) from None
    except GatedRepoError:
        raise ConfigError(
            f"{what} is gated: accept its terms on huggingface.co and log in (`hf auth login` or HF_TOKEN)."
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{what} is neither a local path nor a hub {repo_type} repository: check the spelling, or point it at a "
            "local directory."
        ) from None
    except LocalEntryNotFoundError:
        if offline:
            raise ConfigError(
                f"{what} is no local path, and as a hub id it is not in the Hugging Face cache {str(cache)!r} and "
                "HF_HUB_OFFLINE=1 forbids downloading: "
                f"fetch it first (`{_download_command(repo_id, revision, repo_type)}`), or unset HF_HUB_OFFLINE."
            ) from None
        raise ConfigError(
            f"{what} is no local path, and as a hub id it could not be downloaded (no connection to the hub?) nor "
            f"found in the cache {str(cache)!r}: fix the path, or connect."
        ) from None
    except Exception as err:  # network and HTTP errors: one line, not a traceback
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"{what} could not be resolved from the hub ({type(err).__name__}: {first}).") from None


def resolve_model_path(path: str, revision: str | None = None, key: str = "rollout.model_path") -> str:
    """The local directory of a model: ``path`` itself when it is a path, else the hub id's snapshot directory.

    Args:
        path: A model directory or a hub id (``org/name``).
        revision: Branch, tag or commit of a hub id (None: its default branch); ignored for a directory.
        key: The config key named in messages.

    Raises:
        ConfigError: The id cannot be resolved (one line: the id, why, the fix).
    """
    if not is_hub_id(path):
        return path
    return _snapshot(path, revision, "model", key, MODEL_FILES)


def resolve_dataset_path(path: str, revision: str | None = None, key: str = "dataset.path") -> str:
    """The local directory of a data set repository: ``path`` itself when it is a path, else the hub id's snapshot
    (all its files: ``datasets.load_dataset`` then reads its configs and splits from the directory).

    Args:
        path: A local file or directory, or a hub data set id (``org/name``).
        revision: Branch, tag or commit of a hub id (None: its default branch); ignored for a path.
        key: The config key named in messages.

    Raises:
        ConfigError: The id cannot be resolved.
    """
    if not is_hub_id(path):
        return path
    return _snapshot(path, revision, "dataset", key, None)
