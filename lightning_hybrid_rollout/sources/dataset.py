"""Prompts from a data file or a hub data set: :class:`DatasetSource`, a shuffled, epoch-counted, checkpointable row
stream loaded by Hugging Face ``datasets`` (a hub id through the hub's cache, ``hub.py``; no ``datasets``
cache left behind), every row checked before the first is drawn (docs/workloads.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from lightning_hybrid_rollout.errors import ConfigError, DatasetError
from lightning_hybrid_rollout.sources.base import Messages, PromptRecord, PromptSource
from lightning_hybrid_rollout.sources.config import DatasetConfig, suggest

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "ROLES", "DatasetSource", "check_prompt", "load_prompt_table"]

#: File suffix -> ``datasets`` packaged builder.
FORMATS: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
#: The chat roles a prompt message may have.
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")
_GIVE = "give a local .jsonl/.json/.parquet/.csv file, a save_to_disk directory or a hub data set id (org/name)"


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """Import ``datasets`` with its progress bars off for the block (restored after)."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _load_directory(path: Path, key: str, split: str = "train") -> Any:
    if (path / "dataset_dict.json").is_file():
        with _quiet_datasets() as datasets:
            splits = datasets.load_from_disk(str(path), keep_in_memory=True)
        if split not in splits:
            raise DatasetError(
                f"{key}: {path} holds the splits {sorted(splits)} but no {split!r}.{suggest(split, list(splits))} "
                f"Set dataset.train_split to one of them, or give that split's directory ({path}/<split>)"
            )
        return splits[split]
    if (path / "state.json").is_file() or (path / "dataset_info.json").is_file():
        with _quiet_datasets() as datasets:
            return datasets.load_from_disk(str(path), keep_in_memory=True)
    raise DatasetError(f"{key}: {path} is a directory but not one written by datasets save_to_disk; {_GIVE}")


def _load_files(files: list[Path], key: str) -> Any:
    suffixes = sorted({p.suffix.lower() for p in files})
    for p in files:
        if p.suffix.lower() not in FORMATS:
            raise DatasetError(f"{key}: {p} has unknown format {p.suffix or '(no suffix)'!r}; {_GIVE}")
        if p.stat().st_size == 0:
            raise DatasetError(f"{key}: {p} is empty; give a file with at least one row")
    builders = {FORMATS[s] for s in suffixes}
    if len(builders) > 1:
        raise DatasetError(f"{key}: the files mix formats ({', '.join(suffixes)}); give files of one format")
    builder, where = builders.pop(), _display(files)
    cache = tempfile.mkdtemp(prefix="lhr-datasets-")
    try:
        with _quiet_datasets() as datasets:
            return datasets.load_dataset(
                builder, data_files=[str(p) for p in files], split="train", cache_dir=cache, keep_in_memory=True
            )
    except Exception as err:  # datasets wraps parser errors in its own types
        if isinstance(err, StopIteration) or "corresponds to no data" in str(err):
            raise DatasetError(f"{key}: {where} has no rows; give a file with at least one row") from None
        raise DatasetError(
            f"{key}: {where} could not be read as {builder}: {_first_line(err)}; check that every row is valid "
            f"{builder} with the same columns"
        ) from err
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _load_hub(repo_id: str, key: str, source: HubSource) -> Any:
    """The ``source.split`` split of hub data set ``repo_id`` (its snapshot in the hub cache, fetched if need be)."""
    from lightning_hybrid_rollout.hub import resolve_dataset_path

    local = resolve_dataset_path(repo_id, source.revision, key)
    cache = tempfile.mkdtemp(prefix="lhr-datasets-")
    what = f"{key}: hub data set {repo_id!r}" + (f" (config {source.name!r})" if source.name else "")
    try:
        with _quiet_datasets() as datasets:
            try:
                splits = datasets.get_dataset_split_names(local, source.name)
            except Exception as err:  # an unknown config name: datasets lists the valid ones in its message
                raise DatasetError(
                    f"{what} cannot be read: {_first_line(err)}; set dataset.name to one of its configs"
                ) from None
            if source.split not in splits:
                raise DatasetError(
                    f"{what} has the splits {splits} but no {source.split!r}.{suggest(source.split, splits)} Set "
                    f"dataset.{source.split_key} to one of them"
                )
            return datasets.load_dataset(
                local, name=source.name, split=source.split, cache_dir=cache, keep_in_memory=True
            )
    except DatasetError:
        raise
    except Exception as err:
        raise DatasetError(f"{what} could not be loaded: {_first_line(err)}") from err
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class HubSource:
    """How a hub id (or a saved ``DatasetDict``) is read: its config, revision and split, and the split's key."""

    name: str | None = None
    revision: str | None = None
    split: str = "train"
    split_key: str = "train_split"

    @property
    def dict_split(self) -> str:
        """The split read from a saved ``DatasetDict`` directory: ``train_split`` (``val_path`` reads ``train``)."""
        return self.split if self.split_key == "train_split" else "train"


