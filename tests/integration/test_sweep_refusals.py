"""`optlab sweep` options no level could measure: refused before anything is stored, each
message naming the option the user typed and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from tests.support.files import write

Invoke = Callable[..., Result]

SERVER = """\
name: server
description: one server, fixed 2 ms
target: {kind: builtin, name: synthetic}
knobs: {distribution: fixed, service_ms: 2, single_server: true}
workload:
  load: {mode: open, rate: 50, arrival: constant}
protocol: {name: quick}
"""


@pytest.mark.parametrize(
    ("args", "said", "hint"),
    [
        (
            ("--budget-s", "nan"),
            "--budget-s nan must be a positive, finite number of seconds",
            "leave it out for no limit",
        ),
        (
            ("--budget-s", "inf"),
            "--budget-s inf must be a positive, finite number of seconds",
            "leave it out for no limit",
        ),
        (("--budget-s", "-5"), "--budget-s -5 must be a positive", "leave it out"),
        (
            ("--min-rate", "5000000"),
            "--min-rate 5,000,000 is more than the open loop sends at most 1,000,000 requests/s",
            "give --min-rate at most 1,000,000",
        ),
        (
            ("--max-rate", "2e6"),
            "--max-rate 2,000,000 is more than the open loop sends at most 1,000,000",
            "give --max-rate at most 1,000,000",
        ),
        (
            ("--mode", "closed", "--min-rate", "100000"),
            "--min-rate 100,000 is more than a closed loop runs at most 4,096 clients",
            "count clients with --mode closed",
        ),
        (
            ("--mode", "closed", "--min-rate", "0.5"),
            "--min-rate 0.5 is below one client",
            "give a whole number in [1, 4,096]",
        ),
        (
            ("--min-rate", "nan"),
            "--min-rate nan must be a positive, finite number of requests/s",
            "or leave --min-rate out",
        ),
        (
            ("--level-duration", "0"),
            "--level-duration 0 s is outside (0, 900] s",
            "the measured seconds of one level",
        ),
        (
            ("--level-duration", "nan"),
            "--level-duration nan s is outside (0, 900] s",
            "the measured seconds of one level",
        ),
        (
            ("--level-duration", "901"),
            "--level-duration 901 s is outside (0, 900] s",
            "the measured seconds of one level",
        ),
        (("--tolerance", "nan%"), "--tolerance nan% must be between 0% and 100%", "5%"),
    ],
)
def test_an_option_no_level_could_measure_is_refused_and_nothing_is_stored(
    args: tuple[str, ...], said: str, hint: str, invoke: Invoke, tmp_path: Path, sqlite_url: str
) -> None:
    path = write(tmp_path, "server.yaml", SERVER)
    result = invoke("sweep", str(path), "--slo", "p99=20ms", "--quick", *args)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert "hint: " in result.stderr and hint in result.stderr
    assert "unexpected error" not in result.stderr
    assert "--duration" not in result.stderr  # the option typed is named, not the run's
    assert result.stdout == ""
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    assert not database.exists(), "a refused sweep opened (and created) the database"
