"""Targets: what is measured. One module per kind under `kinds/` (builtin, synthetic, python,
http, command), found by name through `registry`; `base` is what the runner drives, `resolve`
checks a file's knobs and inputs the way its kind asks."""
