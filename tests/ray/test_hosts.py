"""Load from several hosts on a real Ray cluster of three nodes on this machine (docs/hosts.md):
one schedule, an exact merge, measured clock offsets, a verdict per node, refusals before any
run row."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optlab.config.loading import load_experiment
from optlab.config.models import ResolvedConfig
from optlab.load.hosts import RayLoadGenerator, connect
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.log import Collector
from optlab.store import Store
from optlab.targets.http import classify
from optlab.targets.registry import load_target
from optlab.targets.resolve import resolve_baseline
from tests.support.capabilities import lacks, module
from tests.support.files import write
from tests.support.httpsvc import command_experiment
from tests.support.proc import free_port, run_optlab, start_optlab

module("ray")  # the lane needs Ray: skipped, with the reason, where it is not installed
from tests.support.raycluster import OFFSETS_S, LocalCluster, hosts_experiment  # noqa: E402

QUICK = ("--quick", "--duration", "3", "--warmup", "0.5")


def _summary(done: subprocess.CompletedProcess[str], exit_code: int = 0) -> dict[str, Any]:
    """The `run --json` summary; an INVALID run exits 4."""
    assert done.returncode == exit_code, done.stderr[-3000:]
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def _drive(path: Path, seconds: float) -> tuple[RayLoadGenerator, Collector]:
    """The experiment's load, driven through the library for `seconds`, every sample folded."""
    config = ResolvedConfig.model_validate(resolve_baseline(load_experiment(path)))
    target = load_target(config, [path.parent])
    assert target.client is not None and config.workload.load.hosts is not None
    generator = RayLoadGenerator(
        target.client,
        config.workload.load,
        connect(config.workload.load.hosts),
        classify=classify,
        timeout_s=10,
        seed=7,
    )
    collector = Collector()
    collector.set_phase("measure", 0)
    generator.start(collector)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
        collector.drain()
    generator.stop(5)
    collector.drain()
    collector.finish()
    return generator, collector


def test_one_poisson_schedule_from_three_nodes_merges_count_for_count(
    cluster: LocalCluster, mmc_port: int, tmp_path: Path, timens_missing: str | None
) -> None:
    path = hosts_experiment(
        tmp_path, "poisson", mmc_port, cluster.address,
        load="mode: open, rate: 1200, arrival: poisson",
    )  # fmt: skip
    generator, collector = _drive(path, 4.0)
    assert generator.failure is None
    merged = collector.histograms("measure")["total"]
    tallies = collector.source_tallies("measure")
    assert sorted(tallies) == ["node-a", "node-b", "node-c"]
    summed = LatencyHistogram()
    for name, tally in tallies.items():
        summed.merge(tally.total)
        # What each node's workers measured and handed over, as the node counted it itself.
        report = next(r for r in generator.reports() if r.node == name)
        own = LatencyHistogram()
        for encoded in report.shipped:
            own.merge(LatencyHistogram.decode(encoded))
        assert np.array_equal(own.counts, tally.total.counts), name
        # Request i went to worker i mod 3: each node sent a third of the schedule.
        assert abs(tally.ok - merged.count / 3) <= 0.05 * merged.count + 5, name
    assert np.array_equal(summed.counts, merged.counts)
    assert merged.count == collector.totals("measure")[0] > 0
    # Achieved rate within the Poisson noise of the offered 1,200/s (over ~4.x s).
    issued = generator.issued
    span_s = (time.perf_counter_ns() - generator.t0_ns) / 1e9
    assert issued <= 1200 * span_s + 4 * math.sqrt(1200 * span_s)
    assert issued >= 1200 * 3.5 - 4 * math.sqrt(1200 * 3.5)
    reports = {r.node: r for r in generator.reports()}
    # Measured again after the load: these clocks run at one rate (one machine, shifted by a
    # constant), so each node's drift over the run is nothing, within its bound.
    for name, report in reports.items():
        assert report.drift_ms is not None and report.drift_bound_ms is not None, name
        assert abs(report.drift_ms) <= report.drift_bound_ms + 0.05, (name, report)
    if timens_missing:
        lacks(f"Linux time namespaces, to inject clock offsets ({timens_missing})")
    # The offsets the nodes' clocks were started with, found within their stated bounds (one
    # machine: CLOCK_MONOTONIC is one clock but for the namespace's shift).
    found = sorted(r.offset_ms for r in reports.values())
    for injected, report in zip(sorted([0.0, *OFFSETS_S]), sorted(reports.values(),
                                key=lambda r: r.offset_ms), strict=True):  # fmt: skip
        error_ms = abs(report.offset_ms - injected * 1000)
        assert error_ms <= report.offset_bound_ms + 0.05, (found, report)
        assert report.consistent
    # ... and the schedule started together: time zero on the wall clock (which a time
    # namespace does not shift) within the offsets' bounds of each other.
    walls = [w for r in reports.values() for w in r.t0_wall_ns]
    bound_ms = 2 * max(r.offset_bound_ms for r in reports.values())
    assert (max(walls) - min(walls)) / 1e6 <= bound_ms + 1.0, walls


