"""The timing lane: see the README's Tests section."""
