"""How often `optlab diagnose` names the fault a target was built with, and how fast.

Each scenario of `optlab.reference.faults` (an in-process target with ONE known fault, the load
that shows it, and its label {stage, resource}; one control with no fault) is measured with
N seeds (the seed varies the target's knobs and the load: `Scenario.config`) under the quick
protocol (1 s warmup, 5 s measured) into a temporary SQLite database through the library
(`optlab.run.runner.run`, what `optlab run` calls). The noisy-neighbour scenario's neighbour is
started here, not by the target: one `python -c "while True: pass"` per CPU, for the whole
run. Each stored run is then diagnosed (`optlab.diagnose.diagnose_run`), timed.

Printed: per run (with `--evidence`, or while `optlab.diagnose` is absent) the run's stored
evidence (QPS, P50/P99, the largest stage's share, process CPU, context switches, iowait, RSS
slope, send lag, neighbour CPU, GC pauses, batch fill, in-flight) and this script's own
cross-check from getrusage (CPU and context switches of the whole process, every thread,
setup included) and /proc/pressure/io; then the confusion matrix (rows: the labelled
scenario; columns: the first finding's {stage/resource}, or "healthy"), each scenario's
accuracy, the false alarms among the healthy runs and the diagnosis time.

Goals: the first finding's stage AND resource are right in >= 90% of the faulty runs over
>= 10 seeds x >= 9 scenarios; <= 1 false alarm in 10 healthy runs; every verdict within 5 s
of its run. It is a measurement, not a test: PASS/MISS is printed and the exit status is 0
either way. The machine's other processes show in every run (neighbour CPU), so a run on a
shared machine mixes their noise into each scenario; the header's load average says how much.

Run: ``PYTHONPATH=src python benchmarks/diagnosis_accuracy.py [--seeds 10]
[--scenarios lock,gil] [--smoke] [--json] [--evidence]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml
from provenance import SRC, source_hashes

from optlab.reference.fault_scenarios import Scenario, by_name
from optlab.run.runner import RunOptions, run
from optlab.store import RunSummary, Store

try:  # optlab diagnose is new; until it is there, this prints each run's evidence
    from optlab.diagnose import diagnose_run
except ImportError:  # pragma: no cover - depends on the checkout
    diagnose_run = None

WARMUP_S = 1.0  # the quick protocol's
DURATION_S = 5.0
HEALTHY = "healthy"
GOAL_ACCURACY = 0.90
GOAL_SEEDS = 10
GOAL_SCENARIOS = 9
GOAL_FALSE_ALARMS = 1  # in 10 healthy runs
GOAL_DIAGNOSE_S = 5.0
QUIET_NEIGHBOUR_PCT = 25.0  # other processes' CPU below which a run counts as undisturbed
SMOKE = "lock,memory-leak,noisy-neighbour,healthy"
CODE = ("reference/faults.py", "run/measurement.py")


def label_text(label: tuple[str | None, str] | None) -> str:
    if label is None:
        return HEALTHY
    stage, resource_ = label
    return f"{stage or '-'}/{resource_}"


@dataclass
class Outcome:
    scenario: str
    seed: int
    label: str
    run_id: int
    status: str
    valid: bool | None
    reasons: list[str]
    run_s: float
    predicted: str | None = None  # None: not diagnosed
    # The first finding about the target itself (a neighbour's finding aside): what a shared
    # machine leaves to score when other work took the CPU.
    target_predicted: str | None = None
    confidence: float | None = None
    rules: list[str] = field(default_factory=list)
    diagnose_s: float | None = None
    diagnose_error: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.predicted == self.label

    @property
    def target_correct(self) -> bool:
        return self.target_predicted == self.label


# -- the neighbour, the cross-check ------------------------------------------------------------


# A launcher starts the burner in a session of its own and exits at once: the burner is then
# nobody's child here (init adopts it), as a real neighbour is. A child of this process would
# count as optlab's own process tree (the evidence's process CPU), not as a neighbour.
LAUNCH = (
    "import subprocess, sys\n"
    "burner = subprocess.Popen([sys.executable, '-c', 'while True: pass'],"
    " start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
    " stderr=subprocess.DEVNULL)\n"
    "print(burner.pid)\n"
)


@contextmanager
def neighbour(active: bool) -> Iterator[None]:
    """One process per CPU spinning in pure Python while the block runs, none of them a
    descendant of this process."""
    burners: list[psutil.Process] = []
    try:
        if active:
            for _ in range(os.cpu_count() or 1):
                launched = subprocess.run(
                    [sys.executable, "-c", LAUNCH],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=30,
                )
                burners.append(psutil.Process(int(launched.stdout)))
        yield
    finally:
        for burner in burners:
            with suppress(psutil.NoSuchProcess):
                burner.terminate()  # psutil checks it is still the process started above
        psutil.wait_procs(burners, timeout=5)


def _io_pressure_us() -> int | None:
    """Microseconds some task stalled on I/O, machine-wide (PSI); None where unavailable."""
    try:
        line = Path("/proc/pressure/io").read_text().splitlines()[0]
    except OSError:
        return None
    return int(line.rsplit("total=", 1)[1])


@contextmanager
def cross_check(into: dict[str, Any]) -> Iterator[None]:
    """The whole process's CPU and context switches (getrusage: every thread, ended ones
    too) and the machine's I/O pressure over the block."""
    before, io_before, started = resource.getrusage(resource.RUSAGE_SELF), _io_pressure_us(), 0.0
    started = time.perf_counter()
    yield
    wall = time.perf_counter() - started
    after, io_after = resource.getrusage(resource.RUSAGE_SELF), _io_pressure_us()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    into["ru_cpu_pct"] = 100 * cpu / wall
    into["ru_vol_per_s"] = (after.ru_nvcsw - before.ru_nvcsw) / wall
    into["ru_invol_per_s"] = (after.ru_nivcsw - before.ru_nivcsw) / wall
    if io_before is not None and io_after is not None:
        into["io_psi_pct"] = (io_after - io_before) / 1e4 / wall


