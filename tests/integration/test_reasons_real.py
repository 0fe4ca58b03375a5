"""Reasons a run is INVALID, through a real store: the texts print as they always did (`optlab
log`, tests/golden/log-reasons.txt); the codes are stored beside them, carried by bundles, and
read back with them. Which code each reason gets: tests/unit/test_reasons.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import Result

from optlab.run.summarize import summarize
from optlab.store import Store
from optlab.store.bundle_rules import Malformed, check_run
from tests.support.golden import check_golden
from tests.support.runs import runs_with_every_reason

# The runs stored, each with a reason of its own kind (tests/golden/log-reasons.txt shows these
# three; the stopped-early run's code is checked in tests/unit/test_reasons.py).
FINALS = [runs_with_every_reason(run_id=1)[name] for name in ("failed", "lagged", "killed")]


def _stored(store: Store) -> list[int]:
    store.save_config(
        name="baseline", kind="baseline", parent=None, description=None, hypothesis=None,
        config={"knobs": {}}, config_hash="a" * 64, change=None, variable=None,
        parent_config_hash=None, source_path="baseline.yaml", source_hash="b" * 64,
    )  # fmt: skip
    ids = []
    for case in FINALS:
        run_id = store.create_run(
            experiment="baseline", protocol_name="full", protocol={"name": "full"},
            provisional=False, environment_id=None, code_identity={}, git_commit=None,
            git_dirty=None,
        )  # fmt: skip
        store.finish_run(run_id, summarize(case).final)
        ids.append(run_id)
    return ids


def test_log_prints_each_reason_as_it_always_did(
    invoke: Callable[..., Result], sqlite_url: str
) -> None:
    with Store.open(sqlite_url) as store:
        _stored(store)
    result = invoke("log", "baseline")
    assert result.exit_code == 0, result.output
    # The lines under each run's row, six spaces in: its reasons (and its errors by type).
    lines = [line for line in result.output.splitlines() if line.startswith(" " * 6)]
    check_golden("log-reasons.txt", "\n".join(lines) + "\n")


def test_the_codes_are_stored_beside_the_texts_and_read_back_with_them(sqlite_url: str) -> None:
    with Store.open(sqlite_url) as store:
        failed, lagged, killed = (store.get_run(i) for i in _stored(store))
    assert failed.reason_codes == ("failed", "few-queries", "errors", "saturated", "unstable")
    assert [r.text for r in failed.verdict_reasons] == list(failed.reasons)
    assert lagged.reason_codes == ("generator-behind",)
    assert killed.reason_codes == ("interrupted", "stuck-clients")
    saturated = failed.reason("saturated", "stopped-early")
    assert saturated is not None and saturated.text.startswith("the target is saturated")
    assert lagged.reason("saturated", "stopped-early") is None


def test_bundles_carry_the_codes_and_a_bundle_without_them_imports_as_other(
    tmp_path: Path,
) -> None:
    with Store.open(f"sqlite:///{tmp_path / 'source.db'}") as source:
        ids = _stored(source)
        bundles = source.export_runs(ids)
    assert bundles[0].run["reason_codes"] == ["failed", "few-queries", "errors", "saturated",
                                              "unstable"]  # fmt: skip
    assert bundles[0].final.reason_codes == tuple(bundles[0].run["reason_codes"])
    check_run(bundles[0].run)
    old = {k: v for k, v in bundles[1].run.items() if k != "reason_codes"}  # an older optlab's
    check_run(old)
    for wrong in ([], ["generator-behind", "errors"], ["blame-the-network"], "errors"):
        with pytest.raises(Malformed, match="reason_codes"):
            check_run({**bundles[1].run, "reason_codes": wrong})
    with Store.open(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
        first, second = copy.import_bundles([bundles[0], replace(bundles[1], run=old)])
        assert first.run_id is not None and second.run_id is not None
        assert copy.get_run(first.run_id).reason_codes == bundles[0].final.reason_codes
        assert copy.get_run(second.run_id).reason_codes == ("other",)
        assert copy.get_run(second.run_id).reasons == bundles[1].final.reasons
