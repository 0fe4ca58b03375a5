"""HTTP and command targets, end to end over 127.0.0.1 against a real service process.

The service is tests/services/toy_service.py (aiohttp): it sleeps a configured time, reports
Server-Timing, fails every n-th request when asked, prints secrets it was given (a careless
service) and echoes the Authorization header in a 401 body on /echo.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from click.testing import Result

from optlab.store import Store
from tests.support.files import write
from tests.support.httpsvc import command_experiment, http_experiment, summary_of, toy_service
from tests.support.paths import REPO
from tests.support.proc import free_port, start_optlab
from tests.support.waits import wait_for_phase, wait_until

# 2 s measured: the open-loop caps below (sent <= 450 at 200/s, <= 700 at 300/s) are for 2 s;
# the 0.5 s warmup lets the services reach their steady state before the counters reset.
FAST = ("--quick", "--duration", "2", "--warmup", "0.5")
Invoke = Callable[..., Result]


@pytest.fixture(scope="module")
def toy() -> Iterator[int]:
    """A toy service for the whole module (a plain http target)."""
    with toy_service("--delay-ms", "1") as port:
        yield port


# -- refusals ------------------------------------------------------------------------------------


def test_a_missing_secret_is_refused_before_any_run(
    tmp_path: Path, invoke: Invoke, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPTLAB_UNSET_TOKEN", raising=False)
    path = http_experiment(
        tmp_path,
        "needs-token",
        "http://127.0.0.1:9/",
        "{mode: closed, concurrency: 1}",
        extra=", headers: {Authorization: 'Bearer ${OPTLAB_UNSET_TOKEN}'}",
    )
    result = invoke("run", str(path), *FAST)
    assert result.exit_code == 2
    assert "target.headers.Authorization needs the environment variable OPTLAB_UNSET_TOKEN" in (
        result.stderr
    )
    assert "export OPTLAB_UNSET_TOKEN=" in result.stderr
    assert Store.open(sqlite_url).list_runs() == []


def test_bad_http_inputs_are_refused_at_load_naming_file_and_field(
    tmp_path: Path, invoke: Invoke
) -> None:
    path = http_experiment(tmp_path, "bad", "http://127.0.0.1:9/", "{mode: closed, concurrency: 1}")
    path.write_text(path.read_text().replace("inputs: {template", "inputs: {files: 'no/*', tmpl"))
    result = invoke("diff", str(path))
    assert result.exit_code == 2
    assert f"{path}:" in result.stderr and "workload.inputs" in result.stderr
    path.write_text(
        path.read_text().replace("{files: 'no/*', tmpl: {id: '{i}'}, count: 5}", "{files: 'no/*'}")
    )
    result = invoke("diff", str(path))
    assert result.exit_code == 2 and "matches no file" in result.stderr, result.stderr


def test_a_url_without_its_scheme_is_refused_with_an_example(
    tmp_path: Path, invoke: Invoke
) -> None:
    path = http_experiment(
        tmp_path, "noscheme", "127.0.0.1:8000/", "{mode: closed, concurrency: 1}"
    )
    result = invoke("diff", str(path))
    assert result.exit_code == 2
    assert f"{path}:2: target.url: '127.0.0.1:8000/' is not an http(s) URL" in result.stderr
    assert "http://127.0.0.1:8000/predict" in result.stderr


def test_processes_need_a_network_target(synth: Path, invoke: Invoke) -> None:
    path = synth / "baseline.yaml"
    text = path.read_text()
    assert "concurrency" in text
    path.write_text(text.replace("concurrency:", "processes: 2, concurrency:"))
    result = invoke("run", str(path), *FAST)
    assert result.exit_code == 2
    assert "processes" in result.stderr and "network" in result.stderr


def test_a_step_naming_a_missing_knob_in_a_template_is_refused(
    tmp_path: Path, invoke: Invoke
) -> None:
    base = write(
        tmp_path,
        "base.yaml",
        "name: svc\ntarget: {kind: command, command: ['{python}', 'x.py', '--n', "
        "'{knobs.batching.max_batch_size}'], url: 'http://127.0.0.1:9/'}\n"
        "knobs: {batching: {mode: dynamic, max_batch_size: 8}}\n"
        "workload: {load: {mode: closed, concurrency: 1}}\n",
    )
    assert invoke("diff", str(base)).exit_code == 0
    step = write(
        tmp_path, "off.yaml", "name: svc-off\nparent: svc\nchange: {batching: {mode: 'off'}}\n"
    )
    result = invoke("run", str(base), *FAST)  # stores the baseline (the run itself fails: no x.py)
    result = invoke("diff", str(step))
    assert result.exit_code == 2
    assert "target.command[3]" in result.stderr and "max_batch_size" in result.stderr


# -- http target ---------------------------------------------------------------------------------


def test_http_closed_loop_records_server_timing_stages(
    tmp_path: Path, invoke: Invoke, toy: int
) -> None:
    path = http_experiment(
        tmp_path, "toy-closed", f"http://127.0.0.1:{toy}/", "{mode: closed, concurrency: 4}"
    )
    result = invoke("run", str(path), *FAST, "--json")
    assert result.exit_code == 0, result.output
    summary = summary_of(result)
    assert summary["status"] == "FINISHED" and summary["errors"] == 0
    latency = summary["latency_ms"]
    assert isinstance(latency, dict)
    assert {"total", "queue", "work", "server_total"} <= set(latency)
    assert latency["total"]["count"] == summary["requests"]
    # The server slept 1 ms per request; the client saw at least that, and more than the server.
    # (How little more is tests/timing/test_http_timing.py's: a busy machine stretches it.)
    assert latency["work"]["p50"] >= 0.95
    assert latency["total"]["p50"] >= latency["server_total"]["p50"] >= 0.95


def test_http_open_loop_keeps_its_rate_and_counts_errors_by_status(
    tmp_path: Path, invoke: Invoke
) -> None:
    with toy_service("--delay-ms", "0", "--fail-every", "4") as port:
        path = http_experiment(
            tmp_path,
            "toy-open",
            f"http://127.0.0.1:{port}/",
            "{mode: open, rate: 200, arrival: constant}",
        )
        result = invoke("run", str(path), *FAST, "--json")
    summary = summary_of(result)
    sent = int(summary["requests"]) + int(summary["errors"])  # type: ignore[call-overload]
    assert sent <= 450  # 200/s for 2 s: the schedule never sends more (fewer: timing lane)
    errors = summary["errors_by_type"]
    assert isinstance(errors, dict) and set(errors) == {"HTTP 503"}
    assert 0.2 <= errors["HTTP 503"] / sent <= 0.3  # every 4th request
    assert any("error rate" in r for r in summary["reasons"])  # type: ignore[union-attr]
    assert summary["harness_ms"]["send_lag"]["count"] == summary["requests"]  # type: ignore[index]


def test_a_service_that_goes_away_mid_run_counts_connection_errors(
    tmp_path: Path, invoke: Invoke
) -> None:
    # Nothing listening at the start is refused before a run (test_reliability); a service
    # that disappears during the run is measured as the connection errors it causes.
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # accepts into the backlog (the pre-flight check), never answers
    port = listener.getsockname()[1]
    threading.Timer(0.5, listener.close).start()
    path = http_experiment(
        tmp_path, "nobody", f"http://127.0.0.1:{port}/", "{mode: closed, concurrency: 2}"
    )
    summary = summary_of(invoke("run", str(path), *FAST, "--json"))
    assert summary["requests"] == 0
    errors = summary["errors_by_type"]
    assert isinstance(errors, dict) and "ClientConnectorError" in errors


def test_a_hung_service_does_not_hang_the_run(tmp_path: Path, invoke: Invoke) -> None:
    """Requests still in flight at the end are drained for a bounded time, then abandoned."""
    # Every request asleep for 10 minutes: a run that waited for them would take that long,
    # one that drains for its bounded 5 s ends in seconds (120 s only bounds a hang).
    with toy_service("--delay-ms", "600000") as port:
        path = http_experiment(
            tmp_path, "hung", f"http://127.0.0.1:{port}/", "{mode: closed, concurrency: 3}"
        )
        started = time.monotonic()
        summary = summary_of(invoke("run", str(path), "--quick", "--duration", "1", "--json"))
        elapsed = time.monotonic() - started
    assert summary["requests"] == 0
    assert any("3 requests were still in flight" in n for n in summary["notes"])  # type: ignore[union-attr]
    assert elapsed < 120, f"the run took {elapsed:.1f} s: it waited for its hung requests"


def test_two_generator_processes_merge_every_request(
    tmp_path: Path, invoke: Invoke, toy: int, sqlite_url: str
) -> None:
    path = http_experiment(
        tmp_path,
        "toy-2p",
        f"http://127.0.0.1:{toy}/",
        "{mode: open, rate: 300, arrival: poisson, processes: 2}",
    )
    result = invoke("run", str(path), *FAST, "--json")
    summary = summary_of(result)
    assert summary["status"] == "FINISHED", result.output
    requests = int(summary["requests"])  # type: ignore[call-overload]
    assert requests <= 700  # 300/s for 2 s from both processes together (fewer: timing lane)
    store = Store.open(sqlite_url)
    stats = {s.stage: s for s in store.get_stage_stats(int(summary["run_id"]), "measure")}  # type: ignore[call-overload]
    # Lossless: every request's latency and server stages are in the run's histograms.
    assert stats["total"].count == requests == stats["work"].count
    assert stats["send_lag"].count == requests
    windows = store.get_windows(int(summary["run_id"]), "measure")  # type: ignore[call-overload]
    # The per-second series leaves out only a sub-half-second sliver at the end (Collector).
    assert 0.97 * requests <= sum(w.completed for w in windows) <= requests


# -- command target ------------------------------------------------------------------------------


def test_command_target_chain_renders_knobs_and_stops_the_service(
    tmp_path: Path, invoke: Invoke, sqlite_url: str
) -> None:
    port = free_port()
    base = command_experiment(tmp_path, "svc", port)
    step = write(tmp_path, "fast.yaml", "name: svc-fast\nparent: svc\nchange: {delay_ms: 0.5}\n")
    result = invoke("run", str(step), *FAST, "--chain", "--json")
    assert result.exit_code == 0, result.output
    head = summary_of(result)
    assert head["experiment"] == "svc-fast"
    store = Store.open(sqlite_url)
    runs = store.list_runs()
    assert [r.status for r in runs] == ["FINISHED", "FINISHED"]
    for run, delay in zip(sorted(runs, key=lambda r: r.id), ("2.0", "0.5"), strict=True):
        assert run.summary is not None
        service = run.summary.service
        assert service["command"][-2:] == ["--delay-ms", "2" if delay == "2.0" else "0.5"]
        assert service["stopped_with"] == "SIGTERM" and service["exit"] == "exited with code 0"
        assert any("stopped cleanly" in line for line in service["log_tail"])
        assert (run.summary.resources.mean_of("service_cpu_pct") or 0) > 0
        # The knob reached the service (its command line, above): it slept at least that.
        work = run.summary.latency_ms["work"].p50
        assert work is not None and work >= 0.95 * float(delay)
    pid = int((tmp_path / "svc.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    table = invoke("table", "svc-fast", "--format", "markdown")
    assert "work" in table.stdout and "server_total" in table.stdout, table.stdout
    assert base.exists()


def test_service_metrics_and_accuracy_urls_are_the_targets_hooks(
    tmp_path: Path, invoke: Invoke
) -> None:
    port = free_port()
    extra = (
        f"  metrics_url: 'http://127.0.0.1:{port}/metrics'\n"
        f"  metrics_reset_url: 'http://127.0.0.1:{port}/metrics/reset'\n"
        f"  accuracy_url: 'http://127.0.0.1:{port}/accuracy'\n"
    )
    path = command_experiment(tmp_path, "hooks", port, extra=extra)
    # A warmup twice the measured phase: were the counters not reset when measuring started,
    # the service would count 3x the measured requests, a gap no busy machine closes.
    widened = ("--quick", "--duration", "2", "--warmup", "4")
    summary = summary_of(invoke("run", str(path), *widened, "--json"))
    assert summary["status"] == "FINISHED"
    # Checked before the load, judged against slo.max_accuracy_drop_pts (1 point by default).
    assert summary["accuracy"] == {"top1": 0.61, "drop_pts": 2.5, "n": 100}
    assert summary["valid"] is False
    assert any("accuracy" in r and "2.5" in r for r in summary["reasons"])  # type: ignore[union-attr]
    # Reset when the measured phase started: the service counted the measured requests (and
    # those in flight at either end, and what the clients sent between the phase's end and
    # their stop, which a busy machine stretches: up to one measured second is allowed), not
    # the warmup's 4 s.
    served = summary["target"]["requests"]  # type: ignore[index]
    measured = int(summary["requests"])  # type: ignore[call-overload]
    assert measured <= served <= 1.5 * measured, f"served {served}, measured {measured}"


def test_port_in_use_is_a_clear_error(tmp_path: Path, invoke: Invoke, toy: int) -> None:
    path = command_experiment(tmp_path, "clash", toy)
    result = invoke("run", str(path), *FAST, "--json")
    summary = summary_of(result)
    assert summary["status"] == "FAILED"
    reason = summary["reasons"][0]  # type: ignore[index]
    assert f"port {toy} on 127.0.0.1 is already in use" in reason


def test_service_that_exits_before_ready_fails_with_its_log(tmp_path: Path, invoke: Invoke) -> None:
    path = write(
        tmp_path,
        "boom.yaml",
        "name: boom\ntarget: {kind: command, command: ['{python}', '-c', "
        "\"print('loading model'); print('no GPU found'); raise SystemExit(3)\"], "
        f"url: 'http://127.0.0.1:{free_port()}/'}}\n"
        "knobs: {}\nworkload: {load: {mode: closed, concurrency: 1}}\n",
    )
    summary = summary_of(invoke("run", str(path), *FAST, "--json"))
    assert summary["status"] == "FAILED"
    reason = summary["reasons"][0]  # type: ignore[index]
    assert "exited with code 3 before it was ready" in reason


def test_service_not_ready_in_time_is_stopped(
    tmp_path: Path, invoke: Invoke, sqlite_url: str
) -> None:
    marker = tmp_path / "slow.pid"
    path = write(
        tmp_path,
        "slow.yaml",
        "name: slow\ntarget: {kind: command, command: ['{python}', '-c', "
        f"\"import os, time; open(r'{marker}', 'w').write(str(os.getpid())); time.sleep(120)\"], "
        f"url: 'http://127.0.0.1:{free_port()}/', ready_timeout_s: 1.5, stop_grace_s: 1}}\n"
        "knobs: {}\nworkload: {load: {mode: closed, concurrency: 1}}\n",
    )
    result = invoke("run", str(path), *FAST)
    assert result.exit_code != 0
    run = Store.open(sqlite_url).list_runs()[0]
    assert run.status == "FAILED" and "not ready within 1.5 s" in (run.error_message or "")
    assert not psutil.pid_exists(int(marker.read_text()))


def test_killing_the_service_mid_run_fails_the_run_with_its_log_tail(
    tmp_path: Path, sqlite_url: str
) -> None:
    port = free_port()
    path = command_experiment(tmp_path, "victim", port)
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    proc = start_optlab(
        "run", str(path), "--quick", "--duration", "30", "--warmup", "0.3", db=db, new_session=True
    )
    run_id = wait_for_phase(db, "measure")
    os.kill(int((tmp_path / "victim.pid").read_text()), signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    run = Store.open(sqlite_url).get_run(run_id)
    assert run.status == "FAILED"
    message = run.error_message or ""
    assert "the service was killed by SIGKILL during the run" in message
    assert "listening on" in message  # the log tail is in the stored error
    assert "listening on" in stdout + stderr  # and shown


def test_ctrl_c_leaves_no_child_process_behind(tmp_path: Path, sqlite_url: str) -> None:
    port = free_port()
    # The service (aiohttp's run_app) shuts down gracefully on SIGTERM, which takes CPU: on a
    # busy machine 5 s of grace ran out and it was SIGKILLed. The grace is the experiment's
    # setting, not what this test checks; every wait below is on an event, with a deadline
    # that only bounds a hang.
    path = command_experiment(
        tmp_path,
        "interrupted",
        port,
        load="{mode: open, rate: 100, processes: 2}",
        stop_grace_s=120,
    )
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    proc = start_optlab(
        "run", str(path), "--quick", "--duration", "600", "--warmup", "0.3", db=db, new_session=True
    )
    run_id = wait_for_phase(db, "measure", timeout_s=300)
    optlab = psutil.Process(proc.pid)
    service_pid = int((tmp_path / "interrupted.pid").read_text())
    # The service and two load-generator processes (at least), all started before measuring.
    children = optlab.children(recursive=True)
    assert service_pid in {c.pid for c in children}
    assert len(children) >= 3
    # Ctrl-C in a terminal reaches the whole foreground process group.
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=300)
    assert proc.returncode == 130

    def running(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # it exited between the two questions
            return False

    # optlab has exited; its children follow (the service would sleep 120 s).
    wait_until(
        lambda: not any(running(c) for c in children), "optlab's children exit", timeout_s=120
    )
    run = Store.open(sqlite_url).get_run(run_id)
    assert run.status == "KILLED" and run.requests and run.requests > 0
    assert run.summary is not None and run.summary.service["stopped_with"] == "SIGTERM"


# -- secrets -------------------------------------------------------------------------------------

TOKEN = "tok-8d1f4c2a9e77-never-store-me"


def test_a_secret_appears_nowhere_in_the_database_or_any_report(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, invoke: Invoke
) -> None:
    monkeypatch.setenv("OPTLAB_TEST_TOKEN", TOKEN)
    port = free_port()
    extra = (
        "  headers: {Authorization: 'Bearer ${OPTLAB_TEST_TOKEN}'}\n"
        "  env: {TOY_SECRET: '${OPTLAB_TEST_TOKEN}'}\n"
    )
    # The service prints the token to its log, and /echo sends it back in every 401 body.
    base = command_experiment(tmp_path, "secret", port, extra=extra)
    echo = command_experiment(
        tmp_path, "secret-echo", port, extra=extra, url_path="/echo?key=${OPTLAB_TEST_TOKEN}"
    )
    outputs = []
    for path in (base, echo):
        result = invoke("run", str(path), *FAST, "--json")
        outputs.append(result.output)
        assert summary_of(result)["experiment"] == path.stem
    store = Store.open(sqlite_url)
    runs = {r.experiment: r for r in store.list_runs()}
    assert runs["secret-echo"].errors and runs["secret-echo"].errors > 0
    # What was stored names the reference, never the value.
    secret = runs["secret"].summary
    assert secret is not None and secret.service["log_tail"][0].endswith("${OPTLAB_TEST_TOKEN}")
    examples = [e.example or "" for e in store.get_run_errors(runs["secret-echo"].id)]
    assert any("Bearer ${OPTLAB_TEST_TOKEN}" in e for e in examples), examples
    config = store.get_experiment("secret")
    assert config is not None
    for command in (
        ("table", "secret", "--format", "rich"),
        ("table", "secret", "--format", "markdown"),
        ("table", "secret", "--format", "csv"),
        ("table", "secret", "--format", "json"),
        ("table", "secret-echo", "--format", "json"),
        ("report", "secret", "--html", str(tmp_path / "report.html")),
        ("audit", "secret"),
        ("log",),
        ("log", "secret-echo", "--json"),
    ):
        result = invoke(*command)
        outputs.append(result.output)
    outputs.append((tmp_path / "report.html").read_text())
    for text in outputs:
        assert TOKEN not in text
    store.close()
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    for file in db.parent.glob(db.name + "*"):  # the database and its WAL/SHM files
        assert TOKEN.encode() not in file.read_bytes(), file


# -- the serve chain -----------------------------------------------------------------------------


def test_serve_chain_measured_over_http_shows_the_server_side_stages(
    tmp_path: Path, invoke: Invoke
) -> None:
    """experiments/serve: `optlab serve` started as a command target, end to end over HTTP.

    Two of its steps, on a free port: the baseline with vectorised preprocessing (the naive
    one needs ~12 s for the 662 queries a P99 needs) and the dynamic-batching step.
    """
    port = str(free_port())
    folder = tmp_path / "serve"
    folder.mkdir()
    base = (REPO / "experiments" / "serve" / "baseline.yaml").read_text()
    base = base.replace("8765", port).replace("preprocess: python", "preprocess: numpy-pooled")
    # The held-out check costs seconds per run; accuracy_url is tested on the toy service.
    base = "\n".join(line for line in base.splitlines() if "accuracy_url" not in line)
    # What this test checks is the server's stages in the table, not the stability of a 7 s
    # run on a shared 2-core machine: a baseline for a noisy machine says so.
    assert "protocol: {name: full}" in base
    base = base.replace("protocol: {name: full}", "protocol: {name: full, stability_pct: 50}")
    (folder / "baseline.yaml").write_text(base)
    step = (REPO / "experiments" / "serve" / "02-dynamic-batch.yaml").read_text()
    (folder / "batch.yaml").write_text(
        step.replace("parent: serve-preprocess", "parent: serve-baseline")
    )
    # One attempt: what this test checks is the stages in the table, which an INVALID run
    # (too few queries for its P99, halves apart on a busy machine) has as well.
    quick = ("--quick", "--duration", "7", "--warmup", "0.5", "--allow-invalid")
    result = invoke("run", str(folder / "batch.yaml"), "--chain", *quick, "--json")
    assert result.exit_code == 0, result.output
    table = json.loads(invoke("table", "serve-dynamic-batch", "--format", "json").stdout)
    rows = {row["experiment"]: row for row in table["chain"]}
    assert list(rows) == ["serve-baseline", "serve-dynamic-batch"]
    for row in rows.values():
        # The server's own stages, from its Server-Timing header, in the stacked table.
        for stage in ("preprocess", "infer", "postprocess", "app"):
            assert row[f"{stage}_p50_ms"] is not None and row[f"{stage}_p50_ms"] > 0
        assert row["p50_ms"] >= row["app_p50_ms"]  # the client saw the server's time and more
    # Batching shows where it acts: a queue stage appears (requests wait for their batch).
    assert rows["serve-dynamic-batch"]["queue_p50_ms"] > 0
    # The service's own figures, read from metrics_url and accuracy_url, are in the table.
    assert rows["serve-dynamic-batch"]["mean_batch_size"] > 1
    assert rows["serve-baseline"]["mean_batch_size"] is None
    for row in rows.values():
        assert row["infer_ms_per_request"] > 0
        assert row["service_cpu_pct"] > 10  # the service's process tree, sampled apart
    markdown = invoke("table", "serve-dynamic-batch", "--format", "markdown").stdout
    assert "preprocess P50" in markdown and "app P50" in markdown and "queue P50" in markdown
