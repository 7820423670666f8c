"""Held-out validation without Lightning: scored answers, whole agentic episodes, and which one a run gets."""