def test_run_json_names_each_node_and_the_env_and_table_show_the_node_set(
    cluster: LocalCluster, mmc_port: int, tmp_path: Path
) -> None:
    path = hosts_experiment(tmp_path, "constant", mmc_port, cluster.address)
    db = tmp_path / "optlab.db"
    summary = _summary(run_optlab("run", str(path), *QUICK, "--json", db=db, cwd=tmp_path))
    assert summary["status"] == "FINISHED"
    hosts = summary["hosts"]
    assert isinstance(hosts, list) and [h["node"] for h in hosts] == ["node-a", "node-b", "node-c"]
    for host in hosts:
        assert set(host) >= {"node", "offset_ms", "offset_bound_ms", "requests",
                             "send_lag_p99_ms", "valid"}  # fmt: skip
        assert host["offset_bound_ms"] > 0 and host["round_trip_ms"] == pytest.approx(
            2 * host["offset_bound_ms"], rel=0.01, abs=0.01
        )
    assert sum(h["requests"] for h in hosts) == summary["requests"]
    if summary["valid"]:
        assert all(h["valid"] for h in hosts)
    store = Store.open(f"sqlite:///{db}")
    run = store.get_run(int(summary["run_id"]))
    assert run.summary is not None and run.summary.hosts is not None
    assert [h.node for h in run.summary.hosts] == ["node-a", "node-b", "node-c"]
    # The per-second windows hold the requests of every node, placed on this clock: all of
    # them but a sub-half-second sliver at the end (Collector).
    windows = store.get_windows(run.id, "measure")
    assert 0.97 * summary["requests"] <= sum(w.completed for w in windows) <= summary["requests"]
    env = run_optlab("env", str(path), "--json", cwd=tmp_path)
    assert env.returncode == 0, env.stderr
    nodes = json.loads(env.stdout)["hosts"]["nodes"]
    assert len(nodes) == 3 and all(n["software"]["packages"]["optlab"] for n in nodes)
    table = run_optlab("table", "constant", "--format", "markdown", db=db, cwd=tmp_path)
    assert "load from 3 Ray nodes" in table.stdout, table.stdout


