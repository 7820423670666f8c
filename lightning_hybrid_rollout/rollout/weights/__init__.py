"""The weight path from the trainer to the engines, one concept per module.

- :mod:`.format`: the wire format shared by trainer and engines (safetensors buckets, dtype names, checksums);
- :mod:`.staging`: the shared-memory staging file (the trainer's node file and an engine's own);
- :mod:`.receiver`: what a push calls on a replica (the ``WeightReceiver`` protocol);
- :mod:`.base`: the transport interface and the typed requests that cross to the engine;
- :mod:`.factory`: the transport registry (name → module and classes, imported lazily);
- :mod:`.node_shm`, :mod:`.ray_store`, :mod:`.collective`, :mod:`.cuda_ipc`: one module per transport;
- :mod:`.push`: the bucket streaming and staged commit of ``node_shm`` / ``ray`` (mixed per replica by ``auto``);
- :mod:`.router`: ``rollout.weight_transport`` applied (which transport each replica takes);
- :mod:`.delta`: ``rollout.weight_encoding: delta`` (each version's changed elements, the engine's dense copy);
- :mod:`.report`: the push's report and the verdict on the replicas' checksums.

The package imports nothing at import time (each module is imported where it is used).
"""
