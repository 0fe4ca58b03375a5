"""The command line: a thin skin over the library (one module per command family)."""