def test_a_chain_and_a_sweep_run_with_hosts(cluster: LocalCluster, tmp_path: Path) -> None:
    port = free_port()
    hosts = f"hosts: {{ray: '{cluster.address}', nodes: 2}}"
    base = command_experiment(
        tmp_path, "svc", port, load=f"{{mode: open, rate: 300, arrival: constant, {hosts}}}"
    )
    step = write(tmp_path, "fast.yaml", "name: svc-fast\nparent: svc\nchange: {delay_ms: 0.5}\n")
    db = tmp_path / "optlab.db"
    chain = run_optlab("run", str(step), *QUICK, "--chain", "--json", db=db, cwd=tmp_path,
                       timeout=240)  # fmt: skip
    assert chain.returncode == 0, chain.stderr[-3000:]
    store = Store.open(f"sqlite:///{db}")
    runs = sorted(store.list_runs(), key=lambda r: r.id)
    assert [r.experiment for r in runs] == ["svc", "svc-fast"]
    for run in runs:
        assert run.summary is not None and run.summary.hosts is not None
        assert len(run.summary.hosts) == 2
    # The step was checked against its parent's run: same node set, same environments.
    assert runs[1].summary is not None and runs[1].summary.parent is not None
    table = run_optlab("table", "svc-fast", "--format", "markdown", db=db, cwd=tmp_path)
    assert "load from 2 Ray nodes" in table.stdout, table.stdout
    sweep = run_optlab(
        "sweep", str(base), "--slo", "p99=200ms", "--quick", "--level-duration", "2",
        "--min-rate", "100", "--max-rate", "300", "--budget-s", "6", "--json",
        db=db, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    result = json.loads(sweep.stdout.strip().splitlines()[-1])
    assert result["levels"], result
    for level in result["levels"]:
        run = store.get_run(level["run_id"])
        assert run.summary is not None and run.summary.hosts is not None
        assert len(run.summary.hosts) == 2


def test_a_cpu_starved_node_is_named_generator_bound(
    cluster: LocalCluster, tmp_path: Path, mmc_port: int
) -> None:
    path = hosts_experiment(tmp_path, "starved", mmc_port, cluster.address)
    db = tmp_path / "optlab.db"
    with cluster.nodes[2].starved():
        done = run_optlab("run", str(path), *QUICK, "--json", db=db, cwd=tmp_path, timeout=180)
    summary = _summary(done, exit_code=4)
    starved_id = cluster.node_ids_with("optlab-test-2")
    assert summary["valid"] is False
    by_id = {h["node_id"]: h for h in summary["hosts"]}
    behind = by_id[starved_id[0]]
    others = [h for h in by_id.values() if h is not behind]
    assert behind["valid"] is False and all(h["valid"] for h in others), summary["hosts"]
    assert any(
        behind["node"] in r and "fell behind its schedule" in r for r in summary["reasons"]
    ), summary["reasons"]


# Last in the module: it kills a node of the module's cluster.
def test_a_node_killed_mid_run_keeps_what_it_sent_and_is_named(
    cluster: LocalCluster, tmp_path: Path, mmc_port: int
) -> None:
    path = hosts_experiment(tmp_path, "lost", mmc_port, cluster.address)
    db = tmp_path / "optlab.db"
    proc = start_optlab(
        "run", str(path), "--quick", "--duration", "6", "--warmup", "0.5", "--json",
        db=db, cwd=tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    # Kill a node once the measured phase is under way (~halfway through).
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if db.exists():
            runs = Store.open(f"sqlite:///{db}").list_runs()
            if runs and runs[0].status == "RUNNING":
                time.sleep(4.5)
                break
    victim = cluster.node_ids_with("optlab-test-1")
    cluster.nodes[1].kill()
    out, err = proc.communicate(timeout=180)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "FAILED", err[-3000:]
    assert summary["valid"] is False
    lost = [h for h in summary["hosts"] if h["lost_at_s"] is not None]
    assert [h["node_id"] for h in lost] == victim, summary["hosts"]
    name = lost[0]["node"]
    assert any(name in r and "was lost" in r for r in summary["reasons"]), summary["reasons"]
    assert lost[0]["valid"] is False
    # What it sent before it was lost is in the run.
    assert lost[0]["requests"] > 0
    assert sum(h["requests"] for h in summary["hosts"]) == summary["requests"]
    # No worker process outlives its actor: the lost node's died with it, the others' ended
    # with the run (each dies with its actor: Linux's parent-death signal).
    assert _worker_processes_gone(10.0), _worker_processes()


def _worker_processes() -> list[str]:
    """Load-generator worker processes a Ray actor started (or that an actor left behind)."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
        if "spawn_main" not in " ".join(process.info.get("cmdline") or []):
            continue
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(process.info["ppid"]).name()
            if process.info["ppid"] == 1 or parent.startswith("ray::"):
                found.append(f"{process.info['pid']} (parent {parent})")
    return found


def _worker_processes_gone(within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _worker_processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True
