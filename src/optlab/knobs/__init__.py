"""`optlab sweep-knob` and `optlab tune`: which value of a knob, measured interleaved
against the parent."""
