"""The process watcher's table (optlab.metrics.procwatch.parse): what a watcher that gives no
table, or a damaged one, leaves (no process is started)."""

from __future__ import annotations

from optlab.metrics.procwatch import parse


def test_a_watcher_that_gives_no_table_leaves_the_snapshots_only() -> None:
    assert parse(b"") is None and parse(b"{}") is None and parse(b"not json") is None
    assert parse(b'[[12, 1, "x", 0.5, 100.0], ["bad"], [13, null, "y", 1, 2]]') == [
        (12, 1, "x", 0.5, 100.0),
        (13, None, "y", 1.0, 2.0),
    ]
