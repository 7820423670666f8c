"""What reads a finished run: its balance bound and time breakdown (:mod:`.run_bound`) and ``lhr report``
(:mod:`.report`); the trace format is :mod:`lightning_hybrid_rollout.trace`, its PNGs
:mod:`lightning_hybrid_rollout.trace_plots`."""
