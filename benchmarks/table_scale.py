"""How long the stacked-gains table takes on a big results database.

Builds (once, cached under /tmp) a SQLite database holding 10,000 finished runs: a 10-step chain
with 100 runs per step (each with 600 per-second windows, as a full-protocol run has), and
9,000 runs of 90 other experiments (60 windows each, to keep the build to minutes). Then
times, over several repetitions, building the table of
the chain's head (run selection, the 10 newest repeats per step compared with their time series) and
rendering it as rich text, markdown, JSON and CSV. Goal: under 1 second for build + render.
The reference measured in the same run is reading the head's run list alone (the floor any
table must pay).

    PYTHONPATH=src python benchmarks/table_scale.py [--smoke]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

from optlab.store import (
    LatencyStats,
    MeanMax,
    ResourceSummary,
    RunFinal,
    RunSummary,
    StageStatsRow,
    Store,
    WindowStats,
)

GOAL_S = 1.0
STEPS = 10


def _config(service_ms: float) -> dict[str, object]:
    return {
        "target": {"kind": "builtin", "name": "synthetic"},
        "knobs": {"service_ms": service_ms},
        "workload": {"load": {"mode": "closed", "concurrency": 4}},
    }


def build(path: Path, runs_per_step: int, other_experiments: int, windows: int) -> None:
    store = Store.open(f"sqlite:///{path}")
    rng = random.Random(7)
    protocol = {"name": "full", "duration_s": 600.0, "provisional": False}
    env = store.record_environment({"hardware": {"cpu": {"model": "bench"}}}, "bench-material")

    def experiment(name: str, parent: str | None, service_ms: float) -> None:
        store.save_config(
            name=name,
            kind="baseline" if parent is None else "step",
            parent=parent,
            description=None,
            hypothesis=f"{name} is faster",
            config=_config(service_ms),
            config_hash=f"hash-{name}",
            change=None if parent is None else {"service_ms": service_ms},
            variable=None if parent is None else "service_ms",
            parent_config_hash=None if parent is None else f"hash-{parent}",
            source_path=f"{name}.yaml",
            source_hash=name,
        )

    def measure(name: str, service_ms: float, count: int, windows: int) -> None:
        for _ in range(count):
            run_id = store.create_run(
                experiment=name,
                protocol_name="full",
                protocol=protocol,
                provisional=False,
                environment_id=env,
                code_identity={"kind": "builtin"},
                git_commit="abc123",
                git_dirty=False,
            )
            qps = 4000 / service_ms * rng.uniform(0.97, 1.03)
            p50 = service_ms * rng.uniform(0.97, 1.03)
            store.add_windows(
                run_id,
                [
                    WindowStats("measure", t, int(qps), 0, qps * rng.uniform(0.9, 1.1),
                                p50 * rng.uniform(0.9, 1.1), 2 * p50 * rng.uniform(0.8, 1.2))
                    for t in range(windows)
                ],
            )  # fmt: skip
            requests = int(qps * 600)
            # As a runner stores it: the total's figures in its stage row, the rest in the summary.
            store.add_stage_stats(run_id, [
                StageStatsRow("total", "measure", requests, "", p50_ms=p50, p95_ms=1.6 * p50,
                              p99_ms=2 * p50, p999_ms=3 * p50)
            ])  # fmt: skip
            total = LatencyStats(p50=p50, p95=1.6 * p50, p99=2 * p50, p999=3 * p50, count=requests)
            summary = RunSummary(
                run_id=run_id, experiment=name, status="FINISHED", valid=True, provisional=False,
                protocol="full", load="closed", requests=requests, errors=0, qps=qps,
                warmup_s=30.0, duration_s=600.0, latency_ms={"total": total},
                resources=ResourceSummary(cpu_process_pct=MeanMax(mean=150.0, max=190.0)),
            )  # fmt: skip
            store.finish_run(run_id, RunFinal(
                status="FINISHED", valid=True, requests=requests, errors=0, qps=qps,
                warmup_s=30.0, duration_s=600.0, summary=summary,
            ))  # fmt: skip

    parent = None
    for step in range(STEPS):
        name = f"step-{step:02d}"
        service = 2.0 * 0.93**step
        experiment(name, parent, service)
        measure(name, service, runs_per_step, windows)
        parent = name
    for other in range(other_experiments):
        name = f"other-{other:03d}"
        experiment(name, None, 1.0)
        measure(name, 1.0, runs_per_step, 60)
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="1,000 runs, 60 windows each")
    args = parser.parse_args()
    runs_per_step, others, windows = (10, 90, 60) if args.smoke else (100, 90, 600)
    total = runs_per_step * (STEPS + others)
    from optlab.store.schema import head_revision

    # Keyed by the schema too: a database built by an older optlab is rebuilt, not refused.
    path = Path(f"/tmp/optlab-table-scale-{total}-{windows}-{head_revision()}.db")
    started = time.perf_counter()
    if not path.exists():
        tmp = path.with_suffix(".building")
        tmp.unlink(missing_ok=True)
        build(tmp, runs_per_step, others, windows)
        tmp.replace(path)
        print(f"built {path} with {total:,} runs in {time.perf_counter() - started:.1f} s")
    load = os.getloadavg()[0]
    print(f"# table_scale: {total:,} runs, {STEPS}-step chain, {windows} windows per run; "
          f"load average {load:.2f}")  # fmt: skip
    from optlab.reports.export import render_csv, render_json
    from optlab.reports.markdown import render_markdown
    from optlab.reports.table import stacked_table
    from optlab.reports.terminal import render_text

    store = Store.open(f"sqlite:///{path}")
    head = f"step-{STEPS - 1:02d}"
    floors, builds, renders = [], [], []
    for _ in range(5):
        t0 = time.perf_counter()
        store.list_runs(head)
        t1 = time.perf_counter()
        frame = stacked_table(store, head)
        t2 = time.perf_counter()
        render_text(frame)
        render_markdown(frame)
        render_json(frame)
        render_csv(frame)
        t3 = time.perf_counter()
        floors.append(t1 - t0)
        builds.append(t2 - t1)
        renders.append(t3 - t2)
    assert len(frame.rows) == STEPS and frame.rows[-1].verdict in ("gain", "within noise")
    floor, build_s, render_s = (statistics.median(v) for v in (floors, builds, renders))
    print(f"reference: the head's run list   {floor * 1000:8.1f} ms")
    print(f"build the table ({STEPS} steps)      {build_s * 1000:8.1f} ms  "
          f"(ratio {build_s / floor:.1f} to the reference)")  # fmt: skip
    print(f"render rich+markdown+json+csv    {render_s * 1000:8.1f} ms")
    verdict = "PASS" if build_s + render_s < GOAL_S else "MISS"
    print(f"table of a {STEPS}-step chain from {total:,} runs under {GOAL_S:g} s: "
          f"{build_s + render_s:.3f} s {verdict}")  # fmt: skip
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
