"""Real-time figures of HTTP runs against the toy service (tests/services/toy_service.py): how
close the measured stage lands to the sleep the service reports, and how near an open loop's
schedule the requests actually sent come. The integration tests (tests/integration/test_http.py)
assert the sides a busy machine cannot move; these bounds are loose enough for a busy 2-core
machine, and each message prints the figure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from tests.support.httpsvc import http_experiment, summary_of, toy_service

Invoke = Callable[..., Result]
TWO_S = ("--quick", "--duration", "2", "--warmup", "0.5", "--json")


def test_the_server_timing_work_stage_is_the_services_own_sleep(
    tmp_path: Path, invoke: Invoke
) -> None:
    with toy_service("--delay-ms", "1") as port:
        path = http_experiment(
            tmp_path, "toy-closed", f"http://127.0.0.1:{port}/", "{mode: closed, concurrency: 4}"
        )
        summary = summary_of(invoke("run", str(path), *TWO_S))
    work = summary["latency_ms"]["work"]["p50"]  # type: ignore[index]
    # The service sleeps 1 ms and reports what it slept; an event loop on a busy machine
    # oversleeps, never by whole milliseconds at the median.
    assert 0.95 <= work < 3.0, f"work P50 {work:.3f} ms for a 1 ms sleep"


def test_an_open_loop_sends_near_its_schedule(tmp_path: Path, invoke: Invoke) -> None:
    with toy_service("--delay-ms", "0") as port:
        path = http_experiment(
            tmp_path, "toy-open", f"http://127.0.0.1:{port}/", "{mode: open, rate: 200}"
        )
        summary = summary_of(invoke("run", str(path), *TWO_S))
    sent = int(summary["requests"]) + int(summary["errors"])  # type: ignore[call-overload]
    assert 300 <= sent <= 450, f"{sent} requests sent for 200/s over 2 s (400 scheduled)"


def test_two_generator_processes_together_keep_the_rate(tmp_path: Path, invoke: Invoke) -> None:
    with toy_service("--delay-ms", "1") as port:
        path = http_experiment(
            tmp_path,
            "toy-2p",
            f"http://127.0.0.1:{port}/",
            "{mode: open, rate: 300, arrival: poisson, processes: 2}",
        )
        summary = summary_of(invoke("run", str(path), *TWO_S))
    requests = int(summary["requests"])  # type: ignore[call-overload]
    assert 450 <= requests <= 700, f"{requests} requests for 300/s over 2 s (600 expected)"
