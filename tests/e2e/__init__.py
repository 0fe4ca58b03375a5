"""The e2e lane: see the README's Tests section."""
