"""Turning what a run collected into stored rows and the parts of its summary (the latency and
resource sections of `RunSummary`, docs/run-json.md), as plain JSON values: the summary passes
through `json_safe` before it becomes a `RunSummary`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from optlab.metrics.llm import (
    CLIENT_WAIT,
    E2E,
    ITL_EVENT_GAP,
    ITL_REQUEST_MEAN,
    ITL_TOKEN_SPLIT,
    TPOT,
    TPOT_TOKEN_WEIGHTED,
    TTFT,
    TTFT_SENT,
    LlmTally,
)
from optlab.metrics.stages import TOTAL
from optlab.store import (
    GpuSample,
    LatencyStats,
    ResourceSample,
    RunErrorCount,
    StageStatsRow,
    WindowStats,
)

if TYPE_CHECKING:
    from optlab.metrics.backlog import LoadTimeline
    from optlab.metrics.histogram import LatencyHistogram
    from optlab.metrics.log import Window
    from optlab.metrics.resources import ResourceReading

# The statistics a summary keeps of each series: LatencyStats's, in its order.
_LATENCY_STATS = tuple(name for name in LatencyStats.model_fields if name != "count")
PHASES = ("warmup", "measure")


def stage_rows(phase: str, histograms: dict[str, LatencyHistogram]) -> list[StageStatsRow]:
    rows = []
    for stage, histogram in sorted(histograms.items()):
        s = histogram.summary_ms()
        rows.append(
            StageStatsRow(
                stage=stage,
                phase=phase,
                count=histogram.count,
                histogram=histogram.encode(),
                min_ms=_f(s["min"]),
                mean_ms=_f(s["mean"]),
                stddev_ms=_f(s["stddev"]),
                p50_ms=_f(s["p50"]),
                p90_ms=_f(s["p90"]),
                p95_ms=_f(s["p95"]),
                p99_ms=_f(s["p99"]),
                p999_ms=_f(s["p999"]),
                max_ms=_f(s["max"]),
            )
        )
    return rows


def _f(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def window_rows(windows: Sequence[Window], load: LoadTimeline | None = None) -> list[WindowStats]:
    """Stored windows; with `load`, each with what was offered and in flight."""
    rows = []
    for w in windows:
        if w.phase not in PHASES:
            continue
        offered, in_flight = load.window(w.phase, w.t_s, w.span_s) if load else (None, None)
        rows.append(
            WindowStats(
                phase=w.phase,
                t_s=w.t_s,
                completed=w.completed,
                errors=w.errors,
                qps=w.qps,
                p50_ms=w.p50_ms,
                p99_ms=w.p99_ms,
                send_lag_p99_ms=w.send_lag_p99_ms,
                offered=offered,
                in_flight=in_flight,
                ttft_p50_ms=w.ttft_p50_ms,
                ttft_p99_ms=w.ttft_p99_ms,
                tpot_p50_ms=w.tpot_p50_ms,
                tpot_p99_ms=w.tpot_p99_ms,
                output_tps=w.output_tps,
            )
        )
    return rows


def resource_rows(readings: Sequence[ResourceReading]) -> list[ResourceSample]:
    rows = []
    for r in readings:
        if r.phase not in PHASES:
            continue
        gpus = None
        if r.gpus is not None:
            gpus = tuple(
                GpuSample(
                    index=g.index,
                    util_pct=g.util_pct,
                    mem_used_bytes=g.mem_used_bytes,
                    mem_total_bytes=g.mem_total_bytes,
                    temperature_c=g.temperature_c,
                    power_w=g.power_w,
                    sm_clock_mhz=g.sm_clock_mhz,
                    throttle_reasons=(
                        tuple(g.throttle_reasons) if g.throttle_reasons is not None else None
                    ),
                )
                for g in r.gpus
            )
        rows.append(
            ResourceSample(
                phase=r.phase,
                t_s=r.t_s,
                cpu_process_pct=r.cpu_process_pct,
                cpu_system_pct=r.cpu_system_pct,
                cpu_per_core=tuple(r.cpu_per_core) if r.cpu_per_core is not None else None,
                rss_bytes=r.rss_bytes,
                mem_used_bytes=r.mem_used_bytes,
                mem_total_bytes=r.mem_total_bytes,
                iowait_pct=r.iowait_pct,
                service_cpu_pct=r.service_cpu_pct,
                service_rss_bytes=r.service_rss_bytes,
                steal_pct=r.steal_pct,
                other_cpu_pct=r.other_cpu_pct,
                gpus=gpus,
            )
        )
    return rows


def error_rows(errors: dict[str, tuple[int, str | None]]) -> list[RunErrorCount]:
    return [
        RunErrorCount(kind, count, example) for kind, (count, example) in sorted(errors.items())
    ]


def latency_summary(histograms: dict[str, LatencyHistogram]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for stage, histogram in sorted(histograms.items(), key=lambda kv: (kv[0] != TOTAL, kv[0])):
        s = histogram.summary_ms()
        out[stage] = {key: s[key] for key in _LATENCY_STATS} | {"count": histogram.count}
    return out


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "max": max(values)}


def resource_summary(readings: Sequence[ResourceReading], peak_rss: int | None) -> dict[str, Any]:
    measured = [r for r in readings if r.phase == "measure"]

    def pick(attr: str) -> list[float]:
        return [float(v) for r in measured if (v := getattr(r, attr)) is not None]

    gpu_util = [g.util_pct for r in measured for g in (r.gpus or []) if g.util_pct is not None]
    gpu_mem = [
        float(g.mem_used_bytes)
        for r in measured
        for g in (r.gpus or [])
        if g.mem_used_bytes is not None
    ]
    return {
        "samples": len(measured),
        "cpu_process_pct": _stats(pick("cpu_process_pct")),
        "cpu_system_pct": _stats(pick("cpu_system_pct")),
        "iowait_pct": _stats(pick("iowait_pct")),
        "rss_bytes": _stats(pick("rss_bytes")),
        "rss_peak_bytes": peak_rss,
        "mem_used_bytes": _stats(pick("mem_used_bytes")),
        # Absent without a GPU: recorded as absent, never as zero.
        "gpu_util_pct": _stats([float(v) for v in gpu_util]),
        "gpu_mem_used_bytes": _stats(gpu_mem),
        # A service optlab started (absent otherwise): its process tree, apart from optlab's.
        "service_cpu_pct": _stats(pick("service_cpu_pct")),
        "service_rss_bytes": _stats(pick("service_rss_bytes")),
    }


MAX_JSON_DEPTH = 32


def json_safe(
    value: Any, where: str, notes: list[str], depth: int = 0, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """`value` as strict JSON can hold it, with a note for anything changed.

    What a target's hooks return reaches the store and `run --json`: a numpy scalar or
    array (what `np.sum` returns), a NaN or an infinity (which strict JSON parsers reject),
    or an arbitrary object would otherwise fail the final write and lose the run.
    NaN/inf become null; numpy values become Python numbers and lists; anything else
    becomes its repr.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        notes.append(f"{where} was {value!r}, stored as null")
        return None
    if depth >= max_depth:
        notes.append(f"{where} is nested deeper than {max_depth} levels, stored as text")
        return _short_repr(value)
    if isinstance(value, dict):
        return {
            str(k): json_safe(v, f"{where}.{k}", notes, depth + 1, max_depth)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [
            json_safe(v, f"{where}[{i}]", notes, depth + 1, max_depth) for i, v in enumerate(value)
        ]
    item = getattr(value, "tolist", None) or getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        try:
            plain = item()
        except Exception:  # a numpy object that cannot convert: fall back to its repr
            plain = None
        else:
            # numpy's own float spells NaN the same way: one more pass turns it into null.
            return json_safe(plain, where, notes, depth + 1, max_depth)
    notes.append(f"{where} is a {type(value).__name__}, not a JSON value: stored as its repr")
    return _short_repr(value)


def _short_repr(value: Any, limit: int = 200) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def llm_summary(
    series: dict[str, LatencyHistogram],
    tally: LlmTally,
    measured_s: float,
    goodput_ms: tuple[float | None, float | None],
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streaming run's `llm` section (docs/run-json.md "llm"): each series by its
    definition, the token counts and rates, goodput under the config's per-request bounds,
    the lines relating TTFT to the prompt and ITL to the batch, and the engine's own view
    (`server`, from `metrics.server_metrics`, where its metrics were read)."""
    stats = latency_summary(series)

    def of(name: str) -> dict[str, Any] | None:
        return stats.get(name)

    seconds = measured_s if measured_s > 0 else None
    ttft_bound, tpot_bound = goodput_ms
    counted = max(tally.sources.items(), key=lambda kv: kv[1])[0] if tally.sources else None
    return {
        "ttft_ms": of(TTFT),
        "itl_ms": of(ITL_EVENT_GAP),
        "tpot_ms": of(TPOT),
        "e2e_ms": of(E2E),
        "output_tokens": tally.output_tokens,
        "output_tokens_per_s": tally.output_tokens / seconds if seconds else None,
        "tokens_per_event": (
            tally.output_tokens / tally.token_events if tally.token_events else None
        ),
        "goodput": tally.goodput(ttft_bound, tpot_bound),
        "goodput_interval": tally.goodput_interval(ttft_bound, tpot_bound),
        "goodput_slo": (
            {"ttft_ms": ttft_bound, "tpot_ms": tpot_bound}
            if ttft_bound is not None or tpot_bound is not None
            else None
        ),
        "ttft_sent_ms": of(TTFT_SENT),
        "client_wait_ms": of(CLIENT_WAIT),
        "itl_token_split_ms": of(ITL_TOKEN_SPLIT),
        "itl_request_mean_ms": of(ITL_REQUEST_MEAN),
        "tpot_token_weighted_ms": of(TPOT_TOKEN_WEIGHTED),
        "requests": tally.requests,
        "requests_per_s": tally.requests / seconds if seconds else None,
        "input_tokens": tally.input_tokens,
        "total_tokens_per_s": (
            (tally.input_tokens + tally.output_tokens) / seconds if seconds else None
        ),
        "token_counts": counted,
        "totals_from_usage": tally.totals_from_usage,
        "streams_without_done": tally.without_done,
        "ttft_by_input": tally.ttft_by_input(),
        "itl_by_running": tally.itl_by_running(),
        "server": server,
    }
