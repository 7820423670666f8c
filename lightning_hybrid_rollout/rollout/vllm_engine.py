"""The vLLM engine's public names at their first import path; the code lives in :mod:`.vllm`.

:class:`VLLMEngineConfig` is in :mod:`.vllm.config`, :class:`VLLMEngine` (the driver in the replica actor) in
:mod:`.vllm.driver`, and the worker extension vLLM loads in its engine process in :mod:`.vllm.worker_extension`.
"""

from lightning_hybrid_rollout.errors import WeightLoadError
from lightning_hybrid_rollout.rollout.vllm.config import EngineState, VLLMEngineConfig, short_tmp_dir
from lightning_hybrid_rollout.rollout.vllm.driver import VLLMEngine

__all__ = ["EngineState", "VLLMEngine", "VLLMEngineConfig", "WeightLoadError", "short_tmp_dir"]
