"""Real-time figures of two fault scenarios (optlab.reference.fault_scenarios), measured for
2 s: how near the lock's throughput comes to one over its hold time, and how little past its
timeout an under-filled batch waits. The integration tests (test_fault_scenarios.py) keep the
sides a busy machine cannot move; these bounds are loose for a busy 2-core machine, and each
message prints the figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from optlab.reference.fault_scenarios import by_name
from optlab.run.runner import RunOptions, run
from optlab.store import RunSummary, Store


class _Quiet:
    def update(self, status: Any) -> None:
        return None

    def note(self, text: str) -> None:
        return None


def _measure(tmp_path: Path, name: str) -> RunSummary:
    config = by_name(name)[0].config(0)
    path = tmp_path / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    with Store.open(f"sqlite:///{tmp_path / 'runs.db'}") as store:
        options = RunOptions(quick=True, duration_s=2.0, warmup_s=0.3)
        outcome = run(path, store, options, _Quiet())
    assert outcome[-1].status == "FINISHED", f"the run ended {outcome[-1].status}"
    return outcome[-1].summary


def test_a_lock_serves_near_one_over_its_hold_time(tmp_path: Path) -> None:
    hold_ms = by_name("lock")[0].config(0)["knobs"]["hold_ms"]
    qps = _measure(tmp_path, "lock").qps
    ideal = 1000 / hold_ms
    assert qps is not None and qps > 0.4 * ideal, f"QPS {qps:.1f} against {ideal:.0f}/s ideal"


def test_an_under_filled_batch_leaves_soon_after_its_timeout(tmp_path: Path) -> None:
    wait_ms = by_name("under-batching")[0].config(0)["knobs"]["batching"]["max_wait_ms"]
    queue = _measure(tmp_path, "under-batching").stages["queue"].p50
    assert queue is not None and queue < wait_ms + 3, f"queue P50 {queue} ms, timeout {wait_ms}"
