"""`optlab run` and `optlab log`: measuring, and the list of what was measured."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from optlab.cli.common import EXPERIMENT_PATH, experiment_store, open_store, silence_stdout
from optlab.config.modes import MODES
from optlab.reports.format import percent

if TYPE_CHECKING:
    from optlab.run.runner import LiveStatus, RunOutcome
    from optlab.store import RunSummary, Store


LOG_NAME_MAX = 40
# `optlab run` measured the head and stored it, but the run is INVALID (docs/exit-codes.md).
EXIT_INVALID = 4


def echo_or_reader_gone(text: str) -> None:
    """Print to stdout; if the reader has gone (`| head`, a closed CI log), stop writing
    quietly: the run is stored, and nothing else should fail for want of a reader."""
    try:
        click.echo(text)
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


class PlainProgress:
    """One line every few seconds: what a log file or CI output wants."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.last = 0.0

    def update(self, status: LiveStatus) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last = now
        click.echo(status_line(status), err=True)

    def note(self, text: str) -> None:
        click.echo(text, err=True)

    def close(self) -> None:
        return None


def status_line(s: LiveStatus) -> str:
    remaining = max(s.planned_s - s.elapsed_s, 0)
    cpu = "-" if s.cpu_pct is None else f"{s.cpu_pct:.0f}%"
    gpu = "n/a" if s.gpu_pct is None else f"{s.gpu_pct:.0f}%"
    qps = "-" if s.qps is None else f"{s.qps:.1f}"
    # Errors of the phase so far: a run whose every request times out says so while it runs.
    errors = f"err {s.errors}" + (f" (timeout {s.timeouts})" if s.timeouts else "")
    return (
        f"[{s.experiment}] {s.phase:<7} {s.elapsed_s:6.1f}s (≤{remaining:.0f}s left)  "
        f"QPS {qps}  P50 {_ms(s.p50_ms)} ms  P99 {_ms(s.p99_ms)} ms  {errors}  CPU {cpu}  "
        f"GPU {gpu}"
    )


