"""The shared-memory staging file: one class for the trainer's node file and an engine's own file."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from lightning_hybrid_rollout.rollout.weights.format import make_bucket, parse_safetensors
from lightning_hybrid_rollout.rollout.weights.staging import (
    ENGINE_PREFIX,
    NODE_PREFIX,
    SharedStaging,
    StagingPool,
    payload_nbytes,
)


def _read(buf: object, offset: int) -> list[tuple[str, list[float]]]:
    return [(name, t.tolist()) for name, t in parse_safetensors(buf, offset)[0]]


def test_node_staging_is_reused_and_removed(tmp_path) -> None:
    st = SharedStaging(str(tmp_path))
    st.ensure(10_000)
    first = st.path
    st.ensure(5_000)  # big enough: same file
    assert st.path == first and os.path.exists(first)
    st.ensure(3 << 20)  # grows: a new file replaces the old one
    assert st.path != first and not os.path.exists(first) and st.size >= 3 << 20
    second = st.path
    assert os.stat(second).st_mode & 0o777 == 0o600  # never readable by another user
    assert os.path.basename(second).startswith(NODE_PREFIX)
    st.close()
    assert not os.path.exists(second)


def test_node_staging_defaults_to_the_runs_private_directory(tmp_path, monkeypatch) -> None:
    run_staging = tmp_path / "lhr-0-run"
    run_staging.mkdir(mode=0o700)
    monkeypatch.setenv("LHR_STAGING_DIR", str(run_staging))
    st = SharedStaging()
    st.ensure(1)
    assert os.path.dirname(st.path) == str(run_staging)
    st.close()


def test_engine_staging_unlinks_its_name_and_keeps_the_mapping(tmp_path) -> None:
    """An engine's own file: ``ensure`` says when a reader must map the new file; once it did, the name goes (nothing
    is left if the actor is killed) while both mappings keep working."""
    st = SharedStaging(str(tmp_path), prefix=ENGINE_PREFIX)
    path = st.ensure(4096, touch=False)
    assert path is not None and os.path.basename(path).startswith(ENGINE_PREFIX)
    assert os.stat(path).st_mode & 0o777 == 0o600 and st.size == 1 << 20  # at least 1 MiB
    assert st.ensure(2048) is None  # fits: same file, nobody re-maps
    import mmap

    with open(path, "rb") as f:
        reader = mmap.mmap(f.fileno(), st.size, access=mmap.ACCESS_READ)
    st.unlink()
    assert not os.path.exists(path) and st.allocated
    bucket = make_bucket([("w", torch.arange(6, dtype=torch.float32))])
    assert st.write(bucket, 100) == bucket.nbytes == payload_nbytes(bucket)
    blob = bucket.to_bytes()
    assert st.write(np.frombuffer(blob, dtype=np.uint8), 100 + len(blob)) == len(blob) == payload_nbytes(blob)
    for offset in (100, 100 + len(blob)):  # the reader sees what the writer wrote, through the unlinked file
        assert _read(reader, offset) == [("w", list(range(6)))]
    reader.close()
    with pytest.raises(ValueError, match="does not fit"):
        st.write(bucket, st.size - 10)
    st.close()
    assert not st.allocated and st.path is None
    with pytest.raises(ValueError, match="not allocated"):
        st.view()


def test_touch_faults_a_new_file_in_zeroed(tmp_path) -> None:
    st = SharedStaging(str(tmp_path))
    st.ensure(1 << 20)  # the node file: touched by default
    assert st.fits(0, 1 << 20) and not st.fits(1, 1 << 20) and not st.view().any()
    st.close()


def test_pool_hands_out_separate_files_and_reuses_released_ones(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LHR_STAGING_DIR", str(tmp_path))
    pool = StagingPool()
    a, b = pool.acquire(), pool.acquire()  # two concurrent pushes
    assert a is not b and a.prefix == NODE_PREFIX
    a.ensure(1)
    pool.release(a)
    assert pool.acquire() is a  # the next push reuses it (pages already resident)
    pool.release(a)
    path = a.path
    pool.close_all()
    assert not os.path.exists(path) and not a.allocated
