"""The stacked-gains table: one row per step of a chain, baseline first, as a typed
`reports.stacked.StackedTable`.

Computed here, rendered elsewhere (`reports.terminal`, `reports.markdown`, `reports.export`,
`reports.html`). Which runs stand for each step is `reports.chain`'s job; this module turns them
into figures, each step's change against the previous measured step and against the baseline,
with its confidence interval and significance (`metrics.stats`), SLO checks and a verdict.
The columns are listed in `COLUMNS` (`reports.stacked`); renderers rely on them.

One statistic per question: `judge` compares two steps (their newest shared `--paired` session
pair by pair, else every valid run of each), and its estimate, interval and level are what the
row holds; a step whose parent is the baseline has its step change as its cumulative change.
`optlab audit` and `optlab check` read these columns and judge them with the same
`metrics.stats.beyond_noise`, so none of them can disagree with the table.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from optlab.config.protocol import protocol_label
from optlab.metrics import stats
from optlab.metrics.change import percent_change
from optlab.metrics.stats import REPEATED_CONFIDENCE, Comparison
from optlab.metrics.stats import VERDICT_CONFIDENCE as CONFIDENCE
from optlab.reports.capacity import add_capacity
from optlab.reports.chain import ChainStep, chain_steps
from optlab.reports.stacked import (
    COLUMNS,
    TABLE_SCHEMA_VERSION,
    StackedTable,
    TableHeader,
    TableRow,
    stage_of,
)
from optlab.reports.table_json import EnvironmentInfo
from optlab.targets.registry import find_kind
from optlab.targets.service_env import describe_service

if TYPE_CHECKING:
    from optlab.config.slo import Slo
    from optlab.store import EnvironmentRecord, LlmSummary, RunRecord, RunSummary, Store
    from optlab.targets.kind import TargetKind

# Headline metrics: (column, window field, higher is better, label).
HEADLINE = (
    ("qps", "qps", True, "QPS"),
    ("p50_ms", "p50_ms", False, "P50"),
    ("p99_ms", "p99_ms", False, "P99"),
)
# A streaming step's token figures, judged the same way from the runs' windows but never
# deciding the verdict (the headline metrics do, for every kind of target alike).
LLM_HEADLINE = (
    ("ttft_p50_ms", "ttft_p50_ms", False, "TTFT P50"),
    ("ttft_p99_ms", "ttft_p99_ms", False, "TTFT P99"),
    ("tpot_p50_ms", "tpot_p50_ms", False, "TPOT P50"),
    ("tpot_p99_ms", "tpot_p99_ms", False, "TPOT P99"),
    ("output_tps", "output_tps", True, "tok/s"),
)
_LLM_FIELDS = frozenset(field for _, field, _, _ in LLM_HEADLINE)
_LLM_COLUMNS = frozenset(column for column, _, _, _ in LLM_HEADLINE)
SLO_FIELDS = {"p50_ms": "p50_ms", "p95_ms": "p95_ms", "p99_ms": "p99_ms", "p999_ms": "p999_ms"}


def _figures(step: ChainStep) -> dict[str, Any]:
    """A step's row before any comparison: what it is, and its run's figures and SLO check."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row |= {
        "experiment": step.experiment,
        "variable": step.variable,
        "change": step.change,
        "hypothesis": step.hypothesis,
        "runs": len(step.runs),
        "missing": step.missing,
        "flags": [],
        "decided_by": [],
        "slo_failures": [],
        "reasons": [],
        "verdict": "missing" if step.run is None else None,
    }
    run = step.run
    if run is None or run.summary is None:
        return row
    row |= _run_figures(run, run.summary)
    row["slo_pass"], row["slo_failures"] = _slo_check(step.slo, row, run.qps)
    return row


