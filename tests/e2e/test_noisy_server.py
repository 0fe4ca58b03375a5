"""A server whose per-second QPS swings ±25% with nothing else running: a chain on it completes,
and an A/A step (a knob the service never reads) is judged within noise.

The service is tests/services/swinging_service.py, started by optlab (a command target): its
speed changes at random about once a second, so its halves often differ by more than 10% on a
short run though nothing changed. The validity verdict judges the drift against the seconds'
own noise (optlab.run.stability), so both runs are VALID and the table calls the step noise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from optlab.store import Store
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
SERVICE = REPO / "tests" / "services" / "swinging_service.py"
# Long enough for two batches of seconds a half and P99's 662 queries at ~400/s; a fixed
# warmup (the default waits for stable windows, which a swinging server rarely gives).
MEASURE = ("--quick", "--duration", "16", "--warmup", "1")

Invoke = Callable[..., Result]


def experiment(folder: Path, port: int) -> Path:
    path = folder / "swing.yaml"
    path.write_text(
        "name: swing\n"
        "target:\n"
        "  kind: command\n"
        f"  command: ['{{python}}', '{SERVICE}', '--port', '{port}', '--base-ms', '10']\n"
        f"  url: 'http://127.0.0.1:{port}/'\n"
        f"  health_url: 'http://127.0.0.1:{port}/health'\n"
        "  stop_grace_s: 5\n"
        "knobs: {label: a}\n"
        "workload:\n  load: {mode: closed, concurrency: 4}\n  inputs: {text: hello}\n"
    )
    return path


@pytest.mark.slow
def test_a_chain_on_a_swinging_server_completes_and_an_aa_step_is_noise(
    tmp_path: Path, invoke: Invoke, sqlite_url: str
) -> None:
    experiment(tmp_path, free_port())
    step = tmp_path / "relabel.yaml"
    step.write_text("name: swing-relabel\nparent: swing\nchange: {label: b}\n")
    result = invoke("run", str(step), *MEASURE, "--chain", "--json")
    assert result.exit_code == 0, result.output
    store = Store.open(sqlite_url)
    runs = sorted(store.list_runs(), key=lambda r: r.id)
    assert [r.experiment for r in runs] == ["swing", "swing-relabel"]
    for run in runs:
        assert run.status == "FINISHED" and run.valid, (run.experiment, run.reasons)
        qps = [w.qps for w in store.get_windows(run.id, "measure")]
        assert len(qps) >= 15
        # The server did swing: its seconds spread well beyond a steady server's.
        assert max(qps) / min(qps) > 1.2, qps
    table = invoke("table", "swing-relabel", "--format", "json")
    assert table.exit_code == 0, table.output
    chain = json.loads(table.stdout)["chain"]
    (aa,) = [row for row in chain if row["experiment"] == "swing-relabel"]
    assert aa["verdict"] == "within noise", aa