def _display(paths: list[Path]) -> str:
    return str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} files)"


def _load(path: str | list[str], key: str, source: HubSource | None = None) -> tuple[Any, str]:
    """The ``datasets.Dataset`` at ``path`` (a file, a list of files, a save_to_disk dir, a hub id) and its name."""
    from lightning_hybrid_rollout.hub import is_hub_id

    source = source or HubSource()
    if isinstance(path, str) and is_hub_id(path):
        return _load_hub(path, key, source), path
    paths = [Path(p).expanduser().absolute() for p in ([path] if isinstance(path, str) else path)]
    for p in paths:
        if not p.exists():
            raise DatasetError(f"{key}: {p} not found; {_GIVE}")
    if len(paths) == 1 and paths[0].is_dir():
        return _load_directory(paths[0], key, source.dict_split), str(paths[0])
    dirs = [p for p in paths if p.is_dir()]
    if dirs:
        raise DatasetError(f"{key}: {dirs[0]} is a directory inside a list of files; give files only, or one directory")
    return _load_files(paths, key), _display(paths)


def _check_message(where: str, row: int, j: int, msg: Any) -> dict[str, Any]:
    at = f"{where} row {row} (counting from 0), message {j}"
    fix = 'each message must be {"role": "<system|user|assistant>", "content": "<text>"}'
    if not isinstance(msg, Mapping):
        raise DatasetError(f"{at} is a {type(msg).__name__}, not a dict; {fix}")
    msg = {k: v for k, v in msg.items() if v is not None}  # Arrow fills keys other rows have with None
    for field in ("role", "content"):
        if not isinstance(msg.get(field), str):
            seen = "is missing" if field not in msg else f"is a {type(msg[field]).__name__}, not a string"
            raise DatasetError(f"{at}: {field!r} {seen}; {fix}")
    if msg["role"] not in ROLES:
        raise DatasetError(
            f"{at} has unknown role {msg['role']!r}.{suggest(msg['role'], ROLES)} Use one of {', '.join(ROLES)}"
        )
    return msg


def check_prompt(where: str, row: int, value: Any) -> str | Messages:
    """A row's prompt, checked and normalised (``None``-valued message keys dropped).

    Args:
        where: The file's display name (for the message).
        row: The row's position, counting from 0.
        value: The prompt column's value.

    Raises:
        DatasetError: not a non-empty string nor a non-empty list of well-formed messages.
    """
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"{where} row {row} (counting from 0): the prompt is empty; fill it in or drop the row")
        return value
    if isinstance(value, (list, tuple)) and value:
        return [_check_message(where, row, j, m) for j, m in enumerate(value)]
    raise DatasetError(
        f"{where} row {row} (counting from 0): the prompt must be a string or a non-empty list of "
        f'{{"role", "content"}} messages, got {type(value).__name__} {str(value)[:60]!r}'
    )