def _run_figures(run: RunRecord, s: RunSummary) -> dict[str, Any]:
    """The run's columns: its facts, latency, resource use, stage P50s and target figures."""
    total = s.total
    requests, errors = run.requests or 0, run.errors or 0
    resources = s.resources
    gpu_mem = resources.max_of("gpu_mem_used_bytes")
    figures: dict[str, Any] = {
        "run_id": run.id,
        "status": run.status,
        "valid": run.valid,
        "provisional": run.provisional,
        "p50_ms": total.p50,
        "p95_ms": total.p95,
        "p99_ms": total.p99,
        "p999_ms": total.p999,
        "qps": run.qps,
        "error_rate": errors / (requests + errors) if requests + errors else None,
        "cpu_pct": resources.mean_of("cpu_process_pct"),
        # A service optlab started: its own process tree, where the work of the step is done.
        "service_cpu_pct": resources.mean_of("service_cpu_pct"),
        "gpu_util_pct": resources.mean_of("gpu_util_pct"),
        "gpu_mem_peak_mib": gpu_mem / 2**20 if gpu_mem is not None else None,
        "reasons": list(run.reasons),
        "git_commit": run.git_commit,
        "started_at": run.started_at.isoformat(),
        "who": s.who or run.hostname,
    }
    for stage, stage_stats in s.stages.items():
        figures[f"{stage}_p50_ms"] = stage_stats.p50
    figures["accuracy_top1"] = s.accuracy_top1
    figures["infer_ms_per_request"] = s.target_figure("infer", "ms_per_request")
    figures["mean_batch_size"] = s.target_figure("batching", "mean_batch_size")
    figures["cache_hit_rate"] = s.target_figure("cache", "hit_rate")
    if s.llm is not None:
        figures |= _llm_figures(s.llm)
    return figures


def _llm_figures(llm: LlmSummary) -> dict[str, float | None]:
    """A streaming run's table figures (`LLM_COLUMNS` and goodput's interval)."""
    low, high = llm.goodput_interval or (None, None)
    return {
        "ttft_p50_ms": llm.ttft_ms.p50 if llm.ttft_ms else None,
        "ttft_p99_ms": llm.ttft_ms.p99 if llm.ttft_ms else None,
        "tpot_p50_ms": llm.tpot_ms.p50 if llm.tpot_ms else None,
        "tpot_p99_ms": llm.tpot_ms.p99 if llm.tpot_ms else None,
        "itl_p99_ms": llm.itl_ms.p99 if llm.itl_ms else None,
        "output_tps": llm.output_tokens_per_s,
        "goodput": llm.goodput,
        "goodput_low": low,
        "goodput_high": high,
    }


def _slo_check(
    slo: dict[str, Any], row: dict[str, Any], qps: float | None
) -> tuple[bool | None, list[str]]:
    """(whether the run met the step's latency and QPS SLOs, or None when it sets none; the
    ones it failed)."""
    failures = []
    for key, limit in slo.items():
        column = SLO_FIELDS.get(key)
        value = row.get(column) if column else None
        if column and value is not None and value > limit:
            failures.append(f"{key.removesuffix('_ms').upper()} {value:.2f} ms > {limit:g} ms")
        if key == "min_qps" and qps is not None and qps < limit:
            failures.append(f"QPS {qps:.1f} < {limit:g}")
    latency_slo = [k for k in slo if k in SLO_FIELDS or k == "min_qps"]
    return (not failures) if latency_slo else None, failures


class _Windows:
    """Per-second window series of runs, fetched in one query for all the table's runs."""

    FIELDS = tuple(field for _, field, _, _ in (*HEADLINE, *LLM_HEADLINE))

    def __init__(self, store: Store, runs: Sequence[RunRecord]) -> None:
        self.store = store
        self.cache = store.window_series([r.id for r in runs], self.FIELDS)

    def series(self, run: RunRecord) -> dict[str, list[float]]:
        if run.id not in self.cache:
            self.cache |= self.store.window_series([run.id], self.FIELDS)
        return self.cache[run.id]


def _estimate(run: RunRecord, column: str) -> float | None:
    if column == "qps":
        return run.qps
    s = run.summary
    if s is None:
        return None
    value = {"p50_ms": s.total.p50, "p99_ms": s.total.p99}.get(column)
    if value is None and s.llm is not None:
        value = _llm_figures(s.llm).get(column)
    return None if value is None else float(value)


