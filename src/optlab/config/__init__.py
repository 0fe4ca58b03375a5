"""Experiment files: pydantic models, loading, the knob models, limits and merging."""