# -- one run -------------------------------------------------------------------------------------


class _Quiet:
    def update(self, status: Any) -> None:
        return None

    def note(self, text: str) -> None:
        return None


def figures(summary: RunSummary) -> dict[str, Any]:
    """The stored figures a rule would look at, flat."""
    total = summary.total
    found: dict[str, Any] = {
        "qps": summary.qps,
        "p50_ms": total.p50,
        "p99_ms": total.p99,
        "p99_over_p50": total.p99 / total.p50 if total.p99 and total.p50 else None,
        "send_lag_p99_ms": (summary.harness_ms.get("send_lag") or _none()).p99,
        "iowait_pct": summary.resources.mean_of("iowait_pct"),
        "cpu_sampled_pct": summary.resources.mean_of("cpu_process_pct"),
    }
    stages = {k: v.mean for k, v in summary.stages.items() if v.mean is not None}
    if stages and total.mean:
        top = max(stages, key=lambda k: stages[k])
        found["top_stage"] = top
        found["top_share"] = stages[top] / total.mean
    ev = summary.evidence
    if ev is None:
        return found
    if ev.process is not None:
        user, system = ev.process.cpu_user_pct, ev.process.cpu_system_pct
        found["cpu_user_pct"], found["cpu_sys_pct"] = user, system
        found["ctx_vol_per_s"] = ev.process.ctx_voluntary_per_s
        found["ctx_invol_per_s"] = ev.process.ctx_involuntary_per_s
    found["neighbour_pct"] = ev.neighbour_cpu_pct
    found["cores"] = ev.cores
    if ev.memory is not None:
        found["rss_mib_per_1k"] = ev.memory.mib_per_1k_requests
        found["rss_r2"] = ev.memory.r2
    if ev.gc is not None:
        found["gc_max_ms"] = ev.gc.pause_max_ms
    if ev.batching is not None:
        found["batch_fill"] = ev.batching.fill_ratio
    found["in_flight"] = ev.in_flight_mean
    return found


def _none() -> Any:
    from optlab.store.summary import LatencyStats

    return LatencyStats()


