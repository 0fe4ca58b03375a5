"""`optlab diagnose` against the validity verdict and on the runs it must not call healthy
(docs/diagnose.md "Agreement with the verdict", "States"): each INVALID reason the verdict gives
(its own text, from `optlab.run.validity.verdict` on the run's facts) read back by the rules
from a run's evidence with the numbers that made it; a lognormal service time that is not a
lock, a pool of one that is, a sleeping stage that is neither GIL- nor CPU-bound, GC churn, and
a service whose CPU decides the CPU rules without stages."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from optlab.diagnose import Diagnosis, diagnose
from optlab.store.summary import GcEvidence
from tests.support.evidence import (
    CLIENTS_HELD_UP,
    GENERATOR_BEHIND,
    OPEN,
    SATURATED,
    SLOW,
    STUCK,
    UNSTABLE,
    Run,
    reasons,
)


def first(d: Diagnosis) -> str | None:
    return d.top.rule.id if d.top is not None else None


def test_a_saturated_open_loop_blames_the_target_never_the_generator() -> None:
    run = Run(
        load=OPEN,
        qps=300.0,
        reasons=SATURATED,
        send_lag_ms=40.0,
        cpu_pct=190.0,
        in_flight=(0, 50, 100, 150, 200),
        stage_ms=SLOW,
    )
    d = diagnose(run.evidence())
    assert d.top is not None and d.top.resource in ("queue", "cpu"), d.findings
    assert not any(f.rule.id == "load-generator" for f in d.findings)
    assert d.top.rule.id == "saturated" and "not the load generator" in d.top.summary
    # Read from the rate and the backlog alone (a run judged before the rule): the same.
    unjudged = diagnose(
        Run(
            load=OPEN,
            qps=300.0,
            send_lag_ms=40.0,
            cpu_pct=190.0,
            in_flight=(0, 50, 100, 150, 200),
            stage_ms=SLOW,
        ).evidence()
    )
    assert first(unjudged) in ("saturated", "cpu-bound"), unjudged.findings
    assert not any(f.rule.id == "load-generator" for f in unjudged.findings)


def test_a_generator_bound_run_is_the_generators_and_its_advice_fits_the_target() -> None:
    said, lag = GENERATOR_BEHIND, 60.0  # its send-lag P99
    d = diagnose(Run(load=OPEN, reasons=said, send_lag_ms=lag).evidence())
    assert first(d) == "load-generator", d.findings
    assert d.top is not None and "kind command or http" in d.top.advice  # in process
    served = diagnose(Run(kind="http", load=OPEN, reasons=said, send_lag_ms=lag).evidence())
    top = next(f for f in served.findings if f.rule.id == "load-generator")
    assert "kind command or http" not in top.advice and "processes" in top.advice
    # Valid by the verdict (the lag small beside what was measured): the rule agrees.
    calm = diagnose(Run(load=OPEN, send_lag_ms=3.0, stage_ms=SLOW).evidence())
    assert not any(f.rule.id == "load-generator" for f in calm.findings)


def test_burners_that_make_the_generator_late_are_the_neighbours() -> None:
    said = reasons(
        "load generator", send_lag_p99_ms=30.0, total_p99_ms=20.0, send_lag_p99_low_ms=30.0
    )
    d = diagnose(
        Run(load=OPEN, reasons=said, send_lag_ms=30.0, other_pct=190.0, stage_ms=SLOW).evidence()
    )
    assert first(d) == "noisy-neighbour", d.findings
    assert not any(f.rule.id == "load-generator" for f in d.findings)


def test_every_other_invalid_reason_is_read_the_same_way() -> None:
    failing = reasons("error rate", completed=1800, errors=200)
    d = diagnose(
        Run(
            reasons=failing, requests=1800, errors=200, errors_by_type={"ValueError": 200}
        ).evidence()
    )
    assert first(d) == "errors" and d.partial is None  # partial is gather's; see below

    d = diagnose(Run(reasons=STUCK).evidence())
    assert first(d) == "errors" and "stuck" in (d.top.summary if d.top else "")

    noisy = diagnose(Run(reasons=UNSTABLE, other_pct=150.0).evidence())
    assert first(noisy) == "noisy-neighbour"
    quiet = diagnose(Run(reasons=UNSTABLE).evidence())
    assert not quiet.healthy and quiet.state == "undecided" and "INVALID" in str(quiet.state_reason)

    for word, changes in (
        ("successful queries", {"completed": 300}),
        ("interrupted", {"interrupted": True, "measured_s": 2.0}),
        ("accuracy", {"accuracy_drop_pts": 3.0, "max_accuracy_drop_pts": 1.0}),
        ("thermal", {"throttled": True}),
    ):
        said = reasons(word, **changes)
        d = diagnose(Run(reasons=said).evidence())
        assert not d.healthy and d.state in ("undecided", "findings"), (word, d.state)


def test_a_starved_closed_loop_is_the_generators() -> None:
    d = diagnose(Run(reasons=CLIENTS_HELD_UP, in_flight=(4,) * 5, start_lag_ms=3.0).evidence())
    assert first(d) == "load-generator", d.findings


def test_a_lognormal_service_time_is_not_a_lock_and_a_lock_is() -> None:
    rng = np.random.default_rng(5)
    # The synthetic example: 4 clients, each call sleeps a lognormal time (median 2 ms,
    # sigma 0.3) in parallel: throughput x fastest lands near 1 by coincidence.
    service = 2.0 * rng.lognormal(0.0, 0.3, 9000)
    qps = 4 / float(service.mean()) * 1000
    calm = diagnose(Run(stage_ms=service, qps=qps, in_flight=(4,) * 5, cpu_pct=35.0).evidence())
    assert not any(f.rule.id in ("serialised", "gil-bound") for f in calm.findings), calm.findings
    assert calm.healthy
    # A 4 ms lock under 8 clients, handed over unfairly: a quarter go straight through.
    held = np.concatenate([np.full(600, 4.1), 4.1 * rng.integers(2, 16, 1800)])
    locked = diagnose(Run(stage_ms=held, qps=231.0, cpu_pct=7.0).evidence())
    assert first(locked) == "serialised" and locked.top is not None
    assert (locked.top.stage, locked.top.resource) == ("infer", "lock")
    # Handed over fairly: every request waits for the seven others (~33 ms, close together);
    # only the warmup's first found it free (4.1 ms).
    fair = 4.1 * 8 + rng.normal(0, 0.4, 700)
    queued = diagnose(Run(stage_ms=fair, qps=241.0, cpu_pct=5.0, fastest_ms=4.1).evidence())
    assert first(queued) == "serialised", queued.findings


def test_a_pool_of_one_is_serialised_not_cpu_or_gil_bound() -> None:
    rng = np.random.default_rng(6)
    waits = 3.5 * (8 + rng.normal(0, 0.5, 1500)).clip(2)  # FIFO: each waits for the others
    # The warmup's first request found the worker free: one computation, 3.5 ms.
    d = diagnose(
        Run(
            stage_ms=waits,
            qps=280.0,
            cpu_pct=104.0,
            fastest_ms=3.5,
            threads=(("pool-of-one_0", 98.0), ("optlab-load-1", 1.0)),
        ).evidence()
    )
    assert first(d) == "serialised", d.findings
    assert d.top is not None and "pool-of-one_0" in d.top.summary
    assert not any(f.rule.id in ("cpu-bound", "gil-bound") for f in d.findings)


def test_a_sleeping_stage_is_not_gil_or_cpu_bound() -> None:
    rng = np.random.default_rng(7)
    sleeps = 1.0 + rng.exponential(0.08, 20000)  # time.sleep(1 ms) under 8 clients
    # The harness's threads used ~0.9 of a core at 7,000 calls a second.
    d = diagnose(
        Run(
            stage_ms=sleeps,
            qps=7000.0,
            cpu_pct=90.0,
            threads=tuple((f"optlab-load-{i}", 11.0) for i in range(8)),
        ).evidence()
    )
    assert not any(f.rule.id in ("gil-bound", "cpu-bound") for f in d.findings), d.findings


def test_gc_churn_is_named_not_the_generator() -> None:
    gc = GcEvidence(collections=450, pause_total_ms=950.0, pause_max_ms=324.0, share_pct=19.0)
    d = diagnose(
        Run(
            load={**OPEN, "rate": 100.0},
            qps=100.0,
            send_lag_ms=300.0,
            gc=gc,
            in_flight=(1, 0, 2, 1, 0),
        ).evidence()
    )
    assert first(d) == "gc-churn", d.findings
    assert d.top is not None and (d.top.stage, d.top.resource) == (None, "memory")
    assert not any(f.rule.id in ("load-generator", "tail-stalls") for f in d.findings)


def test_a_service_busy_on_its_cpu_is_judged_without_stages() -> None:
    def bare(run: Run) -> Diagnosis:
        evidence = run.evidence()
        total = evidence.stages["total"]
        return diagnose(replace(evidence, stages={"total": total},
                                fastest={"total": evidence.fastest["total"]}))  # fmt: skip

    # 1.5 cores of 2 to the service, the rest to the load generator: the machine is full.
    full = bare(Run(kind="command", cpu_pct=150.0, in_flight=(8,) * 5, machine_pct=97.0))
    missing = dict(full.not_evaluated)
    assert "cpu-bound" not in missing and "gil-bound" not in missing, missing
    assert first(full) == "cpu-bound" and full.top is not None and full.top.stage is None
    # One core of two, the other idle, 8 requests waiting: one thread's worth (no profile).
    single = bare(Run(kind="command", cpu_pct=100.0, in_flight=(8,) * 5, machine_pct=55.0))
    assert first(single) == "gil-bound" and single.top is not None
    assert "--profile" in single.top.summary
    # The same core on a full machine (the generator on the other): all it could get.
    shared = bare(Run(kind="command", cpu_pct=100.0, in_flight=(8,) * 5, machine_pct=97.0))
    assert first(shared) == "cpu-bound", shared.findings


def test_no_data_and_unevaluated_core_rules_are_never_healthy() -> None:
    empty = Run(status="FAILED", requests=0, errors=0, qps=None)
    evidence = empty.evidence()
    d = diagnose(replace(evidence, no_data="the run FAILED before any request finished"))
    assert d.state == "no-data" and not d.healthy and not d.findings
    assert d.to_json()["state"] == "no-data" and d.to_json()["healthy"] is False
    # An open loop with no send-lag series recorded (an old run): the generator rule cannot
    # run: undecided. A closed loop is judged by its verdict's codes, series or not.
    for load, state in ((OPEN, "undecided"), ({"mode": "closed", "concurrency": 8}, "healthy")):
        old = Run(load=load).evidence()
        summary = old.run.summary
        assert summary is not None
        bare = summary.model_copy(update={"harness_ms": {}})
        d = diagnose(replace(old, run=replace(old.run, summary=bare)))
        assert not d.findings and d.state == state, (load, d.state, d.undecided)
        assert ("load-generator" in d.undecided) is (state == "undecided")


def test_every_form_says_the_state_not_healthy() -> None:
    from optlab.reports.diagnose import (
        render_diagnosis,
        render_diagnosis_html,
        render_diagnosis_markdown,
        run_line,
    )

    failed = Run(status="FAILED", requests=0, errors=0, qps=None)
    nothing = diagnose(replace(failed.evidence(), no_data="the run FAILED before any request"))
    undecided = diagnose(Run(reasons=UNSTABLE).evidence())
    for d, word in ((nothing, "no data"), (undecided, "undecided")):
        assert word in render_diagnosis(d) and "healthy: no rule fired" not in render_diagnosis(d)
        assert word in render_diagnosis_markdown(d).lower() and "**Healthy**" not in (
            render_diagnosis_markdown(d)
        )
        assert d.state in render_diagnosis_html([("case", d)])
        assert d.state in run_line(d) and "healthy, no rule fired" not in run_line(d)
