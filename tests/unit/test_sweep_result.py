"""The sweep's result as the store holds it (`SweepResult`), and what `optlab sweep --json`,
its table and `optlab sweeps` print from it, byte for byte (tests/golden/sweep.*)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from optlab.config.slo import Slo, parse_slo
from optlab.reports.sweep import (
    LevelRow,
    SweepView,
    render_sweep,
    render_sweep_list,
    render_sweep_markdown,
    sweep_json,
)
from optlab.store import SweepLevelRecord, SweepRecord, SweepResult
from optlab.sweep.strategy import Level

GOLDEN = Path(__file__).parents[1] / "golden"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RESULT: dict[str, Any] = {
    "capacity_qps": 151.23456,
    "capacity_interval": [140.5, 160.25],
    "knee_qps": 120.4444,
    "knee_clients": 3,
    "limited_by": "slo",
    "message": "capacity 151.2/s at P99 ≤ 60 ms (interval 140.5-160.2/s)",
    "method": "model: median of bootstrap draws",
    "notes": ["a level was measured again", "the knee is below the capacity"],
}


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("OPTLAB_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} changed: OPTLAB_UPDATE_GOLDEN=1"


def _record(result: dict[str, Any] | None, sweep_id: int = 4) -> SweepRecord:
    return SweepRecord(
        id=sweep_id, uid="u" * 32, experiment="baseline", config_id=1, config_hash="h" * 64,
        environment_id=None, status="FINISHED", mode="open", slo_percentile="p99", slo_ms=60.0,
        protocol={"name": "quick", "duration_s": 5.0, "provisional": True}, strategy={},
        code_identity={}, hostname="h", pid=1, started_at=NOW, finished_at=NOW,
        result=SweepResult.from_stored(result), measured_s=123.456, error_message=None,
        levels=(SweepLevelRecord(0, 11, "closed", 1.0, "one client", False),),
    )  # fmt: skip


def _level(mode: str, load: float, achieved: float | None, p99: float | None, **more: Any) -> Level:
    return Level(
        mode="closed" if mode == "closed" else "open", load=load, achieved_qps=achieved,
        p50_ms=None if p99 is None else p99 / 3, value_ms=p99, value_se_ms=None,
        error_rate=more.pop("error_rate", 0.0), valid=more.pop("valid", True), p99_ms=p99,
        run_id=more.pop("run_id", 11), duration_s=5.0, measured_s=6.0, **more,
    )  # fmt: skip


def _view(result: dict[str, Any] | None) -> SweepView:
    rows = (
        LevelRow(0, "one client", False, _level("closed", 1.0, 52.123456, 19.5), None),
        LevelRow(1, "growth", True, _level("open", 26.0, 25.9, 21.25, run_id=12), None),
        LevelRow(2, "growth", False, _level("open", 52.0, 51.5, 48.0, run_id=13), None),
        LevelRow(3, "growth", False, _level("open", 104.0, 99.0, 75.5, run_id=14), "slo"),
        LevelRow(
            4, "bisection", False,
            _level("open", 208.0, 150.0, None, run_id=15, valid=False, error_rate=0.0123456),
            "saturation",
        ),  # fmt: skip
        LevelRow(5, "again", False, _level("open", 150.0, 149.0, 59.0, run_id=16), "invalid"),
    )
    return SweepView(_record(result), Slo("p99", 60.0), rows)


def test_sweep_json_and_tables_are_unchanged_byte_for_byte() -> None:
    """`optlab sweep --json` (cli/sweep.py: `json.dumps(..., allow_nan=False)`), its table, its
    markdown, and `optlab sweeps`, for a finished sweep and for one without a result."""
    found, pending = _view(RESULT), _view(None)
    lines = [json.dumps(sweep_json(view), allow_nan=False) for view in (found, pending)]
    _golden("sweep.jsonl", "\n".join(lines) + "\n")
    text = [
        render_sweep(found),
        render_sweep(pending),
        render_sweep_markdown(found),
        render_sweep_list([found.record, _record(None, 5)]),
    ]
    _golden("sweep.txt", "\n\n".join(text) + "\n")


def test_a_stored_result_round_trips_and_reads_its_versionless_form() -> None:
    result = SweepResult.from_stored(RESULT)
    assert result is not None and result.schema_version == 1
    assert result.capacity_interval == (140.5, 160.25) and result.knee_clients == 3
    assert SweepResult.from_stored(result.stored_form()) == result
    assert json.loads(json.dumps(result.stored_form())) == {**RESULT, "schema_version": 1}
    assert SweepResult.from_stored(None) is None


@pytest.mark.parametrize(
    "change",
    [
        {"limited_by": "patience"},  # not a limit
        {"capacity_qps": float("nan")},
        {"colour": "red"},  # a typo is an error, never a silent no-op
        {"schema_version": 2},  # written by a newer optlab
    ],
)
def test_a_result_that_does_not_fit_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SweepResult.from_stored({**RESULT, **change})


def test_a_token_slo_sweep_says_how_much_of_its_bound_each_level_used() -> None:
    """P50 and P99 stay the E2E latency's; the added column is the binding bound's share."""
    view = _view(RESULT)
    tokens = SweepView(view.record, parse_slo("ttft_p99=30ms,tpot_p99=5ms"), view.levels)
    text = render_sweep(tokens)
    header = next(line for line in text.splitlines() if line.startswith("#"))
    assert header.split() == ["#", "load", "achieved/s", "P50", "ms", "P99", "ms", "of", "SLO",
                              "err", "%", "run", "verdict"]  # fmt: skip
    rows = [line.split() for line in text.splitlines() if line[:1].isdigit()]
    assert rows[1][5] == "71%" and rows[3][5] == "252%"  # 21.25 and 75.5 of 30 ms
    assert rows[4][5] == "-"  # no figure to judge
    assert "| of SLO |" in render_sweep_markdown(tokens)
    assert "of SLO" not in render_sweep(view)  # a plain P99 sweep: its P99 is the judged value
