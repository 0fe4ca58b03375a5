"""A serving engine's own view of a run, read from its Prometheus text (`target.prometheus_url`,
docs/experiment-files.md): requests running and waiting, KV-cache usage, preemptions and
prefix-cache hits, sampled once a second over the measured phase and summarised into the
run's `llm.server` (docs/run-json.md).

Engines name these differently; a metric is known by the last part of its name (after any
`vllm:`, `sglang:`, `optlab:` namespace), summed over its label sets (several models or
engines behind one endpoint add up). Gauges are summarised by their mean and maximum over the
samples, counters by their increase from the first sample to the last (a counter that went
down, a restarted server, counts from zero again).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["GAUGES", "COUNTERS", "ServerSample", "parse_prometheus", "server_figures", "summarize"]

# figure -> the metric names engines give it (vLLM, SGLang, TGI, the reference LLM).
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("num_requests_running", "num_running_reqs", "tgi_batch_current_size"),
    "waiting": ("num_requests_waiting", "num_queue_reqs", "tgi_queue_size"),
    "kv_cache_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc", "token_usage"),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "preemptions": ("num_preemptions_total", "num_preemptions"),
    "prefix_cache_hits": ("prefix_cache_hits_total", "prefix_cache_hits"),
    "prefix_cache_queries": ("prefix_cache_queries_total", "prefix_cache_queries"),
}
MAX_TEXT = 8 << 20  # a /metrics page larger than this is not read


@dataclass(frozen=True)
class ServerSample:
    t_s: float  # seconds into the measured phase
    figures: dict[str, float]


def parse_prometheus(text: str) -> dict[str, float]:
    """Each metric family's value, summed over its label sets, by its name without namespace
    (`vllm:num_requests_running{...} 3` -> {"num_requests_running": 3.0}). Lines that do not
    parse are skipped: a page is read for what it has."""
    found: dict[str, float] = {}
    for raw in text[:MAX_TEXT].splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        parts = rest.split()
        if not name or not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        key = name.rsplit(":", 1)[-1]
        found[key] = found.get(key, 0.0) + value
    return found


def server_figures(text: str) -> dict[str, float]:
    """The known gauges and counters in a page, under optlab's names (`GAUGES`, `COUNTERS`)."""
    values = parse_prometheus(text)
    figures: dict[str, float] = {}
    for figure, names in (*GAUGES.items(), *COUNTERS.items()):
        for name in names:
            if name in values:
                figures[figure] = values[name]
                break
    return figures


def _increase(values: Sequence[float]) -> float:
    """A counter's increase over the samples; a drop (a restart) counts from zero again."""
    total = 0.0
    for before, after in zip(values, values[1:], strict=False):
        total += after - before if after >= before else after
    return total


def summarize(samples: Sequence[ServerSample]) -> dict[str, float | int | None] | None:
    """`llm.server` of a run: `samples`, each gauge's `<figure>_mean` and `<figure>_max`,
    each counter's increase, and `prefix_cache_hit_rate` (hits / queries over the phase);
    None without a sample that had any known figure."""
    usable = [s for s in samples if s.figures]
    if not usable:
        return None
    out: dict[str, float | int | None] = {"samples": len(usable)}
    for figure in GAUGES:
        values = [s.figures[figure] for s in usable if figure in s.figures]
        out[f"{figure}_mean"] = sum(values) / len(values) if values else None
        out[f"{figure}_max"] = max(values) if values else None
    for figure in COUNTERS:
        values = [s.figures[figure] for s in usable if figure in s.figures]
        out[figure] = _increase(values) if len(values) >= 2 else None
    hits, queries = out["prefix_cache_hits"], out["prefix_cache_queries"]
    out["prefix_cache_hit_rate"] = (
        hits / queries
        if isinstance(hits, float) and isinstance(queries, float) and queries
        else None
    )
    return out
