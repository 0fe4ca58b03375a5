"""A serving engine's Prometheus page read into optlab's figures, and a phase's samples
summarised (`optlab.metrics.server_metrics`)."""

from __future__ import annotations

import pytest

from optlab.metrics.server_metrics import (
    ServerSample,
    parse_prometheus,
    server_figures,
    summarize,
)

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
vllm:prefix_cache_hits_total{model_name="m"} 250.0
vllm:request_success_total{finished_reason="length",model_name="m"} 12.0
garbage line without a value
vllm:bad_value{a="b"} NaN
"""

SGLANG = """\
sglang:num_running_reqs{model_name="m"} 8
sglang:num_queue_reqs{model_name="m"} 1
sglang:token_usage{model_name="m"} 0.93
"""


def test_a_page_is_summed_over_label_sets_by_name_without_namespace() -> None:
    values = parse_prometheus(VLLM)
    assert values["num_requests_running"] == 5.0  # two engines add up
    assert values["prefix_cache_hits_total"] == 250.0
    assert "bad_value" not in values and "garbage" not in values


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        (VLLM, {"running": 5.0, "waiting": 7.0, "kv_cache_usage": 0.5, "preemptions": 4.0,
                "prefix_cache_hits": 250.0, "prefix_cache_queries": 1000.0}),
        (SGLANG, {"running": 8.0, "waiting": 1.0, "kv_cache_usage": 0.93}),
        ("# nothing known\nprocess_cpu_seconds_total 12.5\n", {}),
    ],
    ids=["vllm", "sglang", "unknown"],
)  # fmt: skip
def test_engines_names_map_to_one_set_of_figures(page: str, expected: dict[str, float]) -> None:
    assert server_figures(page) == expected


def test_a_phase_is_gauges_mean_and_max_and_counters_increase() -> None:
    samples = [
        ServerSample(0.0, {"running": 2.0, "kv_cache_usage": 0.2, "preemptions": 10.0,
                           "prefix_cache_hits": 0.0, "prefix_cache_queries": 0.0}),
        ServerSample(1.0, {"running": 4.0, "kv_cache_usage": 0.9, "preemptions": 13.0,
                           "prefix_cache_hits": 30.0, "prefix_cache_queries": 40.0}),
        # The server restarted: its counters start again from zero.
        ServerSample(2.0, {"running": 6.0, "kv_cache_usage": 0.4, "preemptions": 1.0,
                           "prefix_cache_hits": 10.0, "prefix_cache_queries": 20.0}),
    ]  # fmt: skip
    found = summarize(samples)
    assert found is not None
    assert found["samples"] == 3
    assert found["running_mean"] == 4.0 and found["running_max"] == 6.0
    assert found["kv_cache_usage_max"] == 0.9
    assert found["waiting_mean"] is None  # not exported: not a made-up zero
    assert found["preemptions"] == 3.0 + 1.0
    assert found["prefix_cache_hit_rate"] == pytest.approx(40.0 / 60.0)
    assert summarize([ServerSample(0.0, {})]) is None
    assert summarize([]) is None
