"""Reasons a run is INVALID: a code beside each text (optlab.store.reasons), decided by the
verdict on hand-built runs (no store). That the texts print as they always did (`optlab log`,
tests/golden/log-reasons.txt) and that the codes are stored, bundled and read back with them:
tests/integration/test_reasons_real.py."""

from __future__ import annotations

from optlab.run.summarize import summarize
from optlab.store import RunFinal
from tests.support.runs import runs_with_every_reason


def test_each_reason_text_comes_with_its_code() -> None:
    codes = {
        name: summarize(case).final.reason_codes for name, case in runs_with_every_reason().items()
    }
    assert codes == {
        "failed": ("failed", "few-queries", "errors", "saturated", "unstable"),
        "lagged": ("generator-behind",),
        "killed": ("interrupted", "stuck-clients"),
        "stopped-early": ("stopped-early",),
    }
    failed = summarize(runs_with_every_reason()["failed"]).final
    texts = dict(zip(failed.reason_codes, failed.reasons, strict=True))
    assert texts["saturated"].startswith("the target is saturated")
    assert texts["failed"] == "the run failed: boom"


def test_a_record_built_without_codes_reads_its_reasons_as_other() -> None:
    final = RunFinal(status="FINISHED", reasons=("a", "b"), reason_codes=("errors", "no-such"))
    assert final.reason_codes == ("errors", "other")
    assert RunFinal(status="FINISHED", reasons=("a",)).reason_codes == ("other",)
