"""W3C Server-Timing headers, read into the request's stages (durations in ns)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from optlab.metrics.stages import RESERVED_STAGE

__all__ = ["parse_server_timing", "split_server_timing"]

# A Server-Timing entry: a token name, then ;param=value pairs (RFC 8941-ish, as browsers read it).
_ENTRY = re.compile(r"\s*([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*((?:;.*)?)$", re.DOTALL)
_DUR = re.compile(r";\s*dur\s*=\s*\"?([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\"?", re.IGNORECASE)
# The same reading in one pattern, for a header without quotes: an entry (from the start or a
# comma) is a name, optional spaces, then `;` params of which the first `dur=` counts.
_FAST = re.compile(
    r"(?:^|,)\s*([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*;(?:[^,]*?;)??\s*(?i:dur)\s*=\s*"
    r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)[^,]*"
)


def parse_server_timing(values: Sequence[str]) -> dict[str, int]:
    """W3C Server-Timing header values -> {name: duration ns}; entries without dur are skipped.

    `total` is the harness's own series (the client-side latency), so a server's `total`
    becomes `server_total`. Repeated names add up, as repeated stage() blocks do.
    """
    stages: dict[str, int] = {}
    for value in values:
        # One pass of one regex over a header without quotes (the usual `a;dur=1.2, b;dur=3`);
        # a quoted desc may hold commas and semicolons, so that header is split entry by entry.
        found = _FAST.findall(value) if '"' not in value else split_server_timing(value)
        for name, ms in found:
            if name == RESERVED_STAGE:
                name = "server_total"
            name = name[:64]
            stages[name] = stages.get(name, 0) + round(float(ms) * 1e6)
    return stages


def split_server_timing(value: str) -> list[tuple[str, str]]:
    """(name, dur in ms) of each entry of one header value, read entry by entry: the careful
    path (a quoted desc may hold commas and semicolons), which the one-regex path agrees with."""
    found = []
    for part in _split_entries(value):
        match = _ENTRY.match(part)
        if match is None:
            continue
        dur = _DUR.search(match.group(2))
        if dur is not None:
            found.append((match.group(1), dur.group(1)))
    return found


def _split_entries(value: str) -> list[str]:
    # Commas separate entries, except inside a quoted desc="a, b".
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in value:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]
