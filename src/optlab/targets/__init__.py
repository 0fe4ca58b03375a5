"""Targets: what is measured (built-in pipeline, Python factory, command, HTTP service)."""
