"""The machine and software fingerprint: collecting it, and comparing two."""
