"""vLLM engines, in the two processes they span.

In the replica actor (the frontend): :mod:`.config` (``VLLMEngineConfig``), :mod:`.driver` (``VLLMEngine``: start,
generation, sleep / wake, health) and :mod:`.weight_updates` (the driver's half of a weight update). Inside vLLM's
``EngineCore`` / worker process: :mod:`.worker_extension` (``LHRWorkerExtension``, loaded by vLLM from its dotted
path) and :mod:`.direct_reload` (the CPU oneDNN direct reload).
"""