class LiveProgress:
    """A live line on a terminal (rich), redrawn in place."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def update(self, status: LiveStatus) -> None:
        from rich.text import Text

        # Text, not a str: "[experiment]" would be read as rich markup and vanish.
        self.live.update(Text(status_line(status)))

    def note(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        self.live.stop()


def render_summary(outcome: RunOutcome) -> str:
    s = outcome.summary
    verdict = "VALID" if s.valid else "INVALID"
    label = " PROVISIONAL" if s.provisional else ""
    lines = [
        f"run {s.run_id} {s.experiment}: {s.status} {verdict}{label} "
        f"({s.protocol} protocol, {s.load} loop, {s.duration_s:.1f} s measured)",
        f"  requests {s.requests}  errors {s.errors}{_error_types(s.errors_by_type)}  "
        f"QPS {_ms(s.qps)}",
    ]
    for reason in s.reasons:
        lines.append(f"  invalid: {reason}")
    for note in s.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  {'stage':<14}{'P50':>9}{'P95':>9}{'P99':>9}{'P99.9':>9}{'max':>9}  ms")
    series = dict(s.latency_ms)
    mode = MODES.get(s.load)
    if mode is None or mode.open_loop:  # a closed loop sends on replies: no send lag to show
        series |= s.harness_ms
    for stage, stats in series.items():
        figures = (stats.p50, stats.p95, stats.p99, stats.p999, stats.max)
        lines.append(f"  {stage:<14}" + "".join(f"{_ms(v):>9}" for v in figures))
    lines.extend(_llm_lines(s))
    r = s.resources
    rss = r.rss_peak_bytes
    gpu = r.gpu_util_pct
    lines.append(
        f"  CPU (process) mean {_ms(r.mean_of('cpu_process_pct'))}% max "
        f"{_ms(r.max_of('cpu_process_pct'))}%  "
        f"peak RSS {rss / 2**20:.0f} MiB  GPU "
        + ("n/a" if gpu is None else f"{gpu.mean:.0f}% mean")
        if rss is not None
        else "  resources: no samples"
    )
    service_cpu = r.service_cpu_pct
    if service_cpu:
        service_rss = r.max_of("service_rss_bytes")
        lines.append(
            f"  CPU (service) mean {_ms(service_cpu.mean)}% max {_ms(service_cpu.max)}%"
            + ("" if service_rss is None else f"  peak RSS {service_rss / 2**20:.0f} MiB")
        )
    service = s.service
    if isinstance(service, dict) and s.status != "FINISHED" and service.get("log_tail"):
        lines.append(f"  service {service.get('exit') or 'stopped'}; last log lines:")
        lines.extend(f"    | {line}" for line in service["log_tail"][-10:])
    lines.extend(_target_lines(s))
    parent = s.parent
    if parent:
        lines.append(
            f"  vs {parent.experiment} (run {parent.run_id}, "
            f"{parent.change or 'repeat'}): "
            f"QPS {percent(parent.qps_change_pct, missing='-')}  "
            f"P50 {percent(parent.p50_change_pct, missing='-')}  "
            f"P99 {percent(parent.p99_change_pct, missing='-')}"
        )
    return "\n".join(lines)


def _llm_lines(s: RunSummary) -> list[str]:
    """A streaming LLM run's token figures (docs/run-json.md "llm"), each by its definition."""
    llm = s.llm
    if llm is None:
        return []
    rows = (
        ("ttft", llm.ttft_ms),
        ("ttft (sent)", llm.ttft_sent_ms if llm.client_wait_ms is not None else None),
        ("tpot", llm.tpot_ms),
        ("itl (event)", llm.itl_ms),
        ("itl (token)", llm.itl_token_split_ms),
        ("e2e", llm.e2e_ms),
    )
    lines = [
        f"  {name:<14}" + "".join(f"{_ms(v):>9}" for v in (x.p50, x.p95, x.p99, x.p999, x.max))
        for name, x in rows
        if x is not None
    ]
    goodput = "-" if llm.goodput is None else f"{llm.goodput:.1%}"
    lines.append(
        f"  tokens: {llm.output_tokens} out ({_ms(llm.output_tokens_per_s)}/s), "
        f"{_ms(llm.tokens_per_event)} per event, counted by {llm.token_counts or '-'}; "
        f"goodput {goodput}"
    )
    return lines


def diagnosis_line(store: Store, outcome: RunOutcome) -> str | None:
    """The run's top finding (docs/diagnose.md), or None when the run was not stored or cannot
    be diagnosed: a diagnosis never fails the measurement it reads."""
    if outcome.pending or outcome.unstored or outcome.status == "FAILED":
        return None
    from optlab.diagnose import diagnose_run
    from optlab.reports.diagnose import run_line

    try:
        diagnosis = diagnose_run(store, outcome.run_id)
    except Exception:  # the run is stored; its diagnosis is a courtesy, never a failure
        return None
    return "  " + run_line(diagnosis, diagnosis.knobs)


def _error_types(errors_by_type: dict[str, int]) -> str:
    """Errors by type, most frequent first: "nothing listening" (ClientConnectorError) must
    not look like "the server returns garbage" (HTTP 500)."""
    kinds = sorted(errors_by_type.items(), key=lambda kv: (-kv[1], kv[0]))
    if not kinds:
        return ""
    shown = ", ".join(f"{kind} {count}" for kind, count in kinds[:4])
    return f" ({shown}{', ...' if len(kinds) > 4 else ''})"