def _paired_runs(parent: ChainStep, step: ChainStep) -> tuple[list[RunRecord], list[RunRecord]]:
    """The newest paired session shared by both steps, as index-matched run lists."""
    sessions: dict[str, dict[str, dict[int, RunRecord]]] = {}
    for role, holder in (("parent", parent), ("step", step)):
        for run in holder.runs:
            tag = run.summary.paired if run.summary is not None else None
            if tag is not None and tag.role == role and tag.session:
                sessions.setdefault(tag.session, {}).setdefault(role, {})[tag.index] = run
    for session in sorted(
        sessions,
        key=lambda k: max(r.id for d in sessions[k].values() for r in d.values()),
        reverse=True,
    ):
        parts = sessions[session]
        common = sorted(set(parts.get("parent", {})) & set(parts.get("step", {})))
        if len(common) >= 2:
            return [parts["parent"][i] for i in common], [parts["step"][i] for i in common]
    return [], []


Headline = tuple[tuple[str, str, bool, str], ...]


def _comparisons(
    before: list[RunRecord],
    after: list[RunRecord],
    windows: _Windows,
    paired: bool,
    metrics: Headline = HEADLINE,
) -> list[tuple[str, Comparison]]:
    """(column, comparison) of each of `metrics` both sides have an estimate of, and windows
    to judge it by."""
    found = []
    for column, field, higher, label in metrics:
        parent_estimates = [_estimate(r, column) for r in before]
        child_estimates = [_estimate(r, column) for r in after]
        if any(v is None for v in (*parent_estimates, *child_estimates)):
            continue
        if field in _LLM_FIELDS and not all(windows.series(r)[field] for r in (*before, *after)):
            continue  # runs measured before their windows held this figure
        result = stats.compare(
            label,
            [windows.series(r)[field] for r in before],
            [windows.series(r)[field] for r in after],
            parent_estimates=[float(v) for v in parent_estimates if v is not None],
            child_estimates=[float(v) for v in child_estimates if v is not None],
            higher_is_better=higher,
            confidence=CONFIDENCE,
            repeated_confidence=REPEATED_CONFIDENCE,
            paired=paired,
        )
        found.append((column, result))
    return found


def judge(
    parent: ChainStep, step: ChainStep, windows: _Windows, metrics: Headline = HEADLINE
) -> list[tuple[str, Comparison]]:
    """The one statistic of `step` against `parent` (its parent step, or the baseline):
    the runs of their newest shared paired session, compared pair by pair, else every valid
    run of each (`metrics.stats.compare`), on each of `metrics`. Empty when a side has no
    valid run."""
    before, after = _paired_runs(parent, step)
    paired = bool(before)
    if not paired:
        before = [r for r in parent.runs if r.valid]
        after = [r for r in step.runs if r.valid]
    if not before or not after:
        return []
    return _comparisons(before, after, windows, paired, metrics)


def _decides(comparison: Comparison) -> bool:
    """Beyond noise for the verdict (`metrics.stats.beyond_noise`: the whole interval on one
    side of zero, the 1% floor met) and better or worse."""
    verdict = stats.beyond_noise(comparison.delta_pct, comparison.low_pct, comparison.high_pct)
    return bool(comparison.significant and comparison.better is not None and verdict)


def step_verdict(comparisons: Sequence[Comparison]) -> tuple[str, list[str], list[str]]:
    """(verdict, the metrics that decided it, flags): "regressed" by the metrics worse beyond
    noise, else "gain" by those better beyond noise, else "within noise", decided by none.
    A metric whose interval spans zero never decides a verdict, whatever else it says."""
    judged = [c if _decides(c) else replace(c, significant=False, better=None) for c in comparisons]
    verdict, flags = stats.step_verdict(judged)
    wanted = {"regressed": False, "gain": True}.get(verdict)
    decided = [
        stats.metric_label(c.metric)
        for c in judged
        if wanted is not None and c.significant and c.better is wanted
    ]
    return verdict, decided, list(flags)


