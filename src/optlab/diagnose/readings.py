"""Readings the rules share: the stage that costs a request the most, the wait stage, the
engine's busy time, the busiest thread, requests in flight (docs/diagnose.md "How a run is
read")."""

from __future__ import annotations

from optlab.diagnose.evidence import WAIT_STAGES, Evidence
from optlab.diagnose.findings import Unevaluable
from optlab.run.pace import BACKLOG_GROWTH_MIN, saturated_by
from optlab.store.reasons import SATURATION, ReasonCode
from optlab.store.summary import ProcessEvidence

__all__ = [
    "batching_on",
    "busy_engine",
    "half_slopes",
    "hot_thread",
    "in_flight",
    "no_cpu",
    "saturation",
    "queued_inside",
    "service_time",
    "single_worker",
    "work_share",
    "throughput",
    "verdict_says",
    "serial_stage",
    "target_process",
    "wait_stage",
]


def throughput(e: Evidence) -> float | None:
    return e.run.qps


def busy_engine(e: Evidence) -> tuple[float, int] | None:
    """(fraction of the measured time the engine instances were busy per instance, instances),
    from the figures the target reported, as its kind reads them (`TargetKind.engine_busy`);
    None when its kind reads no such figure or the target reported none."""
    summary = e.summary
    if summary is None or not e.run.duration_s or e.kind is None:
        return None
    found = e.kind.engine_busy(summary.target)
    if found is None:
        return None
    busy, count = found
    return busy / 1000 / e.run.duration_s / count, count


def hot_thread(e: Evidence) -> tuple[str, float] | None:
    process = target_process(e)
    if process is None or not process.threads:
        return None
    top = max(process.threads, key=lambda t: t.cpu_pct)
    return top.name, top.cpu_pct


def target_process(e: Evidence) -> ProcessEvidence | None:
    recorded = e.recorded
    if recorded is None:
        return None
    return recorded.process if e.in_process else recorded.service


def serial_stage(e: Evidence) -> tuple[str, float, float] | None:
    """The work stage that costs a request the most: (name, occupancy, share of the total).

    Ranked by each stage's fastest time: under contention (the GIL, a saturated CPU) every
    stage's wall time stretches with waits, even a stage that only sleeps, while the fastest
    request's time stays close to what the stage itself costs. Ties (equal fastest times, or
    none recorded) go to the mean.
    """
    qps = throughput(e)
    if not qps:
        return None
    best: tuple[str, float, float] | None = None
    best_key: tuple[float, float] = (-1.0, -1.0)
    for name, row in e.work_stages().items():
        if name in WAIT_STAGES or row.mean_ms is None:
            continue
        fastest = e.fastest_ms(name)
        key = (fastest if fastest is not None else row.mean_ms, row.mean_ms)
        if key > best_key:
            best_key = key
            best = (name, qps * row.mean_ms / 1000, e.share(name) or 0.0)
    return best


def wait_stage(e: Evidence) -> tuple[str, float] | None:
    shares = {name: e.share(name) for name in e.work_stages() if name in WAIT_STAGES}
    known = {n: s for n, s in shares.items() if s is not None}
    if not known:
        return None
    name = max(known, key=lambda n: known[n])
    return name, known[name]


def in_flight(e: Evidence) -> float | None:
    recorded = e.recorded
    if recorded is not None and recorded.in_flight_mean is not None:
        return recorded.in_flight_mean
    counts = [w.in_flight for w in e.windows if w.in_flight is not None]
    if counts:
        return sum(counts) / len(counts)
    clients = e.clients
    return float(clients) if clients is not None else None


def no_cpu(e: Evidence) -> Unevaluable:
    if e.service_unseen:
        return Unevaluable(
            "no CPU figures for a service optlab did not start (kind http): start it with "
            "kind command so its process tree is sampled"
        )
    return Unevaluable("no CPU samples in the measured phase")


def batching_on(e: Evidence) -> bool:
    """The target batches requests, as its kind reads its knobs (False when it cannot say)."""
    return bool(e.kind is not None and e.config is not None and e.kind.batching_on(e.config))


