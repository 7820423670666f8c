"""The trainer's GRPO math without Lightning: micro-batches, chunked and shared-prompt log-probs, off-policy, LoRA."""