def _write(row: dict[str, Any], kind: str, comparisons: list[tuple[str, Comparison]]) -> None:
    """A judged change into the row: each metric's change and interval, and their level."""
    for column, result in comparisons:
        name = column.removesuffix("_ms")
        row[f"{name}_{kind}_pct"] = result.delta_pct
        row[f"{name}_{kind}_low_pct"] = result.low_pct
        row[f"{name}_{kind}_high_pct"] = result.high_pct
    if comparisons:
        row[f"{kind}_confidence"] = comparisons[0][1].confidence


def _compare(comparisons: list[tuple[str, Comparison]], row: dict[str, Any]) -> None:
    """The step's change against its parent and the verdict it gives."""
    _write(row, "step", comparisons)
    if comparisons:
        verdict, decided, flags = step_verdict([c for _, c in comparisons])
        row["verdict"] = verdict
        row["decided_by"] = decided
        row["flags"] = flags
        row["significant"] = any(_decides(c) for _, c in comparisons)
        row["step_method"] = comparisons[0][1].method


def _environment_summary(env: EnvironmentRecord | None) -> dict[str, Any]:
    if env is None:
        return {"summary": "unknown", "material_hash": None, "fingerprint": {}}
    fp = env.fingerprint
    hw, sw = fp.get("hardware", {}), fp.get("software", {})
    cpu = hw.get("cpu", {})
    gpus = hw.get("gpus") or []
    packages = sw.get("packages", {})
    memory = (hw.get("memory") or {}).get("total_bytes")
    parts = [
        f"{cpu.get('model', '?')} x{cpu.get('logical_cores', '?')}",
        f"{memory / 2**30:.0f} GiB" if memory else None,
        ", ".join(str(g.get("name", "GPU")) for g in gpus) if gpus else "no GPU",
        f"Python {str((sw.get('python') or {}).get('version', '?')).split()[0]}"
        if isinstance(sw.get("python"), dict)
        else None,
        *(f"{k} {v}" for k in ("torch", "onnxruntime", "tensorrt") if (v := packages.get(k))),
        _node_set(fp.get("hosts")),
    ]
    return {
        "summary": "; ".join(p for p in parts if p),
        "material_hash": env.material_hash,
        "fingerprint": fp,
    }


def _node_set(hosts: Any) -> str | None:
    """The nodes the load was sent from (`workload.load.hosts`): how many, which hosts."""
    if not isinstance(hosts, dict) or not hosts.get("nodes"):
        return None
    names = Counter(str(n.get("host", "?")) for n in hosts["nodes"])
    listed = ", ".join(f"{h} x{c}" if c > 1 else h for h, c in sorted(names.items()))
    return (
        f"load from {len(hosts['nodes'])} Ray nodes ({listed}; "
        f"{hosts.get('workers_per_node', '?')} workers each)"
    )


def _baseline_kind(store: Store, baseline: str) -> TargetKind | None:
    """The kind of the baseline's target (the registry's), None for a kind this optlab does
    not know: what the table says of the service and the order of the stages are the kind's."""
    record = store.get_experiment(baseline)
    config = record.current_config.config if record and record.current_config else {}
    return find_kind(config.get("target") or {})


def _service_note(kind: TargetKind | None, fingerprint: dict[str, Any]) -> str | None:
    """Whether the service's own environment was checked (command) or could not be (http)."""
    service = fingerprint.get("service")
    if service:
        return describe_service(service, None)
    return kind.service_note if kind is not None else None


def _headline_changes(rows: list[dict[str, Any]]) -> None:
    """Each headline metric's step and cumulative change in each row: the judged change (the
    statistic's own estimate, over every pair or repeat) where the step was judged, else the
    change of the runs' figures against the previous measured step and the baseline."""
    streaming = any(row.get("ttft_p50_ms") is not None for row in rows)
    for column, _, _, _ in (*HEADLINE, *(LLM_HEADLINE if streaming else ())):
        name = column.removesuffix("_ms")
        base = last = None
        for row in rows:
            value = row[column]
            measured = value is not None and not (isinstance(value, float) and math.isnan(value))
            judged_step = row.get(f"{name}_step_pct")
            judged_cum = row.get(f"{name}_cumulative_pct")
            figure_step = percent_change(last, value) if measured else None
            row[f"{name}_step_pct"] = judged_step if judged_step is not None else figure_step
            if measured and base is None:
                base = value
            figure_cum = percent_change(base, value) if measured else None
            row[f"{name}_cumulative_pct"] = judged_cum if judged_cum is not None else figure_cum
            if measured:
                last = value