def _target_lines(s: RunSummary) -> list[str]:
    """What the target reported about itself: accuracy, batch sizes, cache hits, engine."""
    lines = []
    accuracy = s.accuracy
    if isinstance(accuracy, dict) and accuracy.get("top1") is not None:
        # A user target's accuracy() may report only some of these.
        parts = [f"held-out top-1 {float(accuracy['top1']):.2%}"]
        if accuracy.get("n") is not None:
            parts[0] += f" on {accuracy['n']}"
        if accuracy.get("reference_top1") is not None:
            parts.append(f"fp32 reference {float(accuracy['reference_top1']):.2%}")
        if accuracy.get("drop_pts") is not None:
            parts.append(f"{float(accuracy['drop_pts']):+.2f} points lost")
        if accuracy.get("agreement") is not None:
            parts.append(f"agreement {float(accuracy['agreement']):.2%}")
        lines.append("  accuracy: " + ", ".join(parts))
    found = s.target if isinstance(s.target, dict) else {}
    batching = found.get("batching")
    if batching and batching.get("batches"):
        lines.append(
            f"  batching: {batching['batches']} batches, mean size "
            f"{batching['mean_batch_size']:.2f}, rejected {batching.get('rejected', 0)}"
        )
    cache = found.get("cache")
    if cache:
        rate = cache.get("hit_rate")
        lines.append(
            f"  cache: hit rate {'-' if rate is None else f'{rate:.1%}'} "
            f"({cache['hits']} hits, {cache['misses']} misses)"
        )
    engine = found.get("engine")
    if engine:
        lines.append(
            f"  engine: {engine.get('engine')} {engine.get('precision')} on "
            f"{', '.join(engine.get('providers') or [str(engine.get('device'))])}"
        )
    return lines


