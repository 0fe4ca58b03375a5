"""Experiment files: pydantic models, the load modes, loading, the knob models, limits and
merging."""