def _mark_knob_sweeps(store: Store, steps: Sequence[ChainStep], rows: list[dict[str, Any]]) -> None:
    """A step promoted from an `optlab sweep-knob` names that sweep: the table links the value
    to the evidence it came from (its runs are the sweep's blocks)."""
    promoted = {
        str(k.result.get("promoted_experiment")): k.id
        for k in store.list_knob_sweeps()
        if k.result is not None and k.result.get("promoted_experiment")
    }
    if not promoted:
        return
    for step, row in zip(steps, rows, strict=True):
        row["knob_sweep"] = promoted.get(step.experiment)


def stacked_table(store: Store, head: str, slo: Slo | None = None) -> StackedTable:
    """One row per step: figures, step and cumulative change in %, significance, verdict;
    and, where the chain was swept, capacity under `slo` (default: the SLO of the head's
    newest finished sweep) in each row's `capacity` (`reports.capacity`)."""
    steps, reference, reference_env = chain_steps(store, head)
    windows = _Windows(store, [r for step in steps for r in step.runs if r.valid])
    rows = [_figures(step) for step in steps]
    first = previous = None
    for index, row in enumerate(rows):
        if row["run_id"] is None:
            continue
        if previous is None or first is None:
            row["verdict"] = "baseline" if index == 0 else "missing parent"
            first = index
        else:
            # A streaming step's token figures are judged with the headline metrics, in one
            # pass over the same runs; only the headline ones decide the verdict.
            streaming = row.get("ttft_p50_ms") is not None or row.get("output_tps") is not None
            metrics = (*HEADLINE, *LLM_HEADLINE) if streaming else HEADLINE
            step_change = judge(steps[previous], steps[index], windows, metrics)
            headline = [c for c in step_change if c[0] not in _LLM_COLUMNS]
            _compare(headline, row)
            _write(row, "step", [c for c in step_change if c[0] in _LLM_COLUMNS])
            if row["verdict"] is None:
                row["verdict"] = "not judged"  # a side has no valid run
            # Against the baseline: the same question when the parent is the baseline, so
            # the same answer (`optlab audit` shares out a total only when it is beyond noise).
            same = first == previous
            _write(
                row,
                "cumulative",
                step_change if same else judge(steps[first], steps[index], windows, metrics),
            )
        previous = index
    _headline_changes(rows)
    kind = _baseline_kind(store, steps[0].experiment)
    order = kind.stage_order if kind is not None else ()
    stages = sorted(
        {stage for row in rows for column in row if (stage := stage_of(column)) is not None},
        # The kind's stages in its request order, then the others by column name.
        key=lambda stage: (order.index(stage) if stage in order else len(order), f"{stage}_p50_ms"),
    )
    environment = _environment_summary(reference_env)
    if service := _service_note(kind, environment["fingerprint"]):
        environment["service"] = service
    header = TableHeader(
        schema_version=TABLE_SCHEMA_VERSION,
        head=head,
        protocol=reference.protocol if reference else None,
        protocol_label=protocol_label(reference.protocol if reference else None),
        environment=EnvironmentInfo(**environment),
        confidence=CONFIDENCE,
        stages=tuple(stages),
    )
    _mark_knob_sweeps(store, steps, rows)
    table = StackedTable(header=header, rows=tuple(TableRow.from_cells(row) for row in rows))
    return add_capacity(table, store, slo, CONFIDENCE)


__all__: Sequence[str] = ("COLUMNS", "TABLE_SCHEMA_VERSION", "stacked_table")
