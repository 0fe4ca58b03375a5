"""The process watcher's table (optlab.metrics.procwatch.parse): what a watcher that gives no
table, or a damaged one, leaves (no process is started); the neighbours that changed between
the halves, from hand-made scans (optlab.metrics.neighbours)."""

from __future__ import annotations

from optlab.metrics.neighbours import Scan, changed_halves
from optlab.metrics.procwatch import parse


def test_a_watcher_that_gives_no_table_leaves_the_snapshots_only() -> None:
    assert parse(b"") is None and parse(b"{}") is None and parse(b"not json") is None
    assert parse(b'[[12, 1, "x", 0.5, 100.0], ["bad"], [13, null, "y", 1, 2]]') == [
        (12, 1, "x", 0.5, 100.0),
        (13, None, "y", 1.0, 2.0),
    ]


def _scan(t: float, cpu: dict[int, float]) -> Scan:
    return (t, 1_000.0 + t, {pid: (f"p{pid}", s, 50.0, 1) for pid, s in cpu.items()})


def test_a_burner_that_came_halfway_keeps_its_place_beside_those_it_crowded_out() -> None:
    # Two stress-ng workers near a core each, crowded to ~40% when a burner comes halfway:
    # each falls by ~58 points, more than the burner rises (+40). The largest changes alone,
    # three of them, held the two falls and nothing that rose above the third: the drift line
    # then fell back to naming stress-ng (seen beside `stress-ng --cpu 2` in the timing lane).
    start = _scan(0.0, {10: 0.0, 11: 0.0, 12: 0.0, 13: 0.0})
    middle = _scan(10.0, {10: 9.8, 11: 9.8, 12: 0.0, 13: 1.0})
    end = _scan(20.0, {10: 13.8, 11: 13.8, 12: 4.0, 13: 1.8})
    own: tuple[set[int], set[int]] = (set(), set())
    changed = changed_halves(start, middle, end, [], own, least_pct=5.0, most=1)
    assert [(e["pid"], e["first_pct"], e["second_pct"]) for e in changed] == [
        (10, 98.0, 40.0),
        (12, 0.0, 40.0),
    ]
    both = changed_halves(start, middle, end, [], own, least_pct=5.0, most=3)
    assert [e["pid"] for e in both] == [10, 11, 12]  # largest change first; 13 moved < 5
    # No scan in the middle (a run stopped before it): nothing is known of the halves.
    assert changed_halves(start, start, end, [], own, least_pct=5.0, most=3) == []