def measure(
    scenario: Scenario, seed: int, folder: Path, store: Store, duration_s: float
) -> Outcome:
    config = scenario.config(seed)
    path = folder / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    options = RunOptions(quick=True, duration_s=duration_s, warmup_s=WARMUP_S)
    check: dict[str, Any] = {}
    # What earlier runs left in this process (their stores, configs, results) is frozen out
    # of the collector: a fresh `optlab run` has none of it, and a full collection over 100
    # runs' worth paused everything ~70 ms, long enough to make the generator late.
    gc.collect()
    gc.freeze()
    started = time.monotonic()
    with neighbour(scenario.neighbour), cross_check(check):
        outcome = run(path, store, options, _Quiet())[-1]
    summary = outcome.summary
    return Outcome(
        scenario=scenario.name,
        seed=seed,
        label=label_text(scenario.label),
        run_id=outcome.run_id,
        status=outcome.status,
        valid=summary.valid,
        reasons=list(summary.reasons),
        run_s=time.monotonic() - started,
        figures={**figures(summary), **check},
    )


def diagnose(store: Store, result: Outcome) -> None:
    if diagnose_run is None:
        return
    started = time.perf_counter()
    try:
        found = diagnose_run(store, result.run_id)
    except Exception as exc:  # a crash is a wrong answer, reported, not the end of the run
        result.diagnose_s = time.perf_counter() - started
        result.diagnose_error = f"{type(exc).__name__}: {exc}"
        result.predicted = "error"
        return
    result.diagnose_s = time.perf_counter() - started
    result.rules = [f.rule.id for f in found.findings]
    # No finding: healthy only when the diagnosis says so (not when a core rule could not
    # run, or the run has no data: those are their own answers, and wrong for every label).
    quiet = HEALTHY if found.healthy else found.state
    if not found.findings:
        result.predicted = result.target_predicted = quiet
        return
    first = found.findings[0]
    result.predicted = label_text((first.stage, first.resource))
    result.confidence = first.confidence
    own = [
        f
        for f in found.findings
        if f.rule.id != "noisy-neighbour" or result.scenario == "noisy-neighbour"
    ]
    result.target_predicted = label_text((own[0].stage, own[0].resource)) if own else HEALTHY


# -- printing ------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


EVIDENCE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("qps", "qps", ",.0f"),
    ("P50", "p50_ms", ".2f"),
    ("P99/P50", "p99_over_p50", ".1f"),
    ("top stage", "top_stage", ""),
    ("share", "top_share", ".2f"),
    ("cpu usr", "cpu_user_pct", ".0f"),
    ("sys", "cpu_sys_pct", ".0f"),
    ("vol/s", "ctx_vol_per_s", ".0f"),
    ("invol/s", "ctx_invol_per_s", ".0f"),
    ("iowait", "iowait_pct", ".1f"),
    ("rss/1k", "rss_mib_per_1k", ".1f"),
    ("lag99", "send_lag_p99_ms", ".2f"),
    ("nbr", "neighbour_pct", ".0f"),
    ("gc max", "gc_max_ms", ".1f"),
    ("fill", "batch_fill", ".2f"),
    ("inflt", "in_flight", ".1f"),
    ("ru cpu", "ru_cpu_pct", ".0f"),
    ("ru vol/s", "ru_vol_per_s", ",.0f"),
    ("ru invol/s", "ru_invol_per_s", ",.0f"),
    ("io psi", "io_psi_pct", ".1f"),
)


def evidence_header() -> str:
    cells = [f"{'scenario':<16} {'seed':>4} {'valid':<5}"]
    cells += [f"{title:>{max(len(title), 6)}}" for title, _, _ in EVIDENCE_COLUMNS]
    return "  ".join(cells)


def evidence_line(result: Outcome) -> str:
    valid = "-" if result.valid is None else ("yes" if result.valid else "NO")
    cells = [f"{result.scenario:<16} {result.seed:>4} {valid:<5}"]
    for title, key, spec in EVIDENCE_COLUMNS:
        cells.append(f"{_fmt(result.figures.get(key), spec):>{max(len(title), 6)}}")
    line = "  ".join(cells)
    if result.predicted is not None:
        mark = "ok" if result.correct else "WRONG"
        line += f"  -> {result.predicted} ({mark}, {_fmt(result.diagnose_s, '.2f')} s)"
    return line