def load_prompt_table(
    path: str | list[str], prompt_column: str, key: str = "dataset.path", source: HubSource | None = None
) -> tuple[Any, list[str | Messages], str]:
    """Load and check a prompt data set: ``(dataset, prompts, display name)``.

    Args:
        path: A file, a list of files of one format, a ``save_to_disk`` directory, or a hub data set id.
        prompt_column: The column holding the prompts.
        key: The config key ``path`` came from (named in errors).
        source: The config, revision and split read from a hub id (default: its ``train`` split).

    Returns:
        The ``datasets.Dataset`` without its prompt column, every row's checked prompt, and the file's name.

    Raises:
        DatasetError: one line naming the file (row, column) and the fix.
    """
    ds, where = _load(path, key, source)
    if len(ds) == 0:
        raise DatasetError(f"{key}: {where} has no rows; give a file with at least one row")
    if prompt_column not in ds.column_names:
        raise DatasetError(
            f"{key}: {where} has no column {prompt_column!r} (columns: {', '.join(ds.column_names)})."
            f"{suggest(prompt_column, ds.column_names)} Set dataset.prompt_column to the column holding the prompts"
        )
    prompts = [check_prompt(where, i, v) for i, v in enumerate(ds[prompt_column][:])]
    return ds.remove_columns([prompt_column]), prompts, where


def _fingerprint(prompts: list, columns: list[str]) -> str:
    h = hashlib.blake2b(json.dumps(sorted(columns)).encode(), digest_size=8)
    for p in prompts:
        h.update(json.dumps(p, sort_keys=True).encode())
        h.update(b"\x00")
    return h.hexdigest()


def _permutation(n: int, *key: int) -> list[int]:
    import numpy as np

    return [int(i) for i in np.random.default_rng(list(key)).permutation(n)]


