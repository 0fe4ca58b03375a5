"""The one JSON spelling optlab hashes and stores: sorted keys, no whitespace, no NaN."""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any, *, ascii_only: bool = False) -> str:
    """`value` as canonical JSON. NaN and infinities are refused (ValueError): they are not JSON,
    and a stored NaN would read back as valid. `ascii_only` escapes non-ASCII characters, the
    spelling config hashes have always used (changing it would orphan stored configs)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, allow_nan=False
    )
