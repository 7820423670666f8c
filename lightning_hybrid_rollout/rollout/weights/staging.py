"""Shared-memory staging files for weight buckets: one class for the trainer's side and for an engine's side.

A :class:`SharedStaging` is an ``mmap`` of a file created 0600 in the run's private staging directory
(:func:`~lightning_hybrid_rollout.rollout.run_guard.default_staging_dir`: ``LHR_STAGING_DIR``, on ``/dev/shm`` when
writable). It has two users:

- **the trainer's node staging file** (prefix :data:`NODE_PREFIX`): a push writes each bucket into it once and every
  replica on the trainer's node maps it and loads zero-copy views straight from it (:mod:`.push`). Kept for later
  pushes in :data:`node_stagings` (its pages stay resident: no page faults after the first push); removed by
  :meth:`SharedStaging.close`, at interpreter exit, or with the run's staging directory (by the run's watchdog or
  the next run's sweep, :mod:`~lightning_hybrid_rollout.rollout.run_guard`) if the trainer died.
- **an engine's own staging file** (prefix :data:`ENGINE_PREFIX`): the replica actor copies the buckets that came
  through Ray's object store into it; the vLLM worker maps it, and the name is unlinked right after
  (:meth:`SharedStaging.unlink`), so nothing is left if the actor is killed
  (:mod:`lightning_hybrid_rollout.rollout.vllm.weight_updates`).
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import uuid
import weakref
from typing import Any

import numpy as np

from lightning_hybrid_rollout.rollout.run_guard import default_staging_dir

NODE_PREFIX = "node-weights-"
"""File-name prefix of the trainer's node staging files."""

ENGINE_PREFIX = "lhr-weights-"
"""File-name prefix of an engine's own staging file."""

MIN_STAGING_BYTES = 1 << 20
"""Smallest file made (a tiny push still gets 1 MiB, so the next small push reuses it)."""


def payload_nbytes(bucket: Any) -> int:
    """Serialized size of a :class:`~.format.WeightBucket` or of a safetensors blob (bytes, uint8 array)."""
    return int(bucket.nbytes) if hasattr(bucket, "write_into") else memoryview(bucket).nbytes


