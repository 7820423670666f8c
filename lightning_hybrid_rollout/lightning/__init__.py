from lightning_hybrid_rollout.lightning import strategies  # noqa: F401  (registers the hybrid_* strategies)
