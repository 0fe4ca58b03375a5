"""The rule catalogue on recorded telemetry (docs/diagnose.md "Rules"): the GPU rules on
NVML-shaped fixtures (tests/fixtures/gpu: no GPU here), a leak told from a warming pool by the
RSS series, and every rule documented with its parameters."""

from __future__ import annotations

import json
from dataclasses import replace

from optlab.diagnose import RULES, diagnose
from optlab.diagnose.evidence import Evidence, evidence_of
from optlab.store import RunEvidence, RunSummary
from optlab.store.records import GpuSample, ResourceSample, StageStatsRow
from optlab.store.summary import MemoryTrend
from tests.support.evidence import record_of
from tests.support.paths import FIXTURES as ALL_FIXTURES
from tests.support.paths import REPO

FIXTURES = ALL_FIXTURES / "gpu"


def _evidence(fixture: str) -> Evidence:
    """A run's evidence from a telemetry fixture: NVML-shaped GPU samples as optlab stores
    them (resource_samples.gpu_json), its stage breakdown and CPU."""
    data = json.loads((FIXTURES / fixture).read_text("utf-8"))
    samples = tuple(
        ResourceSample(
            phase="measure",
            t_s=float(i),
            cpu_process_pct=s["cpu_process_pct"],
            cpu_system_pct=s["cpu_system_pct"],
            gpus=tuple(GpuSample(index=0, **g) for g in s["gpus"]) if "gpus" in s else None,
        )
        for i, s in enumerate(data["samples"])
    )
    stages = {
        name: StageStatsRow(stage=name, phase="measure", count=1000, histogram="", **row)
        for name, row in data["stages"].items()
    }
    summary = RunSummary.model_validate(
        {
            "run_id": 1,
            "experiment": "gpu",
            "status": "FINISHED",
            "valid": True,
            "provisional": False,
            "protocol": "full",
            "load": "closed",
            "requests": 1000,
            "errors": 0,
            "qps": data["qps"],
            "warmup_s": 30.0,
            "duration_s": 600.0,
        }
    )
    run = record_of(summary)
    return evidence_of(run, data["config"], stages=stages, samples=samples, cores=16)


def test_gpu_rules_on_telemetry_fixtures() -> None:
    busy = diagnose(_evidence("compute_bound.json"))
    assert busy.top is not None and busy.top.rule.id == "gpu-compute-bound"
    assert (busy.top.stage, busy.top.resource) == ("infer", "gpu")
    assert busy.top.suggestion is not None
    assert (busy.top.suggestion.knob, busy.top.suggestion.value) == ("precision", "fp16")

    starved = diagnose(_evidence("starved.json"))
    assert starved.top is not None and starved.top.rule.id == "gpu-starved"
    assert (starved.top.stage, starved.top.resource) == ("preprocess", "cpu")
    assert starved.top.suggestion is not None and starved.top.suggestion.knob == "preprocess"

    throttled = diagnose(_evidence("throttled.json"))
    assert any(f.rule.id == "gpu-throttled" for f in throttled.findings)


def test_without_gpu_evidence_the_gpu_rules_say_so() -> None:
    blind = diagnose(_evidence("no_telemetry.json"))
    missing = dict(blind.not_evaluated)
    for rule in ("gpu-compute-bound", "gpu-starved", "gpu-throttled"):
        assert missing[rule].startswith("no GPU evidence"), missing
    assert not any(f.resource == "gpu" for f in blind.findings)


def test_every_rule_is_documented_with_its_parameters() -> None:
    page = (REPO / "docs" / "diagnose.md").read_text("utf-8")
    assert len({r.id for r in RULES}) == len(RULES)
    for rule in RULES:
        assert f"`{rule.id}`" in page, rule.id
        for name, value in rule.params.items():
            assert f"`{name}` {value:g}" in page, (rule.id, name)


def _leak_evidence(rss_mib: list[float], requests: int = 10_000) -> Evidence:
    """A run whose RSS over the measured phase (one sample a second) is `rss_mib`."""
    base = _evidence("no_telemetry.json")
    slope = (rss_mib[-1] - rss_mib[0]) / requests * 1000
    summary = base.run.summary
    assert summary is not None
    evidence = summary.evidence or RunEvidence()
    recorded = evidence.model_copy(
        update={"memory": MemoryTrend(mib_per_1k_requests=slope, r2=0.95, samples=len(rss_mib))}
    )
    run = replace(
        base.run, requests=requests, summary=summary.model_copy(update={"evidence": recorded})
    )
    samples = tuple(
        ResourceSample(phase="measure", t_s=float(t), rss_bytes=int(v * 2**20))
        for t, v in enumerate(rss_mib)
    )
    assert base.config is not None
    stored = {
        **base.config.model_dump(mode="json"),
        "target": {"kind": "python", "factory": "m:build"},
    }
    return evidence_of(run, stored, stages=base.stages, samples=samples, cores=2)


def test_a_leak_keeps_growing_and_a_warming_pool_stops() -> None:
    leak = diagnose(_leak_evidence([100 + 10 * t for t in range(10)]))
    assert leak.top is not None and leak.top.rule.id == "memory-leak"
    assert (leak.top.stage, leak.top.resource) == (None, "memory")
    # The same growth, all of it in the first seconds: threads and buffers touched once.
    warming = diagnose(_leak_evidence([100, 130, 160, 185, 190, 190, 190, 190, 191, 190]))
    assert not any(f.rule.id == "memory-leak" for f in warming.findings)
    said = dict(warming.passed)["memory-leak"]
    late = next(m for m in said if m.metric.startswith("second half"))
    assert late.value < 0.5 and not late.met