def half_slopes(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares slopes (per second) of the first and second half of `points`; None with
    fewer than 6 points."""
    if len(points) < 6:
        return None
    middle = len(points) // 2

    def slope(part: list[tuple[float, float]]) -> float:
        mean_t = sum(t for t, _ in part) / len(part)
        mean_v = sum(v for _, v in part) / len(part)
        spread = sum((t - mean_t) ** 2 for t, _ in part)
        if spread == 0:
            return 0.0
        return sum((t - mean_t) * (v - mean_v) for t, v in part) / spread

    return slope(points[:middle]), slope(points[middle:])


def verdict_says(e: Evidence, *codes: ReasonCode) -> str | None:
    """The text of the first of the run's INVALID reasons with one of these codes (matched by
    code, never by its wording: docs/run-json.md's reasons)."""
    found = e.run.reason(*codes)
    return None if found is None else found.text


def saturation(e: Evidence) -> tuple[str, ReasonCode | None] | None:
    """Why the target was saturated (open loop: it could not sustain the offered rate), with
    the code of the verdict's reason that says so: from the verdict's reasons or, for runs
    judged before the rule (code None), from the rate and the backlog the windows show; None
    when it was not."""
    found = e.run.reason(*SATURATION)
    if found is not None:
        return found.text, found.code
    if not e.open_loop:
        return None
    rate, qps = e.offered_qps, throughput(e)
    counts = [w.in_flight for w in e.windows if w.in_flight is not None]
    if not rate or qps is None or not e.run.duration_s or len(counts) < 2:
        return None
    # The one saturation rule (run/pace.py), on the backlog the windows show.
    grew = counts[-1] - counts[0] >= BACKLOG_GROWTH_MIN
    if not saturated_by(rate, qps, e.run.duration_s, backlog_grew=grew, limit_reached=None):
        return None
    return (
        f"offered {rate:g}/s, completed {qps:.1f}/s, and the backlog grew from {counts[0]} to "
        f"{counts[-1]} in flight",
        None,
    )


def service_time(e: Evidence, stage: str) -> float | None:
    """The stage's typical own time (its measured median, ms); None without one."""
    row = e.stages.get(stage)
    if row is None:
        return None
    return row.p50_ms if row.p50_ms is not None else row.mean_ms


def work_share(e: Evidence, stage: str) -> float | None:
    """The target's CPU per request over `stage`'s fastest time (its bare cost: under the GIL
    or a full machine its median stretches with waits for the CPU): ~1 or more when the stage
    is CPU work, far below 1 when it mostly waits (a sleep, I/O, a remote call). A stage that
    only sleeps leaves the CPU to the harness, whose cost per request must not be read as the
    stage's. None without the figures."""
    cpu, qps, fastest = e.target_cpu_pct(), throughput(e), e.fastest_ms(stage)
    if cpu is None or not qps or not fastest:
        return None
    return cpu / 100 * 1000 / qps / fastest


def queued_inside(e: Evidence, stage: str) -> tuple[str, float, float, bool] | None:
    """Whether requests wait for one another inside `stage`: (what was read, its value, the
    threshold, met). A lock hands itself over either fairly, and then every request waits for
    the others: the bulk of the stage's times sits together (P90 / P10 within 1.5x) several
    times above the fastest request, which found it free (the warmup's first, or a lone one);
    or unfairly, and then a share of requests goes straight through at the bare service time
    while the rest wait long (the P10 within 1.5x of the fastest). A stage whose time merely
    varies (a lognormal service time) shows neither: its P10 is well above its fastest, the
    distribution's far tail, and its bulk is spread as wide. None without a histogram."""
    fastest, row = e.fastest_ms(stage), e.stages.get(stage)
    p10, p90 = e.stage_percentile(stage, 10), e.stage_percentile(stage, 90)
    if fastest is None or row is None or p10 is None or p90 is None:
        return None
    above = p10 / max(fastest, 1e-6)
    if above >= FAIR_HANDOFF and p90 / max(p10, 1e-6) <= BULK_SPREAD:
        return ("P10 / fastest, the bulk together (P90 / P10 within 1.5x)", above,
                FAIR_HANDOFF, True)  # fmt: skip
    return ("P10 / fastest", above, STRAIGHT_THROUGH, above <= STRAIGHT_THROUGH)


FAIR_HANDOFF = 2.0
BULK_SPREAD = 1.5
STRAIGHT_THROUGH = 1.5


WORKER_SHARE = 0.6  # of the target's CPU, on one thread: a single worker does the work
WORKER_MIN_PCT = 25.0  # ... and at least this much of a core


def single_worker(e: Evidence, least: float = WORKER_SHARE) -> tuple[str, float, float] | None:
    """One thread of the target does most of its work while requests wait in flight and the
    target leaves cores idle: (thread, its CPU in % of a core, its share of the target's CPU).
    A pool of one (or a dispatcher thread) in front of the work; None otherwise. The thread
    may read below a full core on a shared machine, where others take its turns."""
    cpu, cores, hot = e.target_cpu_pct(), e.cores, hot_thread(e)
    if cpu is None or not cores or cores < 2 or hot is None or cpu <= 0:
        return None
    share = hot[1] / cpu
    if hot[1] < WORKER_MIN_PCT or share < least or cpu / 100 >= 0.85 * cores:
        return None
    if (in_flight(e) or 0) < 2:
        return None
    return hot[0], hot[1], share
