"""`optlab run` of a ramp load (docs/experiment-files.md "Workload") on the synthetic target: the
ramp is the warm-up, so the measured phase starts after it, at the ramp's final rate."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from click.testing import Result

from optlab.config.loading import parse_stored
from optlab.config.modes import RampLoad, mode_of
from optlab.store import Store
from tests.support.files import write
from tests.support.paths import REPO

Invoke = Callable[..., Result]
SCHEMA = json.loads((REPO / "docs" / "schemas" / "run-summary.schema.json").read_text("utf-8"))

RATE, RAMP_S, MEASURED_S = 200.0, 2.0, 3.0
# From 0/s to 200/s over 2 s, constant arrivals, a 1 ms server: far below what it can serve.
RAMPED = f"""\
name: ramped
description: a synthetic server under a ramp from 0 to {RATE:g}/s over {RAMP_S:g} s
target: {{kind: builtin, name: synthetic}}
knobs: {{distribution: fixed, service_ms: 1.0}}
workload:
  load: {{mode: ramp, rate: {RATE:g}, start_rate: 0, ramp_s: {RAMP_S:g}, arrival: constant}}
protocol: {{name: quick}}
"""


def test_a_ramp_run_is_measured_after_its_ramp_at_its_rate(
    invoke: Invoke, sqlite_url: str, tmp_path: Path
) -> None:
    path = write(tmp_path, "ramped.yaml", RAMPED)
    # A warm-up asked shorter than the ramp still lasts the whole ramp. (Whether a busy
    # machine let the generator keep its schedule is the verdict's business, not this test's.)
    result = invoke(
        "run",
        str(path),
        "--quick",
        "--duration",
        f"{MEASURED_S:g}",
        "--warmup",
        "0.3",
        "--allow-invalid",
        "--json",
    )
    assert result.exit_code == 0, result.output
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    jsonschema.validate(summary, SCHEMA)
    assert summary["status"] == "FINISHED" and summary["load"] == "ramp"
    assert summary["warmup_s"] >= RAMP_S, summary["warmup_s"]
    # Measured at the full rate: had the measured phase begun at 0.3 s, on the ramp, it would
    # have seen (Lambda(3.3) - Lambda(0.3)) / 3 = 88/s. A stall of the loaded machine at the
    # phase's end loses at most its own length of sends; 0.7 of the rate leaves 0.9 s of it.
    assert summary["qps"] >= 0.7 * RATE, f"measured {summary['qps']:.1f}/s of {RATE:g}/s"
    # The run's stored load is the ramp, and what it offered the measured phase is its rate.
    store = Store.open(sqlite_url)
    try:
        run = store.get_run(summary["run_id"])
        config = parse_stored(store.get_config(run.config_id).config, "ramped")
    finally:
        store.close()
    load = config.workload.load
    assert isinstance(load, RampLoad)
    assert (load.start_rate, load.ramp_s) == (0.0, RAMP_S)
    assert mode_of(load).offered_qps(load) == RATE
