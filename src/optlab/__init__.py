"""optlab: an optimization experiment tracker that enforces one variable at a time."""

__version__ = "0.1.0"

__all__ = ["__version__"]
