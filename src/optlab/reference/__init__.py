"""The reference workload optlab measures in its demo and tests: the image classifier, its
engines, `optlab serve`, the synthetic ground truth and the demo chain. The tracker's core never
imports this package (an import-linter contract in pyproject.toml).
"""
