"""The run on the trainer's global rank 0, without Lightning: runtime, hybrid pool, placement, workload."""
