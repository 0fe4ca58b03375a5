"""summarize(): the verdict and the `run --json` summary from what a run collected, called
directly on hand-built inputs (no target, no clock, no store)."""

from __future__ import annotations

import math
from typing import Any

from optlab.config.models import ClosedLoad, OpenLoad
from optlab.config.protocol import EffectiveProtocol
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.stages import SEND_LAG, START_LAG, TOTAL
from optlab.run.summarize import Collected, summarize
from optlab.targets.templates import Secrets

PROTOCOL = EffectiveProtocol(
    name="full",
    warmup="fixed",
    warmup_s=30.0,
    warmup_max_s=30.0,
    duration_s=10.0,
    max_error_rate=0.01,
    stability_tolerance=0.10,
)
CLOSED = ClosedLoad(mode="closed", concurrency=4)
STEADY = (100.0,) * 10  # ten measured seconds at 100 QPS: both halves agree


def histogram(values_ms: list[float]) -> LatencyHistogram:
    h = LatencyHistogram()
    for value in values_ms:
        h.record_ns(round(value * 1e6))
    return h


def collected(**changes: Any) -> Collected:
    """A finished closed-loop run of 1,000 requests over 10 s: 1..1000 ms, one each."""
    fields: dict[str, Any] = {
        "run_id": 7,
        "experiment": "baseline",
        "status": "FINISHED",
        "protocol": PROTOCOL,
        "load": CLOSED,
        "histograms": {TOTAL: histogram([float(i) for i in range(1, 1001)])},
        "completed": 1000,
        "failed": 0,
        "measured_s": 10.0,
        "warmup_s": 30.0,
        "window_qps": STEADY,
    }
    return Collected(**(fields | changes))


def test_known_latencies_give_known_percentiles_and_a_valid_run() -> None:
    done = summarize(collected())
    total = done.summary.total
    # HdrHistogram at 3 significant digits: within 0.1% of the exact order statistics.
    assert total.p50 is not None and math.isclose(total.p50, 500.0, rel_tol=2e-3)
    assert total.p99 is not None and math.isclose(total.p99, 990.0, rel_tol=2e-3)
    assert total.max is not None and math.isclose(total.max, 1000.0, rel_tol=2e-3)
    assert total.count == 1000
    assert done.valid and done.verdict.valid and done.reasons == []
    assert done.summary.qps == 100.0 and done.summary.valid is True
    assert done.final.status == "FINISHED" and done.final.requests == 1000
    assert done.final.summary is done.summary
    # A closed loop says so: its latency hides a stall (no coordinated-omission correction).
    assert any(note.startswith("closed loop") for note in done.summary.notes)


def test_halves_that_differ_make_the_run_unstable() -> None:
    drifting = (100.0,) * 5 + (70.0,) * 5
    done = summarize(collected(window_qps=drifting))
    assert not done.valid
    assert len(done.reasons) == 1
    assert done.reasons[0].startswith(
        "unstable: QPS 100.0 in the first half vs 70.0 in the second (30% apart, limit 10%)"
    )
    # Within the tolerance (5% apart, limit 10%): stable.
    assert summarize(collected(window_qps=(100.0,) * 5 + (95.0,) * 5)).valid


def test_too_few_queries_for_p99_and_too_many_errors_are_reasons() -> None:
    done = summarize(
        collected(
            histograms={TOTAL: histogram([2.0] * 500)},
            completed=500,
            failed=20,
            errors={"ConnectionError": (20, "refused")},
        )
    )
    assert not done.valid
    assert any("500 successful queries: P99 needs at least 662" in r for r in done.reasons)
    assert any(r.startswith("error rate 3.85% is over the limit 1.00%") for r in done.reasons)
    assert done.summary.errors_by_type == {"ConnectionError": 20}
    assert done.errors == {"ConnectionError": (20, "refused")}


def test_the_harness_lags_are_kept_apart_and_judge_an_open_loop() -> None:
    late = histogram([5.0] * 1000)  # every request left 5 ms after its intended time
    histograms = {TOTAL: histogram([2.0] * 1000), SEND_LAG: late, START_LAG: histogram([0.01])}
    open_loop = OpenLoad(mode="open", rate=100.0)
    done = summarize(collected(load=open_loop, histograms=histograms))
    assert set(done.summary.latency_ms) == {"total"}
    assert set(done.summary.harness_ms) == {SEND_LAG, START_LAG}
    assert not done.valid
    assert any(r.startswith("the load generator fell behind its schedule") for r in done.reasons)
    # The same lag in a closed loop is no reason: there is no schedule to fall behind.
    assert summarize(collected(histograms=histograms)).valid


def test_a_failed_or_killed_run_is_never_valid_and_says_why() -> None:
    failed = summarize(collected(status="FAILED", error="boom\nTraceback ..."))
    assert not failed.valid and failed.verdict.valid  # the numbers alone would have passed
    assert failed.reasons[0] == "the run failed: boom"
    assert failed.final.error_message == "boom\nTraceback ..."
    killed = summarize(collected(status="KILLED", interrupted=True, measured_s=4.0))
    assert not killed.valid
    assert any(r.startswith("interrupted after 4.0 s of 10 s") for r in killed.reasons)


def test_a_saturated_open_loop_blames_the_target() -> None:
    open_loop = OpenLoad(mode="open", rate=200.0)  # asked 200/s, 100/s completed
    done = summarize(collected(load=open_loop, in_flight=(3, 60, 60)))
    assert any(r.startswith("the target is saturated: offered 200.0/s") for r in done.reasons)


def test_stuck_clients_an_unstable_warmup_and_secrets_are_reported() -> None:
    secrets = Secrets({"TOKEN": "hunter2"})
    secrets.resolve("${TOKEN}", "target.headers")
    done = summarize(
        collected(
            abandoned=2,
            stabilised=False,
            errors={"HTTP 401": (1, "token hunter2 refused")},
            failed=1,
            hook_notes=["target metrics() raised ValueError: hunter2"],
            target_metrics={"key": "hunter2", "ratio": None},
            secrets=secrets,
        )
    )
    assert any(r.startswith("2 of 4 clients were stuck in a call") for r in done.reasons)
    notes = done.summary.notes
    assert "warmup did not stabilise within 30 s; measured anyway" in notes
    assert "2 requests were still in flight after the drain" in notes
    assert "target metrics() raised ValueError: ${TOKEN}" in notes
    assert done.errors == {"HTTP 401": (1, "token ${TOKEN} refused")}
    assert done.summary.target == {"key": "${TOKEN}", "ratio": None}
    assert "hunter2" not in repr(done.summary)


def test_what_strict_json_rejects_never_reaches_the_summary() -> None:
    tag = {"session": "s1", "index": 0, "role": "step"}
    done = summarize(collected(service={"cpu": float("nan")}, paired=tag))
    assert done.summary.service == {"cpu": None}
    assert "summary.service.cpu was nan, stored as null" in done.summary.notes
    assert done.summary.paired is not None and done.summary.paired.model_dump() == tag
