"""The GPU checks of the rule catalogue: NVML's utilisation and clocks-event reasons, read
from the run's resource samples; without GPU telemetry they say so (docs/diagnose.md)."""

from __future__ import annotations

from optlab.diagnose import readings
from optlab.diagnose.evidence import Evidence, percentile
from optlab.diagnose.findings import (
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


def _gpu_reading(e: Evidence) -> list[float] | Unevaluable:
    utils = e.gpu_utils()
    if utils is None:
        if e.kind is not None and e.config is not None and e.kind.uses_gpu(e.config):
            return Unevaluable("no GPU evidence: NVML gave no readings during the run")
        return Unevaluable("no GPU evidence: the run had no GPU telemetry")
    return utils


def check_gpu_compute(e: Evidence, p: Params) -> Outcome:
    utils = _gpu_reading(e)
    if isinstance(utils, Unevaluable):
        return utils
    p95 = percentile(utils, 50) or 0.0
    m = Measure("GPU utilisation (median sample)", p95, p["util_pct"], unit="%")
    top = readings.serial_stage(e)
    return past(
        m,
        top[0] if top else None,
        99,
        f"the GPU is busy {p95:.0f}% of the time: the model's own compute is the limit",
        base=0.65,
        span=0.3,
    )


def check_gpu_starved(e: Evidence, p: Params) -> Outcome:
    utils = _gpu_reading(e)
    if isinstance(utils, Unevaluable):
        return utils
    p95 = percentile(utils, 95) or 0.0
    cpu, cores = e.target_cpu_pct(), e.cores
    measures = [Measure("GPU utilisation P95", p95, p["util_p95_pct"], "<=", "%")]
    host_bound = False
    if cpu is not None and cores:
        used = cpu / cores
        measures.append(Measure("target CPU (of the machine)", used, p["cpu_pct"], unit="%"))
        host_bound = used >= p["cpu_pct"] or 0.75 <= cpu / 100 <= 1.25
    top = readings.serial_stage(e)
    if not (measures[0].met and host_bound and top is not None):
        return Passed(tuple(measures))
    return Fired(
        top[0],
        confidence(ramp(p["util_p95_pct"] - p95, 0, p["util_p95_pct"]), base=0.65),
        tuple(measures),
        f"the GPU idles (P95 {p95:.0f}%) while the host is busy in {top[0]}: the CPU side "
        "starves the model",
    )


def check_gpu_throttled(e: Evidence, p: Params) -> Outcome:
    seen = total = 0
    for sample in e.samples:
        if sample.gpus is None:
            continue
        total += 1
        if any(g.throttle_reasons for g in sample.gpus):
            seen += 1
    if total == 0:
        reading = _gpu_reading(e)
        return reading if isinstance(reading, Unevaluable) else Passed()
    share = 100 * seen / total
    m = Measure("samples with GPU clocks lowered", share, p["share_pct"], unit="%")
    return past(
        m,
        None,
        100,
        "the GPU ran below its clocks (power, thermal or sync boost limits) for "
        f"{share:.0f}% of the run",
    )