def _iso(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


@click.command()
@click.argument("experiment", type=EXPERIMENT_PATH)
@click.option("--quick", is_flag=True, help="Seconds-long PROVISIONAL protocol (demos, tests).")
@click.option("--duration", type=float, metavar="S", help="Measured seconds (<600 provisional).")
@click.option("--warmup", type=float, metavar="S", help="Fixed warmup instead of until-stable.")
@click.option("--chain", is_flag=True, help="First measure ancestors that lack a comparable run.")
@click.option("--repeats", type=click.IntRange(1, 100), default=1, help="Measure N times.")
@click.option(
    "--paired",
    type=click.IntRange(1, 100),
    metavar="N",
    help="Measure the parent and the step alternately, N times each (A B A B ...).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One stdout line per run measured, in order: its summary JSON (the head's is last).",
)
@click.option(
    "--profile",
    is_flag=True,
    help="Sample the target's process with py-spy over the measured phase (threads' top "
    "frames, GIL and idle shares; `pip install 'optlab[profile]'`).",
)
@click.option(
    "--allow-invalid",
    is_flag=True,
    help=f"Exit 0, not {EXIT_INVALID}, when a run measured is INVALID (it is stored either way).",
)
@click.pass_context
def run(
    ctx: click.Context,
    experiment: str,
    quick: bool,
    duration: float | None,
    warmup: float | None,
    chain: bool,
    repeats: int,
    paired: int | None,
    as_json: bool,
    profile: bool,
    allow_invalid: bool,
) -> None:
    """Measure EXPERIMENT: one-variable check, warmup, measurement, validity, storage.

    Refuses a step whose parent has no valid run under the same protocol, or whose
    environment or target code differs from the parent run's. With --paired, a slow drift
    of a shared machine cancels out of the pairwise comparison.

    Exit codes: 0 measured and VALID; 4 measured and stored but INVALID (0 with
    --allow-invalid); 2 refused (an ancestor measured by --chain INVALID included);
    1 FAILED or not stored; 130 interrupted.
    """
    from optlab.run.measurement import GuardedProgress
    from optlab.run.runner import RunOptions
    from optlab.run.runner import run as run_experiment

    if profile:
        from optlab.metrics.profile import find_py_spy

        find_py_spy()  # missing: exit 2 with how to install it, before anything is measured
    options = RunOptions(quick, duration, warmup, chain, repeats, profile=profile)
    live = sys.stderr.isatty() and not as_json
    shown: PlainProgress | LiveProgress = LiveProgress() if live else PlainProgress()
    # Output that fails (a closed pipe, a terminal gone) must never fail the measurement.
    progress = GuardedProgress(shown)

    with experiment_store(ctx, experiment) as store:

        def show(outcome: RunOutcome) -> None:
            progress.note(render_summary(outcome))
            line = diagnosis_line(store, outcome)
            if line is not None:
                progress.note(line)
            if as_json:
                # One line per run as it is measured: an ancestor's, then the head's, last.
                # Strict JSON: the summary holds no NaN (the measurement made it JSON-safe).
                summary = outcome.summary.to_json()
                echo_or_reader_gone(json.dumps(summary, default=str, allow_nan=False))

        try:
            outcomes = run_experiment(
                Path(experiment), store, options, progress, show, paired=paired or 0
            )
        finally:
            shown.close()
    if any(o.status == "KILLED" for o in outcomes):
        ctx.exit(130)
    if any(o.status == "FAILED" or o.pending or o.unstored for o in outcomes):
        # A pending run is safe on disk but not in the database yet: a script must know.
        ctx.exit(1)
    invalid = [o for o in outcomes if not o.summary.valid]
    if invalid and not allow_invalid:
        # Refused ancestors exit 2; the head's own INVALID run must not pass as a success.
        runs = ", ".join(f"run {o.run_id} {o.experiment}" for o in invalid)
        click.echo(
            f"{runs}: INVALID (stored; reasons above); exit {EXIT_INVALID} "
            "(--allow-invalid exits 0)",
            err=True,
        )
        ctx.exit(EXIT_INVALID)


@click.command()
@click.argument("experiment", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
@click.pass_context
def log(ctx: click.Context, experiment: str | None, as_json: bool) -> None:
    """List runs (oldest first) with status, validity, protocol and headline numbers."""
    store = open_store(ctx, read_only=True)
    runs = store.list_runs(experiment, levels=True)
    levels = store.level_tags()
    if as_json:
        from optlab.api import run_row

        for r in runs:
            tag = levels.get(r.id)
            sweep = None
            if tag is not None:
                sweep = {
                    "sweep_id": tag.sweep_id,
                    "level": tag.position,
                    "mode": tag.mode,
                    "load": tag.load,
                }
            click.echo(json.dumps({**run_row(r), "sweep": sweep}, default=_iso))
        return
    if not runs:
        click.echo("no runs yet" + (f" for {experiment}" if experiment else ""))
        return
    # As wide as the longest name (up to a limit, then cut with an ellipsis), so a long
    # name never runs into the status column.
    width = min(max(len("experiment"), *(len(r.experiment) for r in runs)), LOG_NAME_MAX) + 2
    click.echo(
        f"{'id':>4}  {'experiment':<{width}}{'status':<10}{'verdict':<22}{'QPS':>10}"
        f"{'P99 ms':>10}  started"
    )
    for r in runs:
        verdict = "-" if r.valid is None else ("VALID" if r.valid else "INVALID")
        if r.provisional:
            verdict += " PROVISIONAL"
        name = r.experiment
        if len(name) > LOG_NAME_MAX:
            name = name[: LOG_NAME_MAX - 1] + "…"
        click.echo(
            f"{r.id:>4}  {name:<{width}}{r.status:<10}{verdict:<22}{_ms(r.qps):>10}"
            f"{_ms(r.summary.total.p99 if r.summary else None):>10}  "
            f"{r.started_at:%Y-%m-%d %H:%M:%S}"
        )
        tag = levels.get(r.id)
        if tag is not None:
            load = f"{int(tag.load)} clients" if tag.mode == "closed" else f"{tag.load:,.1f}/s"
            click.echo(f"{'':6}sweep {tag.sweep_id} level {tag.position}: {load} ({tag.purpose})")
        for reason in r.reasons:
            click.echo(f"{'':6}{reason}")
        kinds = _error_types(r.summary.errors_by_type if r.summary else {})
        if kinds:
            click.echo(f"{'':6}errors by type: {kinds.strip()[1:-1]}")
