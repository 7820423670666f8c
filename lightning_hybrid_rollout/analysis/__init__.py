"""What reads a finished run: its balance bound and time breakdown (:mod:`.run_bound`), the trace's PNGs
(:mod:`.plots`) and ``lhr report`` (:mod:`.report`); the trace format is :mod:`lightning_hybrid_rollout.trace`."""
