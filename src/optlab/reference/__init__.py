"""The reference workload optlab measures in its demo and tests: the image classifier, its
engines, `optlab serve` and the synthetic ground truth. The tracker never imports this package,
and it never imports the tracker (import-linter contracts in pyproject.toml).
"""