class DatasetSource(PromptSource):
    """Prompts from a local data set, shuffled per epoch, checkpointable (see the module docstring).

    Args:
        config: Where the rows are and how to draw them.
        seed: The run's seed, used when ``config.seed`` is ``None``.

    Raises:
        DatasetError: the file (or a row) cannot be used; the message names it and the fix.
        ConfigError: the stream's seed is negative.

    Example::

        source = DatasetSource(DatasetConfig(path="data/train.jsonl", val_split=0.1), seed=0)
        first = next(iter(source))  # PromptRecord(index=<row>, prompt=..., columns={...}, epoch=0)
        resumed = DatasetSource(DatasetConfig(path="data/train.jsonl", val_split=0.1), seed=0)
        resumed.load_state_dict(source.state_dict())  # continues after `first`
    """

    def __init__(self, config: DatasetConfig, *, seed: int = 0) -> None:
        self.config = config
        self.seed = config.seed if config.seed is not None else seed
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"dataset.seed (or the run's seed) must be an integer >= 0, got {self.seed!r}. E.g. 0.")
        hub = HubSource(config.name, config.revision, config.train_split, "train_split")
        self._others, self._prompts, where = load_prompt_table(config.path, config.prompt_column, source=hub)
        self.name = Path(where.split(" (+")[0]).stem or "prompts"  # the (first) file's stem
        self._column_names = list(self._others.column_names)
        self._train, self._held_out = self._split(where)
        self.fingerprint = _fingerprint([self._prompts[i] for i in self._train], self._column_names)
        self._val_records = self._load_validation()
        self._lock = threading.Lock()
        self._epoch = 0
        self._position = 0
        self._order: list[int] = []
        self._order_epoch = -1
        held = len(self._val_records)
        logger.info(
            "prompt source %s: %d training rows, %d held out, seed %d", where, len(self._train), held, self.seed
        )

    # ---- construction ---------------------------------------------------------------------------------------------
    def _split(self, where: str) -> tuple[list[int], list[int]]:
        """``(training rows, held-out rows)``, both in file order."""
        n, split = len(self._prompts), self.config.val_split
        if split is None:
            return list(range(n)), []
        k = split if isinstance(split, int) else max(1, round(split * n))
        if k >= n:
            raise DatasetError(
                f"dataset.val_split={split} holds out {k} of the {n} rows of {where}, leaving none to train on; "
                f"use a smaller val_split"
            )
        order = _permutation(n, self.seed, 1)
        return sorted(order[k:]), sorted(order[:k])

    def _load_validation(self) -> list[PromptRecord]:
        if self.config.val_path is not None:
            c = self.config
            hub = HubSource(c.name, c.revision, c.test_split, "test_split")
            others, prompts, _ = load_prompt_table(c.val_path, c.prompt_column, "dataset.val_path", hub)
            return [self._make(i, 0, prompts, others) for i in range(len(prompts))]
        return [self._make(i, 0) for i in self._held_out]

    def _make(self, row: int, epoch: int, prompts: list | None = None, others: Any = None) -> PromptRecord:
        prompts = self._prompts if prompts is None else prompts
        others = self._others if others is None else others
        prompt = prompts[row]
        columns = dict(others[row]) if others.column_names else {}
        return PromptRecord(
            index=row,
            prompt=prompt if isinstance(prompt, str) else [dict(m) for m in prompt],
            columns=columns,
            epoch=epoch,
        )

    # ---- the stream -----------------------------------------------------------------------------------------------
    def _order_for(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            if self.config.shuffle:
                self._order = [self._train[i] for i in _permutation(len(self._train), self.seed, 0, epoch)]
            else:
                self._order = self._train
            self._order_epoch = epoch
        return self._order

    def __iter__(self) -> Iterator[PromptRecord]:
        """Yield training records from the current position; ends after ``num_epochs`` epochs (never if ``None``)."""
        while True:
            with self._lock:
                if self.config.num_epochs is not None and self._epoch >= self.config.num_epochs:
                    return
                epoch, row = self._epoch, self._order_for(self._epoch)[self._position]
                self._position += 1
                if self._position == len(self._train):
                    self._epoch, self._position = self._epoch + 1, 0
            yield self._make(row, epoch)

    @property
    def epoch(self) -> int:
        """The epoch of the next record (= completed passes over the training rows)."""
        return self._epoch

    @property
    def num_rows(self) -> int:
        """Training rows per epoch (the rows of ``path`` minus those held out by ``val_split``)."""
        return len(self._train)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position", "num_rows", "fingerprint"}`` of the next record to be yielded."""
        with self._lock:
            return {
                "epoch": self._epoch,
                "position": self._position,
                "num_rows": len(self._train),
                "fingerprint": self.fingerprint,
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; raises if the training row count changed, warns if only the prompts did.

        Args:
            state: From :meth:`state_dict` of a source over the same data.

        Raises:
            DatasetError: a malformed state, or another number of training rows than when it was saved.
        """
        missing = [k for k in ("epoch", "position", "num_rows") if k not in state]
        if missing:
            raise DatasetError(
                f"prompt source state lacks {missing} (got {dict(state)}); pass DatasetSource.state_dict()"
            )
        epoch, position, rows = int(state["epoch"]), int(state["position"]), int(state["num_rows"])
        if rows != len(self._train):
            raise DatasetError(
                f"the checkpoint's prompt source had {rows} training rows, {self.name} has {len(self._train)} now; "
                f"restore the data file (and val_split) it was trained on, or resume without the prompt source state"
            )
        if epoch < 0 or not 0 <= position < rows:
            raise DatasetError(f"prompt source state has epoch={epoch}, position={position} outside 0..{rows - 1}")
        if state.get("fingerprint") not in (None, self.fingerprint):
            msg = "prompt source %s: the prompts differ from the checkpoint's (same %d rows); continuing at epoch %d"
            logger.warning(msg, self.name, rows, epoch)
        with self._lock:
            self._epoch, self._position = epoch, position

    # ---- extras ---------------------------------------------------------------------------------------------------
    def validation_records(self) -> list[PromptRecord]:
        """The ``val_path`` rows (``index`` = their row in that file), or the rows ``val_split`` held out."""
        return list(self._val_records)

    def preview(self, limit: int) -> list[PromptRecord]:
        """The first ``limit`` training rows in file order (the stream does not move)."""
        return [self._make(row, 0) for row in self._train[:limit]]

    def __repr__(self) -> str:
        return f"DatasetSource(name={self.name!r}, num_rows={len(self._train)}, epoch={self._epoch})"
