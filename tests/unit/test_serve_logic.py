"""`optlab serve`'s pure parts: group knobs from mode words and compact JSON, and the
Server-Timing header it sends (no server is started)."""

from __future__ import annotations

import json

from optlab.reference.serve import server_timing
from optlab.reference.serve_knobs import assemble_knobs, knobs_summary


def test_group_knobs_take_mode_words_and_compact_json() -> None:
    knobs = assemble_knobs({"batching": "dynamic", "cache": "off", "threads": 2})
    assert knobs["batching"]["mode"] == "dynamic" and knobs["cache"] == {"mode": "off"}
    group = {"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 2}
    # An experiment's knob template renders a group knob exactly like this.
    rendered = json.dumps(group, separators=(",", ":"))
    knobs = assemble_knobs({"batching": rendered, "cache": '{"mode":"lru","max_entries":16}'})
    assert knobs["batching"] == {**group, "max_wait_ms": 2.0, "max_queue": 1024}
    assert knobs["cache"] == {"mode": "lru", "max_entries": 16, "ttl_s": None}
    assert assemble_knobs({}) == assemble_knobs({"engine": None, "batching": "off"})
    summary = knobs_summary(knobs)
    assert "batching={" in summary and "engine=torch" in summary


def test_server_timing_header() -> None:
    header = server_timing({"preprocess": 812_345, "infer": 5_221_000}, 7_000_499)
    assert header == "preprocess;dur=0.812, infer;dur=5.221, app;dur=7.000"
    assert server_timing(None, 1_000) == "app;dur=0.001"
