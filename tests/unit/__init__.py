"""The unit lane: see the README's Tests section."""
