"""The weight path from the trainer to the engines, one concept per module.

- :mod:`.format`: the wire format shared by trainer and engines (safetensors buckets, dtype names, checksums);
- :mod:`.staging`: the shared-memory staging file (the trainer's node file and an engine's own);
- :mod:`.receiver`: what a push calls on a replica (the ``WeightReceiver`` protocols);
- :mod:`.push`: the CPU push (bucket plan, streaming, staged commit) and its test seam;
- :mod:`.transports`: the GPU transports (CUDA IPC, NCCL);
- :mod:`.report`: the push's report and the verdict on the replicas' checksums.

The package imports nothing at import time (each module is imported where it is used).
"""
