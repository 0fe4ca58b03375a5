"""summarize(): the verdict and the `run --json` summary from what a run collected, called
directly on hand-built inputs (no target, no clock, no store)."""

from __future__ import annotations

import json
import math
from typing import Any

from optlab.config.models import OpenLoad
from optlab.metrics.log import Window
from optlab.metrics.resources import ResourceReading
from optlab.metrics.stages import SEND_LAG, START_LAG, TOTAL
from optlab.run.evidence import Observed
from optlab.run.summarize import summarize
from optlab.targets.templates import Secrets
from tests.support.collected import collected, histogram
from tests.support.golden import check_golden
from tests.support.runs import runs_with_every_reason


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
        "unstable: QPS 100.0 in the first half vs 70.0 in the second (30% apart, p < 0.0001 "
        "against the seconds' own noise"
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
    # The same lag in a closed loop is no reason: there is no schedule to fall behind. (Its
    # four clients each spend 10 s in calls of 1..1000 ms: they kept the target busy.)
    busy = {**histograms, TOTAL: histogram([float(i) for i in range(1, 1001)])}
    assert summarize(collected(histograms=busy)).valid


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


def reading(t_s: float, rss_mib: float, **changes: Any) -> ResourceReading:
    fields: dict[str, Any] = {
        "t_s": t_s,
        "phase": "measure",
        "cpu_process_pct": 50.0,
        "cpu_system_pct": 40.0,
        "cpu_per_core": None,
        "rss_bytes": round(rss_mib * 2**20),
        "mem_used_bytes": None,
        "mem_total_bytes": None,
        "iowait_pct": None,
        "gpus": None,
    }
    return ResourceReading(**(fields | changes))


def test_the_evidence_from_what_the_run_observed() -> None:
    # Ten 1 s windows of 100 requests from t_s 2.0 on the readings' clock; RSS grows 5 MiB a
    # second, so 50 MiB per 1,000 requests, exactly.
    windows = [Window("measure", i, 100, 0, 100.0, 1.0, 2.0, None) for i in range(10)]
    readings = [
        reading(2.0 + i, 100 + 5 * i, other_cpu_pct=10.0 * i, steal_pct=None) for i in range(1, 9)
    ]
    readings.insert(0, reading(1.5, 999, phase="warmup", other_cpu_pct=500.0))  # not measured
    observed = Observed(
        cores=2,
        gc_pauses_ns=[2_000_000, 3_000_000],
        windows=windows,
        window_in_flight=[4, 4, None, 8],
        measure_start_s=2.0,
        tree_rss=[(2.0, round(100 * 2**20), None), (12.0, round(150 * 2**20), None)],
    )
    metrics = {"batching": {"mean_batch_size": 6.0, "max_batch_size": 8}}
    histograms = {
        TOTAL: histogram([float(i) for i in range(1, 1001)]),
        "queue": histogram([2.0] * 1000),
    }
    done = summarize(
        collected(
            readings=readings,
            observed=observed,
            target_metrics=metrics,
            histograms=histograms,
            in_flight=(4, 8, 9),
        )
    )
    evidence = done.summary.evidence
    assert evidence is not None and evidence.cores == 2
    assert evidence.process is None and evidence.service is None  # not observed: unknown
    assert evidence.neighbour_cpu_pct == 45.0  # the mean of 10..80, the warmup left out
    assert evidence.steal_pct is None  # never read: null, not 0
    assert evidence.gc is not None and evidence.gc.collections == 2
    assert evidence.gc.pause_total_ms == 5.0 and evidence.gc.pause_max_ms == 3.0
    assert evidence.gc.pause_p99_ms is None and evidence.gc.share_pct == 0.05  # 5 ms of 10 s
    memory = evidence.memory
    assert memory is not None and memory.samples == 10 and memory.series == "rss_bytes"
    assert memory.mib_per_1k_requests == 50.0 and memory.r2 == 1.0
    assert evidence.in_flight_mean == 5.33 and evidence.in_flight_max == 9  # the marks saw 9
    batching = evidence.batching
    assert batching is not None and batching.fill_ratio == 0.75 and batching.max_batch == 8
    assert batching.wait_ms_mean is not None
    assert math.isclose(batching.wait_ms_mean, 2.0, rel_tol=2e-3)
    assert evidence.network is None  # in process: no network between client and target
    assert "evidence" in done.summary.to_json()


def test_a_network_target_gets_its_overhead_from_server_timing() -> None:
    histograms = {
        TOTAL: histogram([10.0] * 1000),
        "server_total": histogram([7.5] * 1000),
    }
    done = summarize(collected(histograms=histograms, in_process=False))
    evidence = done.summary.evidence
    assert evidence is not None and evidence.network is not None
    network = evidence.network
    assert math.isclose(network.overhead_p50_ms, 2.5, abs_tol=0.02)
    assert math.isclose(network.overhead_share, 0.25, abs_tol=0.002)
    # Nothing observed: no GC figures, no trend, no batching; unknown is null, never 0.
    assert evidence.gc is None and evidence.memory is None and evidence.batching is None
    assert evidence.in_flight_mean is None and evidence.in_flight_max is None
    # Without a server total, no network figure.
    plain = summarize(collected(in_process=False)).summary.evidence
    assert plain is not None and plain.network is None


# -- `optlab run --json` byte for byte ----------------------------------------------------


def test_run_json_is_unchanged_byte_for_byte() -> None:
    """`optlab run --json` prints `to_json()` as below (cli/runs.py): reasons and all."""
    lines = [
        json.dumps(summarize(case).summary.to_json(), default=str, allow_nan=False)
        for case in [collected(), *runs_with_every_reason().values()]
    ]
    check_golden("run-summary.jsonl", "\n".join(lines) + "\n")
