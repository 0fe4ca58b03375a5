"""One module per kind of target, each exposing `KIND` (a `TargetKind`); loaded by name through
`optlab.targets.registry`, never imported directly."""