def matrix(results: list[Outcome]) -> dict[str, Any]:
    """The confusion matrix and its figures, JSON-ready."""
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    labels: dict[str, str] = {}
    for r in results:
        labels[r.scenario] = r.label
        if r.predicted is not None:
            rows[r.scenario][r.predicted] += 1
    expected = list(dict.fromkeys(labels.values()))
    seen = [p for row in rows.values() for p in row if p not in expected]
    columns = [c for c in expected if c != HEALTHY] + sorted(set(seen)) + [HEALTHY]
    per_scenario = {}
    for name in labels:
        done = [r for r in results if r.scenario == name and r.predicted is not None]
        per_scenario[name] = {
            "label": labels[name],
            "runs": len(done),
            "correct": sum(r.correct for r in done),
            "accuracy": sum(r.correct for r in done) / len(done) if done else None,
        }
    faulty = [r for r in results if r.label != HEALTHY and r.predicted is not None]
    healthy = [r for r in results if r.label == HEALTHY and r.predicted is not None]
    times = [r.diagnose_s for r in results if r.diagnose_s is not None]
    quiet = [r for r in faulty if _quiet(r)]
    return {
        "columns": columns,
        "rows": {name: dict(rows[name]) for name in labels},
        "labels": labels,
        "per_scenario": per_scenario,
        "faulty_runs": len(faulty),
        "faulty_correct": sum(r.correct for r in faulty),
        "accuracy": sum(r.correct for r in faulty) / len(faulty) if faulty else None,
        "quiet_runs": len(quiet),
        "quiet_correct": sum(r.correct for r in quiet),
        "target_correct": sum(r.target_correct for r in faulty),
        "target_rows": {
            name: dict(Counter(r.target_predicted for r in results if r.scenario == name))
            for name in labels
        },
        "healthy_target_alarms": sum(not r.target_correct for r in healthy),
        "healthy_runs": len(healthy),
        "false_alarms": sum(not r.correct for r in healthy),
        "diagnose_s_max": max(times) if times else None,
        "diagnosed": diagnose_run is not None,
        "runs": [asdict(r) for r in results],
    }


def _quiet(result: Outcome) -> bool:
    """A run that other processes left alone (the neighbour scenario's own neighbour aside)."""
    if result.scenario == "noisy-neighbour":
        return True
    other = result.figures.get("neighbour_pct")
    return other is not None and other < QUIET_NEIGHBOUR_PCT


def print_matrix(found: dict[str, Any]) -> None:
    columns: list[str] = found["columns"]
    width = max(12, *(len(c) for c in columns))
    names = list(found["labels"])
    first = max(len(f"{n} ({found['labels'][n]})") for n in names)
    print("# confusion matrix: rows the labelled scenario, columns the first finding")
    print(f"{'':<{first}}  " + "  ".join(f"{c:>{width}}" for c in columns) + "  accuracy")
    for name in names:
        row = found["rows"][name]
        scored = found["per_scenario"][name]
        accuracy = _fmt(scored["accuracy"], ".0%")
        cells = "  ".join(f"{row.get(c, 0) or '.':>{width}}" for c in columns)
        head = f"{name} ({found['labels'][name]})"
        print(f"{head:<{first}}  {cells}  {accuracy} ({scored['correct']}/{scored['runs']})")


