"""The checks of the rule catalogue on a streaming LLM target (`kind: openai`), from its run's
`llm` section (docs/run-json.md): whether the client held requests back (TTFT from the
intended send against the send's own), whether a request waits for a slot before its
first token (TTFT against the decode step), whether the prompt's length sets the first token
(TTFT against input tokens) or the sequences decoding together set the pace of the rest
(each request's median ITL against running sequences), and whether the engine's KV cache
ran full (its own metrics, `llm.server`). A target of another kind has nothing of the sort
to check (NOT_APPLICABLE: they pass, left out of the text); a streaming run without the
figures says so."""

from __future__ import annotations

from optlab.diagnose.evidence import Evidence
from optlab.diagnose.findings import (
    NOT_APPLICABLE,
    Fired,
    Measure,
    Outcome,
    Params,
    Passed,
    Unevaluable,
    confidence,
    past,
    ramp,
)
from optlab.store import LlmSummary
from optlab.store.summary import LineFit

NOT_STREAMING = "no TTFT or ITL figures: no stream of the run could be measured (run-json.md llm)"


def _llm(e: Evidence) -> LlmSummary | None:
    summary = e.summary
    return summary.llm if summary is not None else None


def _not_streaming(e: Evidence) -> Outcome:
    """A run without the figures: nothing to check for a kind that does not stream."""
    if e.kind is None or e.kind.name != "openai":
        return NOT_APPLICABLE
    return Unevaluable(NOT_STREAMING)


def check_llm_client(e: Evidence, p: Params) -> Outcome:
    llm = _llm(e)
    ttft = llm.ttft_ms.p99 if llm is not None and llm.ttft_ms is not None else None
    wait = llm.client_wait_ms.p99 if llm is not None and llm.client_wait_ms is not None else None
    if ttft is None or wait is None or ttft <= 0:
        return _not_streaming(e)
    share = wait / ttft
    return past(
        Measure("client wait P99 / TTFT P99", share, p["share"], unit="x"),
        None,
        0.8,
        f"requests waited {wait:.1f} ms (P99) in the client before they were sent, "
        f"{share:.0%} of TTFT P99: the load's in-flight limit or the client, not the server, "
        "sets the time to first token",
        context=(Measure("client wait P99", wait, None, unit="ms"),),
    )


def check_llm_queue(e: Evidence, p: Params) -> Outcome:
    llm = _llm(e)
    ttft = llm.ttft_sent_ms.p50 if llm is not None and llm.ttft_sent_ms is not None else None
    itl = llm.itl_ms.p50 if llm is not None and llm.itl_ms is not None else None
    if ttft is None or itl is None or itl <= 0:
        return _not_streaming(e)
    steps = ttft / itl
    return past(
        Measure("TTFT P50 from the send / ITL P50", steps, p["steps"], unit="x"),
        None,
        4 * p["steps"],
        f"a request's first token takes {steps:.0f} decode steps (TTFT P50 {ttft:.1f} ms "
        f"from its send, ITL P50 {itl:.1f} ms): it waits for a free sequence slot (or a long "
        "prefill) before it starts; more concurrent sequences, chunked prefill or fewer "
        "requests in flight",
    )


def _explained(
    fit: LineFit, p: Params, name: str, summary: str, context: tuple[Measure, ...]
) -> Outcome:
    """A line rule: fired where the line's part at the mean x is at least `share` of the mean
    y AND the line explains at least `r2` of y's variance (a steep line through noise, or a
    tight line that moves y little, is not the cause)."""
    share = fit.share_at_mean
    measures = (
        Measure(name, share, p["share"], unit="x"),
        Measure("R² of the line", fit.r2, p["r2"]),
        *context,
    )
    if not (measures[0].met and measures[1].met):
        return Passed(measures)
    strength = confidence(ramp(share, p["share"], 1.0), ramp(fit.r2, p["r2"], 1.0))
    return Fired(None, strength, measures, summary)


