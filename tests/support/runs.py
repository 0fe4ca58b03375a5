"""Runs built by hand whose verdicts, between them, give every kind of reason the validity rules
write: one builder for the tests that check those reasons' texts (tests/golden/run-summary.jsonl,
tests/golden/log-reasons.txt) and their codes."""

from __future__ import annotations

from typing import Any

from optlab.config.models import OpenLoad
from optlab.metrics.stages import SEND_LAG, TOTAL
from optlab.run.summarize import Collected
from tests.support.collected import collected, histogram


def runs_with_every_reason(**common: Any) -> dict[str, Collected]:
    """By name, in this order: a FAILED run that is also saturated, has too few queries for
    its P99, too many errors and unstable halves; a run whose load generator fell behind its
    schedule; a KILLED run with clients stuck in a call; a run stopped early. `common` changes
    every one of them (a run id, say)."""
    lagged = {TOTAL: histogram([2.0] * 1000), SEND_LAG: histogram([5.0] * 1000)}
    return {
        "failed": collected(
            **common,
            status="FAILED",
            error="boom\nTraceback ...",
            load=OpenLoad(mode="open", rate=200.0),
            in_flight=(3, 60, 60),
            histograms={TOTAL: histogram([2.0] * 500)},
            completed=500,
            failed=20,
            errors={"ConnectionError": (20, "refused")},
            window_qps=(60.0,) * 5 + (40.0,) * 5,
        ),
        "lagged": collected(**common, load=OpenLoad(mode="open", rate=100.0), histograms=lagged),
        "killed": collected(
            **common, status="KILLED", interrupted=True, measured_s=4.0, abandoned=2
        ),
        "stopped-early": collected(
            **common, stopped_early="saturated: the backlog rose every second", measured_s=3.0
        ),
    }