def print_goals(found: dict[str, Any], seeds: int, scenarios: int) -> None:
    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    accuracy = found["accuracy"]
    enough = seeds >= GOAL_SEEDS and scenarios >= GOAL_SCENARIOS
    scope = "" if enough else f" (NOT JUDGED: {seeds} seeds x {scenarios} faulty scenarios)"
    acc_ok = accuracy is not None and accuracy >= GOAL_ACCURACY and enough
    print(
        f"stage and resource right in >= 90% of faulty runs (>= {GOAL_SEEDS} seeds x >= "
        f"{GOAL_SCENARIOS} scenarios): {found['faulty_correct']}/{found['faulty_runs']} = "
        f"{_fmt(accuracy, '.1%')}{scope}: {verdict(acc_ok)}"
    )
    quiet, right = found["quiet_runs"], found["quiet_correct"]
    print(
        f"  on the runs other processes left alone (< {QUIET_NEIGHBOUR_PCT:g}% of a core "
        f"beside the noisy-neighbour scenario's own): {right}/{quiet} = "
        f"{_fmt(right / quiet if quiet else None, '.1%')}"
    )
    print(
        f"  the first finding about the target (a neighbour's finding aside): "
        f"{found['target_correct']}/{found['faulty_runs']}; false alarms on healthy runs so "
        f"read: {found['healthy_target_alarms']} in {found['healthy_runs']}"
    )
    for name, row in found["target_rows"].items():
        print(f"    {name}: " + ", ".join(f"{k} {v}" for k, v in sorted(row.items(), key=str)))
    healthy = found["healthy_runs"]
    alarms = found["false_alarms"]
    alarm_ok = healthy > 0 and alarms <= GOAL_FALSE_ALARMS * healthy / 10
    scope = "" if healthy >= 10 else " (NOT JUDGED: fewer than 10 healthy runs)"
    print(
        f"false alarms <= {GOAL_FALSE_ALARMS} in 10 healthy runs: {alarms} in {healthy}"
        f"{scope}: {verdict(alarm_ok and healthy >= 10)}"
    )
    worst = found["diagnose_s_max"]
    print(
        f"verdict within {GOAL_DIAGNOSE_S:g} s of the run: max {_fmt(worst, '.2f')} s: "
        f"{verdict(worst is not None and worst <= GOAL_DIAGNOSE_S)}"
    )


def code_id() -> str:
    diagnose = sorted(p.relative_to(SRC).as_posix() for p in (SRC / "diagnose").glob("*.py"))
    return source_hashes(*CODE, *diagnose)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--scenarios", help="comma-separated names, e.g. lock,gil")
    parser.add_argument("--smoke", action="store_true", help=f"one seed of {SMOKE}")
    parser.add_argument("--json", action="store_true", help="the matrix and runs as JSON")
    parser.add_argument("--evidence", action="store_true", help="each run's evidence")
    parser.add_argument("--duration", type=float, default=DURATION_S, help="measured seconds")
    args = parser.parse_args(argv)
    scenarios = by_name(args.scenarios or (SMOKE if args.smoke else None))
    seeds = 1 if args.smoke else args.seeds
    show_evidence = args.evidence or diagnose_run is None
    out: Callable[..., None] = print if not args.json else _stderr

    load1, _, _ = os.getloadavg()
    out(
        f"# diagnosis_accuracy: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load1:.2f}; code: {code_id()}"
    )
    out(
        f"# {len(scenarios)} scenarios x {seeds} seeds, quick protocol ({WARMUP_S:g} s warmup, "
        f"{args.duration:g} s measured), in process; diagnose: "
        f"{'optlab.diagnose.diagnose_run' if diagnose_run else 'ABSENT (evidence only)'}"
    )
    if show_evidence:
        out(
            "# evidence: cpu/sys/vol/invol and nbr = the run's evidence (% of one core, per s); "
            "ru * = getrusage over the whole run (every thread); io psi = /proc/pressure/io"
        )
        out(evidence_header())
    results: list[Outcome] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="optlab-diagnosis-") as tmp:
        folder = Path(tmp)
        store = Store.open(f"sqlite:///{folder / 'runs.db'}")
        cwd = os.getcwd()
        os.chdir(folder)  # whatever a run leaves in its working directory stays in tmp
        try:
            for seed in range(seeds):
                for scenario in scenarios:
                    result = measure(scenario, seed, folder, store, args.duration)
                    diagnose(store, result)
                    results.append(result)
                    if show_evidence:
                        out(evidence_line(result))
                    elif result.predicted is not None and not result.correct:
                        out(f"# wrong: {evidence_line(result)}")
        finally:
            os.chdir(cwd)
            store.close()
    elapsed = time.monotonic() - started
    found = matrix(results)
    found["elapsed_s"] = elapsed
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    runs_s = [r.run_s for r in results]
    print(
        f"# {len(results)} runs in {elapsed:.0f} s (a run {min(runs_s):.1f}-{max(runs_s):.1f} s "
        f"with its setup); invalid runs: {sum(r.valid is False for r in results)}"
    )
    if diagnose_run is None:
        print("# no optlab.diagnose in this checkout: no matrix, no goals")
        return 0
    print_matrix(found)
    print_goals(found, seeds, len([s for s in scenarios if s.label is not None]))
    return 0


def _stderr(*parts: Any) -> None:
    print(*parts, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
