"""``benchmarks/weight_sync.py``'s memcpy baseline: a clone into fresh pages every run, whatever the allocator did.

glibc raises its mmap threshold after a large free; a clone then lands in freed, already-mapped memory and runs at
warm-copy speed (15-17 GB/s against 2-3 GB/s here), which once made the benchmark's ratio read 0.16 instead of ~1.
The baseline runs in a fresh interpreter with the threshold pinned, so every clone run pays for fresh pages.
"""

from __future__ import annotations

import torch

from tests.benchmarks import load_benchmark


def test_every_clone_run_of_the_baseline_pays_for_fresh_pages():
    # 24 tensors of 4 MiB (over glibc's largest dynamic threshold, 32 MiB, in total: a reused heap would hold them)
    tensors = [torch.randn(2**20) for _ in range(24)] + [torch.randn(64, 64).half()]
    result = load_benchmark("weight_sync").memcpy_gbps(tensors, runs=6)
    assert result["pinned"]
    assert len(result["clones"]) == 6 and result["clone"] == max(result["clones"])
    # a clone into fresh pages faults every page in: well below a warm copy into mapped memory, in every run
    assert max(result["clones"]) < 0.5 * result["copy"], result