def check_llm_prefill(e: Evidence, p: Params) -> Outcome:
    llm = _llm(e)
    if llm is None:
        return _not_streaming(e)
    fit = llm.ttft_by_input
    if fit is None or fit.y_mean <= 0:
        return Unevaluable(
            "TTFT cannot be related to the prompt's length: every prompt had the same number "
            "of tokens (or under 30 requests had a first token, or the run was stored before "
            "optlab kept llm.ttft_by_input); a workload whose input_tokens vary (uniform, "
            "normal or a list) shows it"
        )
    share = fit.share_at_mean
    shortest = fit.intercept + fit.slope * fit.x_min
    longest = fit.intercept + fit.slope * fit.x_max
    return _explained(
        fit,
        p,
        "prompt's share of TTFT from the send",
        f"TTFT from the send grows {fit.slope:.3g} ms per input token (R² {fit.r2:.2f} over "
        f"{fit.requests:,} requests): {shortest:.1f} ms at {fit.x_min:.0f} tokens, "
        f"{longest:.1f} ms at {fit.x_max:.0f}; the prefill is {share:.0%} of the first "
        "token at the mean prompt; chunked prefill, prefix caching (shared prompts) or a "
        "faster prefill (precision, threads)",
        (
            Measure("TTFT per input token", fit.slope, None, unit="ms"),
            Measure("input tokens (mean)", fit.x_mean, None),
        ),
    )


def check_llm_decode(e: Evidence, p: Params) -> Outcome:
    llm = _llm(e)
    if llm is None:
        return _not_streaming(e)
    fit = llm.itl_by_running
    if fit is None or fit.y_mean <= 0:
        return Unevaluable(
            "ITL cannot be related to the sequences decoding: under 30 requests had two "
            "tokens, the count of streams decoding together never varied, or the run was "
            "stored before optlab kept llm.itl_by_running"
        )
    if fit.x_max - fit.x_min < p["spread"]:
        return Unevaluable(
            f"the streams decoding beside a request hardly varied ({fit.x_min:.1f} to "
            f"{fit.x_max:.1f}): ITL cannot be related to them; an open loop (Poisson) or a "
            "sweep over concurrency varies them"
        )
    share = fit.share_at_mean
    alone = fit.intercept + fit.slope
    return _explained(
        fit,
        p,
        "running sequences' share of ITL",
        f"a request's median ITL grows {fit.slope:.3g} ms per sequence decoding beside it "
        f"(R² {fit.r2:.2f} over {fit.requests:,} requests): {alone:.2f} ms alone, "
        f"{fit.y_mean:.2f} ms at the mean {fit.x_mean:.1f} running; the batch is {share:.0%} "
        "of each decode step: fewer concurrent sequences (max_num_seqs) if ITL matters more "
        "than throughput, or a cheaper step (quantisation, a smaller KV-cache dtype, more "
        "threads)",
        (
            Measure("ITL per running sequence", fit.slope, None, unit="ms"),
            Measure("running sequences (mean)", fit.x_mean, None),
        ),
    )


def check_llm_kv_cache(e: Evidence, p: Params) -> Outcome:
    llm = _llm(e)
    server = llm.server if llm is not None else None
    if server is None or (server.kv_cache_usage_max is None and server.preemptions is None):
        if e.kind is None or e.kind.name != "openai":
            return NOT_APPLICABLE
        return Unevaluable(
            "no KV-cache figures: the engine's Prometheus metrics were not read "
            "(target.prometheus_url) or export neither KV-cache usage nor preemptions"
        )
    usage = server.kv_cache_usage_max
    preempted = server.preemptions or 0.0
    context = (Measure("preemptions", preempted, None),)
    if preempted > 0:
        return past(
            Measure("preemptions", preempted, 0.0),
            None,
            1.0,
            f"the engine preempted sequences {preempted:.0f} times (KV cache full at "
            f"{usage if usage is not None else float('nan'):.0%} at most): evicted sequences "
            "recompute their prefix; fewer concurrent sequences, a smaller KV-cache dtype or "
            "more memory for the cache",
        )
    if usage is None:
        return Passed(context)
    return past(
        Measure("KV-cache usage max", usage, p["usage"], unit="x"),
        None,
        1.0,
        f"the KV cache was {usage:.0%} full at its peak: new sequences wait for cache space "
        "(and an engine that preempts will); fewer concurrent sequences, a smaller KV-cache "
        "dtype or more memory for the cache",
        context=context,
    )
