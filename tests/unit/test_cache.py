"""The response cache: LRU order, TTL expiry on an injected clock, hit rate, threads."""

from __future__ import annotations

import threading

import pytest

from optlab.reference.classifier.cache import ResponseCache, content_key


class FakeClock:
    """A clock the test moves by hand, so expiry is tested without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_content_key_is_a_16_byte_digest_of_the_payload() -> None:
    key = content_key(b"jpeg bytes")
    assert isinstance(key, bytes) and len(key) == 16
    assert key == content_key(b"jpeg bytes")
    assert key != content_key(b"jpeg bytez")


def test_least_recently_used_entry_is_evicted() -> None:
    cache = ResponseCache(max_entries=3)
    for key in (b"a", b"b", b"c"):
        cache.put(key, key.upper())
    assert cache.get(b"a") == b"A"  # "a" is now the most recent; "b" the least
    cache.put(b"d", b"D")
    assert cache.get(b"b") is None
    assert [cache.get(k) for k in (b"a", b"c", b"d")] == [b"A", b"C", b"D"]
    cache.put(b"c", b"C2")  # a refresh counts as use: "a" is now the least recent
    cache.put(b"e", b"E")
    assert cache.get(b"a") is None
    assert cache.get(b"c") == b"C2"
    metrics = cache.metrics()
    assert metrics["evictions"] == 2
    assert metrics["entries"] == 3 and len(cache) == 3 and metrics["max_entries"] == 3


def test_entries_expire_after_ttl_and_are_counted() -> None:
    clock = FakeClock()
    cache = ResponseCache(max_entries=10, ttl_s=5.0, clock=clock)
    cache.put(b"k", "v")
    clock.now += 4.999
    assert cache.get(b"k") == "v"
    clock.now += 0.001  # exactly ttl_s after the put: gone
    assert cache.get(b"k") is None
    metrics = cache.metrics()
    assert metrics["expirations"] == 1 and metrics["entries"] == 0
    assert metrics["hits"] == 1 and metrics["misses"] == 1 and metrics["ttl_s"] == 5.0
    # A put restarts the entry's time to live.
    cache.put(b"k", "v1")
    clock.now += 3
    cache.put(b"k", "v2")
    clock.now += 3
    assert cache.get(b"k") == "v2"


def test_hit_rate_and_reset_keeps_entries() -> None:
    cache = ResponseCache(max_entries=10)
    assert cache.metrics()["hit_rate"] is None  # no lookups yet
    cache.put(b"x", 1)
    assert cache.get(b"x") == 1
    assert cache.get(b"x") == 1
    assert cache.get(b"x") == 1
    assert cache.get(b"y") is None
    assert cache.metrics()["hit_rate"] == 0.75
    cache.reset_metrics()
    metrics = cache.metrics()
    assert metrics["hits"] == metrics["misses"] == metrics["evictions"] == 0
    assert metrics["hit_rate"] is None and metrics["entries"] == 1
    assert cache.get(b"x") == 1


def test_none_and_bad_settings_are_refused() -> None:
    cache = ResponseCache(max_entries=1)
    with pytest.raises(ValueError):
        cache.put(b"k", None)
    with pytest.raises(ValueError):
        ResponseCache(max_entries=0)
    with pytest.raises(ValueError):
        ResponseCache(max_entries=1, ttl_s=0)


def test_concurrent_use_keeps_counts_and_bound_exact() -> None:
    cache = ResponseCache(max_entries=50)
    threads_n, rounds, keys = 8, 2_000, 100
    gate = threading.Barrier(threads_n)
    wrong: list[tuple[bytes, object]] = []

    def hammer(seed: int) -> None:
        gate.wait()
        for i in range(rounds):
            key = content_key(str((seed * 7919 + i) % keys).encode())
            value = cache.get(key)
            if value is None:
                cache.put(key, key.hex())
            elif value != key.hex():
                wrong.append((key, value))

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not wrong
    metrics = cache.metrics()
    # Every lookup was counted exactly once, whatever the interleaving.
    assert metrics["hits"] + metrics["misses"] == threads_n * rounds
    assert metrics["entries"] == 50
    # Each miss stored an entry (two threads missing the same key store it once, as a refresh);
    # all but the 50 kept were evicted.
    assert 0 < metrics["evictions"] <= metrics["misses"] - 50
