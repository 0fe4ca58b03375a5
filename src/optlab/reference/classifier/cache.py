"""The reference pipeline's response cache: content-addressed, LRU-bounded, optional TTL.

Keys are digests of the request bytes (:func:`content_key`), so identical payloads share an
entry whoever sends them. One lock guards everything; every operation is O(1) on an
``OrderedDict`` kept in recency order.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["ResponseCache", "content_key"]

KEY_BYTES = 16  # 128 bits: collisions are not a practical concern at any cache size


def content_key(payload: bytes) -> bytes:
    """The cache key of a request: a 16-byte BLAKE2b digest of its bytes."""
    return hashlib.blake2b(payload, digest_size=KEY_BYTES).digest()


class ResponseCache:
    """A thread-safe LRU cache of responses, with entries optionally expiring ``ttl_s`` after
    they were stored.

    ``get`` answers None for a miss, so None itself cannot be stored. ``clock`` is injectable so
    that expiry can be tested without sleeping.
    """

    def __init__(
        self,
        max_entries: int,
        ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive or None, not {ttl_s}")
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (value, expiry time or None); least recently used first.
        self._entries: OrderedDict[bytes, tuple[Any, float | None]] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._expirations = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: bytes) -> Any | None:
        """The stored value, or None when absent or expired (an expired entry is dropped)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            value, expires = entry
            if expires is not None and self._clock() >= expires:
                del self._entries[key]
                self._expirations += 1
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return value

    def put(self, key: bytes, value: Any) -> None:
        """Store (or refresh) an entry as the most recent; evict the least recent beyond the cap."""
        if value is None:
            raise ValueError("None cannot be cached: get() uses it to mean a miss")
        with self._lock:
            expires = None if self._ttl_s is None else self._clock() + self._ttl_s
            entries = self._entries
            entries[key] = (value, expires)
            entries.move_to_end(key)
            if len(entries) > self._max_entries:
                entries.popitem(last=False)
                self._evictions += 1

    def metrics(self) -> dict[str, Any]:
        with self._lock:
            lookups = self._hits + self._misses
            return {
                "hits": self._hits,
                "misses": self._misses,
                "hit_rate": self._hits / lookups if lookups else None,
                "evictions": self._evictions,
                "expirations": self._expirations,
                "entries": len(self._entries),
                "max_entries": self._max_entries,
                "ttl_s": self._ttl_s,
            }

    def reset_metrics(self) -> None:
        """Zero the counters; the entries stay (a warm cache stays warm across phases)."""
        with self._lock:
            self._hits = self._misses = self._evictions = self._expirations = 0
