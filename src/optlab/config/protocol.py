"""The measurement protocol a run follows, resolved from the config and the command line."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from optlab.config.models import FULL_MAX_DURATION_S, FULL_MIN_DURATION_S, Protocol
from optlab.errors import ConfigError

FULL_WARMUP_MIN_S = 30.0
FULL_WARMUP_MAX_S = 300.0
STABILITY_WINDOW_S = 5.0  # the last three windows of 5 s must agree (perf_analyzer's rule)
STABILITY_WINDOWS = 3
STABILITY_TOLERANCE = 0.10
QUICK_WARMUP_S = 1.0
QUICK_DURATION_S = 5.0
# `optlab run --quick` (no --duration) measures past its 5 s until a P99 has the queries it
# needs (MLPerf's bound, optlab.run.validity.P99_MIN_QUERIES), for at most this long: a
# target serving 75 requests/s gives ~375 in 5 s, and a quick run of it was always INVALID.
# 60 s: an LLM endpoint serving 11-22 requests/s (the reference LLM's naive baseline on a busy
# 2-core machine) still gets its P99 in a quick run. The cap decides only whether a slow
# target's run ends INVALID, never how a valid run was measured, so runs under another cap
# stay comparable (chain.comparability.protocol_key).
QUICK_MIN_QUERIES = 662
QUICK_MAX_DURATION_S = 60.0
# Send lag under this is never the load generator's fault; above it, it is weighed against
# the latency, the SLO and the time between sends (run/pace.py).
MAX_SEND_LAG_P99_MS = 2.0


@dataclass(frozen=True)
class EffectiveProtocol:
    """Everything that decides how a run is measured. Runs compare only under equal protocols."""

    name: Literal["full", "quick"]
    warmup: Literal["stable", "fixed"]
    warmup_s: float  # the fixed warmup, or the minimum before stability is judged
    warmup_max_s: float
    duration_s: float
    max_error_rate: float
    max_send_lag_p99_ms: float = MAX_SEND_LAG_P99_MS
    stability_window_s: float = STABILITY_WINDOW_S
    stability_tolerance: float = STABILITY_TOLERANCE
    # protocol.stability_pct was given: the halves may differ by the tolerance and no more,
    # noise or not. Unset, a drift past the tolerance counts only beyond the halves' own
    # noise (run/stability.py). How a run is judged, not how it is measured: left out of
    # `as_dict` (the stored protocol runs compare by; the stored config keeps stability_pct).
    stability_fixed: bool = False
    # Measure past duration_s until this many queries completed, up to max_duration_s
    # (0: exactly duration_s); left out of `as_dict` when 0.
    min_queries: int = 0
    max_duration_s: float | None = None

    @property
    def provisional(self) -> bool:
        if self.name == "quick":
            return True
        return self.duration_s < FULL_MIN_DURATION_S or (
            self.warmup == "fixed" and self.warmup_s < FULL_WARMUP_MIN_S
        )

    def as_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "provisional": self.provisional}
        del data["stability_fixed"]
        if not self.min_queries:
            del data["min_queries"], data["max_duration_s"]
        return data


def effective_protocol(
    protocol: Protocol,
    *,
    quick: bool = False,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    until_queries: bool = False,
    max_duration_s: float | None = None,
) -> EffectiveProtocol:
    """Config protocol + command-line overrides. Overrides win; quick wins over full.
    `until_queries`: a quick run without a duration measures until a P99 is supported
    (QUICK_MIN_QUERIES, within `max_duration_s`, by default QUICK_MAX_DURATION_S); a sweep
    sizes its levels itself."""
    name: Literal["full", "quick"] = "quick" if quick else protocol.name
    duration = duration_s if duration_s is not None else protocol.duration_s
    warmup = warmup_s if warmup_s is not None else protocol.warmup_s
    if duration is not None and not 0 < duration <= FULL_MAX_DURATION_S:
        raise ConfigError(
            f"--duration {duration:g} s is outside (0, {FULL_MAX_DURATION_S:g}] s",
            hint="full runs measure 600-900 s; shorter runs are provisional",
        )
    if warmup is not None and not 0 <= warmup <= FULL_WARMUP_MAX_S:
        raise ConfigError(
            f"--warmup {warmup:g} s is outside [0, {FULL_WARMUP_MAX_S:g}] s",
            hint="leave it out to warm up until stable",
        )
    pct = protocol.stability_pct
    tolerance = STABILITY_TOLERANCE if pct is None else pct / 100
    if name == "quick":
        extend = until_queries and duration is None
        return EffectiveProtocol(
            name="quick",
            warmup="fixed",
            warmup_s=QUICK_WARMUP_S if warmup is None else warmup,
            warmup_max_s=QUICK_WARMUP_S if warmup is None else warmup,
            duration_s=QUICK_DURATION_S if duration is None else duration,
            max_error_rate=protocol.max_error_rate,
            stability_tolerance=tolerance,
            stability_fixed=pct is not None,
            min_queries=QUICK_MIN_QUERIES if extend else 0,
            max_duration_s=(max_duration_s or QUICK_MAX_DURATION_S) if extend else None,
        )
    return EffectiveProtocol(
        name="full",
        warmup="stable" if warmup is None else "fixed",
        warmup_s=FULL_WARMUP_MIN_S if warmup is None else warmup,
        warmup_max_s=FULL_WARMUP_MAX_S if warmup is None else warmup,
        duration_s=FULL_MIN_DURATION_S if duration is None else duration,
        max_error_rate=protocol.max_error_rate,
        stability_tolerance=tolerance,
        stability_fixed=pct is not None,
    )


def protocol_label(protocol: dict[str, Any] | None, *, warmup: bool = False) -> str:
    """A stored protocol in words, `quick (5 s measured, PROVISIONAL)`; with `warmup`, how it
    warmed up too (`quick (5 s measured, warmup fixed 1 s, PROVISIONAL)`): what tells apart
    two protocols of the same length, in a refusal or a step left out of a table."""
    if not protocol:
        return "no run"

    def seconds(value: Any) -> str:
        return f"{value:g} s" if isinstance(value, (int, float)) else f"{value} s"

    parts = [f"{seconds(protocol.get('duration_s'))} measured"]
    if protocol.get("min_queries"):
        parts = [
            f"{seconds(protocol.get('duration_s'))} measured, longer until "
            f"{protocol['min_queries']} queries (at most {seconds(protocol.get('max_duration_s'))})"
        ]
    if warmup:
        parts.append(f"warmup {protocol.get('warmup')} {seconds(protocol.get('warmup_s'))}")
    if protocol.get("provisional"):
        parts.append("PROVISIONAL")
    return f"{protocol.get('name')} ({', '.join(parts)})"
