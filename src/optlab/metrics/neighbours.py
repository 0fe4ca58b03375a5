"""Who else used the CPU while a run was measured: arithmetic on the sampler's scans of every
process's CPU seconds (`optlab.metrics.resources` takes them at the measured phase's start,
middle and end; `optlab.metrics.procwatch` sees the processes that exit in between). Pure:
the scans in, the neighbours out.

A process is the run's own, never a neighbour, when it is one of `inside` (optlab's process,
the service's, every pid ever found in their trees) or descends from one of `owners`.
"""

from __future__ import annotations

from typing import Any

from optlab.metrics.procwatch import Seen

__all__ = ["ANCESTRY_DEPTH", "Other", "Scan", "busiest", "changed_halves", "spent_between"]

# How far up a process's parents are followed to tell whether optlab or the service started it.
ANCESTRY_DEPTH = 64

# Another process as a scan notes it: (name, CPU seconds, create time, parent pid).
Other = tuple[str, float, float, int | None]
# A scan: (perf_counter seconds, wall-clock seconds, pid -> Other).
Scan = tuple[float, float, dict[int, Other]]


def busiest(
    start: Scan,
    end: Scan,
    watched: list[Seen],
    own: tuple[set[int], set[int]],
    least_pct: float,
    most: int,
) -> list[dict[str, Any]]:
    """The processes outside the run that used the most CPU between two scans (percent of
    one core), most first; `own` is (inside, owners)."""
    wall = end[0] - start[0]
    if wall <= 0:
        return []
    used: list[dict[str, Any]] = [
        {"name": name, "pid": pid, "cpu_pct": round(100.0 * spent / wall, 1)}
        for pid, (name, spent) in spent_between(start, end, watched, own).items()
        if 100.0 * spent / wall >= least_pct
    ]
    used.sort(key=lambda entry: -float(entry["cpu_pct"]))
    return used[:most]


def changed_halves(
    start: Scan,
    middle: Scan,
    end: Scan,
    watched: list[Seen],
    own: tuple[set[int], set[int]],
    least_pct: float,
    most: int,
) -> list[dict[str, Any]]:
    """The processes outside the run whose CPU changed the most between the halves either
    side of `middle` (percent of one core in each, `first_pct` and `second_pct`): up to
    `most` that rose and up to `most` that fell, largest change first. Each way has its own
    places: when a burner comes halfway, the processes it crowds out fall by more than it
    rises, and one list of the largest changes held only them."""
    if not start[0] < middle[0] < end[0]:
        return []
    first_s, second_s = middle[0] - start[0], end[0] - middle[0]
    # A process that exited in the first half is not in the middle's scan: its CPU there is
    # not known, and it is left out (the whole phase's figures still count it).
    first = spent_between(start, middle, [], own)
    second = spent_between(middle, end, watched, own)
    changed: list[dict[str, Any]] = []
    for pid in first.keys() | second.keys():
        name = (first.get(pid) or second[pid])[0]
        a = 100.0 * first.get(pid, (name, 0.0))[1] / first_s
        b = 100.0 * second.get(pid, (name, 0.0))[1] / second_s
        if abs(b - a) >= least_pct:
            changed.append(
                {"name": name, "pid": pid, "first_pct": round(a, 1), "second_pct": round(b, 1)}
            )

    def change(entry: dict[str, Any]) -> float:
        return float(entry["second_pct"]) - float(entry["first_pct"])

    changed.sort(key=lambda e: -abs(change(e)))
    rose = [e for e in changed if change(e) > 0][:most]
    fell = [e for e in changed if change(e) < 0][:most]
    return sorted(rose + fell, key=lambda e: -abs(change(e)))


def spent_between(
    start: Scan, end: Scan, watched: list[Seen], own: tuple[set[int], set[int]]
) -> dict[int, tuple[str, float]]:
    """(name, CPU seconds) of each process outside the run between two scans, by pid; a
    process seen by the watcher only, having exited, with its last reading (a floor)."""
    inside, owners = own
    # The last reading of each process (a pid and its start time): the end scan's for those
    # alive then, else the watcher's.
    last: dict[tuple[int, float], Other] = {}
    for pid, ppid, name, cpu, created in watched:
        last[(pid, round(created, 2))] = (name, cpu, created, ppid)
    for pid, other in end[2].items():
        last[(pid, round(other[2], 2))] = other
    parents = {pid: other[3] for (pid, _), other in last.items()}
    parents.update({pid: other[3] for pid, other in start[2].items()})
    used: dict[int, tuple[str, float]] = {}
    for (pid, _), (name, cpu, created, _ppid) in last.items():
        if pid in inside or _descends(pid, parents, owners):
            continue
        before = start[2].get(pid)
        if before is not None and before[0] == name and abs(before[2] - created) < 0.01:
            spent = cpu - before[1]
        elif before is None or created > before[2]:
            # Started during the span (or a pid reused by a newer process): all its CPU is
            # the span's. Judged against the first scan, not the wall clock: psutil's start
            # times can be a second off it (boot time in whole seconds).
            spent = cpu
        else:
            continue
        used[pid] = (name, spent)
    return used


def _descends(pid: int, parents: dict[int, int | None], owners: set[int]) -> bool:
    """Whether one of `pid`'s ancestors (as far as the scans know them) is an owner."""
    at: int | None = pid
    for _ in range(ANCESTRY_DEPTH):
        at = parents.get(at) if at is not None else None
        if at is None or at <= 1:
            return False
        if at in owners:
            return True
    return False