class SharedStaging:
    """A shared-memory file that weight buckets are written into and that another process maps.

    Args:
        directory: Where to create the file (default: the run's private staging directory,
            :func:`~lightning_hybrid_rollout.rollout.run_guard.default_staging_dir`).
        prefix: File-name prefix (:data:`NODE_PREFIX` for the trainer's node file, :data:`ENGINE_PREFIX` for an
            engine's own).

    Example::

        staging = SharedStaging(prefix=ENGINE_PREFIX)
        staging.ensure(3 << 20)  # a new 0600 file of 3 MiB (returns its path: the reader maps it)
        staging.close()  # unlinked and unmapped
    """

    def __init__(self, directory: str | None = None, prefix: str = NODE_PREFIX) -> None:
        self.directory = directory or str(default_staging_dir())
        self.prefix = prefix
        self.path: str | None = None
        self.size = 0
        self.inode = 0
        self._mm: mmap.mmap | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def allocated(self) -> bool:
        """Whether a file is mapped."""
        return self._mm is not None

    def ensure(self, nbytes: int, touch: bool = True) -> str | None:
        """Make the file at least ``nbytes`` long; a larger one replaces it (readers re-attach by path).

        Args:
            nbytes: Bytes the next writes need.
            touch: Fault the pages of a new file in now (zero them), not during the first write.

        Returns:
            The new file's path if one was created (a reader must map it), else ``None``.
        """
        if self._mm is not None and self.size >= nbytes:
            return None
        self.close()
        size = max(int(nbytes), MIN_STAGING_BYTES)
        path = os.path.join(self.directory, f"{self.prefix}{os.getpid()}-{uuid.uuid4().hex[:12]}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
            self.inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        self.path, self.size = path, size
        self._finalizer = weakref.finalize(self, _unlink_quietly, path)
        if touch:
            np.frombuffer(self._mm, dtype=np.uint8)[:] = 0
        return path

    def fits(self, offset: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at ``offset`` lie inside the file."""
        return self._mm is not None and offset + nbytes <= self.size

    def write(self, bucket: Any, offset: int, digests: dict[str, str] | None = None) -> int:
        """Copy a :class:`~.format.WeightBucket` or a safetensors blob into the file at ``offset``.

        ``digests``: a bucket's tensors' digests are added to it as they are copied
        (:meth:`~.format.WeightBucket.write_into`); a blob has none to add.

        Returns:
            The bytes written.

        Raises:
            ValueError: It does not fit (or no file is allocated).
        """
        n = payload_nbytes(bucket)
        if not self.fits(offset, n):
            raise ValueError(f"staging: bucket of {n} bytes at {offset} does not fit ({self.size})")
        dst = self.view()
        if hasattr(bucket, "write_into"):
            return bucket.write_into(dst, offset, digests)
        dst[offset : offset + n] = np.frombuffer(memoryview(bucket).cast("B"), dtype=np.uint8)
        return n

    def view(self) -> np.ndarray:
        """The file's bytes (a writable uint8 view; tests use it to tamper with what the readers will see)."""
        if self._mm is None:
            raise ValueError("staging file is not allocated")
        return np.frombuffer(self._mm, dtype=np.uint8)

    def unlink(self) -> None:
        """Remove the file name; every mapping stays valid (the memory is freed when the last process unmaps)."""
        if self.path is not None:
            _unlink_quietly(self.path)

    def close(self) -> None:
        """Unlink and unmap (readers keep their own mappings until they map a newer file)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        if self._mm is not None:
            with contextlib.suppress(BufferError):
                self._mm.close()
        self._mm, self.path, self.size, self.inode = None, None, 0, 0


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class StagingPool:
    """The trainer's node staging files that no running push uses.

    Concurrent pushes (e.g. standalone and hybrid) each take their own file; a finished push gives it back for the
    next one.
    """

    def __init__(self) -> None:
        self._free: list[SharedStaging] = []

    def acquire(self) -> SharedStaging:
        """A free node staging file (a new, not yet allocated one if none is free)."""
        return self._free.pop() if self._free else SharedStaging(prefix=NODE_PREFIX)

    def release(self, staging: SharedStaging) -> None:
        """Give ``staging`` back for a later push."""
        self._free.append(staging)

    def close_all(self) -> None:
        """Remove every free file."""
        while self._free:
            self._free.pop().close()


node_stagings = StagingPool()
"""The process's node staging files, reused across pushes."""


class AttachedStagings:
    """Which node staging file each replica has attached (``attach_node_staging`` answered True): a later push to it
    skips that round trip (~5-10 ms of a ~60-80 ms push of 84 MB to two CPU replicas) while the file is the same one.
    A replica that fails a push is forgotten, so the next push asks it again. Holds the replicas weakly."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[Any], tuple[str, int, int]]] = {}

    def get(self, replica: Any) -> tuple[str, int, int] | None:
        """``(path, size, inode)`` of the file ``replica`` attached, or None if not known."""
        entry = self._by_id.get(id(replica))
        return entry[1] if entry is not None and entry[0]() is replica else None

    def remember(self, replica: Any, staging: tuple[str, int, int]) -> None:
        """``replica`` attached ``staging`` (``(path, size, inode)``)."""
        try:
            key = id(replica)
            ref = weakref.ref(replica, lambda _: self._by_id.pop(key, None))
        except TypeError:  # not weakly referable (a test double): ask it every push
            return
        self._by_id[id(replica)] = (ref, staging)

    def forget(self, replica: Any) -> None:
        """Ask ``replica`` again at its next push."""
        entry = self._by_id.get(id(replica))
        if entry is not None and entry[0]() is replica:
            del self._by_id[id(replica)]


attached_stagings = AttachedStagings()
"""The process's record of which replicas mapped which node staging file (``push.py`` reads and updates it)."""


def release_node_stagings() -> None:
    """Free the node staging files kept for later pushes (call when the run ends; also runs at exit)."""
    node_stagings.close_all()


atexit.register(release_node_stagings)
