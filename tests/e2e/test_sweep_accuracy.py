"""Open-loop sweeps of real services against what is known of them: the project's own batching
server (`optlab serve --batching dynamic`) swept open and closed under the same SLO (its open
capacity was 0.67-0.71x its closed one here: the server's throughput falls with the connections
in flight), and an M/D/1 queue served over HTTP whose capacity is exact (Erlang's M/D/1 law).

Slow (minutes): every level is a real run against a real server in its own process. The
accuracy figures over many seeds are `benchmarks/sweep_accuracy.py --real`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from optlab.reference.queueing import md1_capacity
from tests.conftest import free_port, write

Invoke = Callable[..., Result]

BATCHING_SERVER = """\
name: serve-batch
description: optlab serve with dynamic batching, swept open and closed
target:
  kind: command
  command: ["{{python}}", "-m", "optlab", "serve", "--host", "127.0.0.1", "--port", "{port}",
            "--engine", "{{knobs.engine}}", "--precision", "{{knobs.precision}}",
            "--batching", "{{knobs.batching}}", "--preprocess", "{{knobs.preprocess}}",
            "--cache", "{{knobs.cache}}", "--threads", "{{knobs.threads}}",
            "--instances", "{{knobs.instances}}", "--device", "{{knobs.device}}"]
  url: "http://127.0.0.1:{port}/predict"
  health_url: "http://127.0.0.1:{port}/health"
  method: POST
  knobs_model: "optlab.config.knobs:BuiltinKnobs"
  ready_timeout_s: 180
knobs:
  engine: torch
  precision: fp32
  batching: {{mode: dynamic, max_batch_size: 8, max_wait_ms: 2}}
  preprocess: numpy-pooled
  cache: {{mode: "off"}}
  threads: 1
  instances: 1
  device: cpu
workload:
  load: {{mode: open, rate: 10}}
  inputs: {{images: {{split: holdout, count: 359, size: 64}}}}
protocol: {{name: quick}}
"""

MD1_SERVER = """\
name: md1
description: one server, fixed {ms} ms, over HTTP
target:
  kind: command
  command: ["{{python}}", "-m", "optlab.reference.synthetic", "--port", "{port}",
            "--servers", "1", "--distribution", "fixed", "--service-ms", "{ms}"]
  url: "http://127.0.0.1:{port}/"
  health_url: "http://127.0.0.1:{port}/health"
knobs: {{}}
workload:
  load: {{mode: open, rate: 10, arrival: poisson}}
  seed: 3
protocol: {{name: quick}}
"""


def _json(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return document


def _skip_unless_measurable(document: dict[str, Any], slo_ms: float) -> None:
    """Skip, saying why, where the machine could not serve even one client within the SLO
    (other work on its cores: a 10 ms M/D/1 server's one-client P99 was 143 ms with a load
    average of 11 on 2 cores). Accuracy is not judged on such a machine; everything else is."""
    one = [
        lv for lv in document["levels"] if lv.get("concurrency") == 1 and lv["purpose"] != "sizing"
    ]
    if one and one[0]["p99_ms"] is not None and one[0]["p99_ms"] > slo_ms:
        pytest.skip(
            f"this machine is too busy to judge a sweep's accuracy: one client's P99 was "
            f"{one[0]['p99_ms']:.0f} ms against the {slo_ms:g} ms SLO (load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
        )


@pytest.mark.slow
def test_a_batching_servers_open_loop_capacity_is_not_far_below_its_closed_loop_one(
    invoke: Invoke, tmp_path: Path
) -> None:
    path = write(tmp_path, "batch.yaml", BATCHING_SERVER.format(port=free_port()))
    args = ("sweep", str(path), "--slo", "p99=100ms", "--quick", "--json")
    closed = _json(invoke(*args, "--mode", "closed"))
    _skip_unless_measurable(closed, 100.0)
    opened = _json(invoke(*args))
    assert closed["capacity_qps"] and opened["capacity_qps"], (closed, opened)
    # Measured here on a quiet 2-core machine: closed 531.3/s (8 clients), open 378.6/s (0.71x;
    # with max_wait_ms 10: 380.5 and 255.6/s, 0.67x). The gap is the server's, not the
    # sweep's: under Poisson arrivals it saturates at ~405/s (achieved at 559/s offered)
    # against 531/s with 8 clients and 476/s with 16, as more connections in flight cost it
    # throughput; the open sweep's answer sat between its passing and failing levels (378.6
    # and 395.3/s). A sweep that voided its levels for a few ms of send lag landed 5-21x below.
    ratio = opened["capacity_qps"] / closed["capacity_qps"]
    assert 0.5 <= ratio <= 1.15, (opened["message"], closed["message"])
    assert opened["limited_by"] in ("slo", "saturation"), opened["message"]


@pytest.mark.slow
def test_an_md1_server_over_http_is_swept_near_its_exact_capacity(
    invoke: Invoke, tmp_path: Path
) -> None:
    ms = 10.0
    path = write(tmp_path, "md1.yaml", MD1_SERVER.format(port=free_port(), ms=ms))
    document = _json(invoke("sweep", str(path), "--slo", "p99=100ms", "--quick", "--json"))
    _skip_unless_measurable(document, 100.0)
    truth = md1_capacity(ms / 1000, 0.1)  # 77.35/s
    assert document["capacity_qps"] is not None, document["message"]
    # One sweep, on a machine shared with other work: +-25% here; the benchmark's goal over
    # ten seeds on a quiet machine is +-10% in 9 of 10.
    assert abs(document["capacity_qps"] / truth - 1) <= 0.25, document["message"]
    low, high = document["capacity_interval"]
    assert low <= document["capacity_qps"] <= high
