"""The integration lane: see the README's Tests section."""
