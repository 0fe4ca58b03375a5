"""Deep merge of a step's change into its parent's config."""

from __future__ import annotations

import copy
from typing import Any

from optlab.config.knobs import DISCRIMINATOR_KEYS


def deep_merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`change` over `base`, recursively for mappings.

    A mapping whose discriminator (`mode`, `kind`) changes is replaced, not merged:
    `batching: {mode: "off"}` over `{mode: dynamic, max_batch_size: 8}` must not keep
    max_batch_size, which "off" does not have.
    """
    merged = copy.deepcopy(base)
    for key, new in change.items():
        old = merged.get(key)
        if isinstance(old, dict) and isinstance(new, dict) and not _variant_changes(old, new):
            merged[key] = deep_merge(old, new)
        else:
            merged[key] = copy.deepcopy(new)
    return merged


def _variant_changes(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(k in new and k in old and new[k] != old[k] for k in DISCRIMINATOR_KEYS)
