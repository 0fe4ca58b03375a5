"""`optlab table` on a real terminal: through a pseudo-terminal of 80, 120 and 200 columns the
table fits, its key columns whole; `--wide` and piped output keep every column at full width.
The pseudo-terminal tests read the session's measured chain (slow); the fitted and piped
renderings of the hand-built table (tests/support/frames.py) are checked without one."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from typing import Any

import pytest

from optlab.reports.table import stacked_table
from optlab.reports.terminal import print_table, render_text
from optlab.store import Store
from tests.support.chain import SLOWER, MeasuredChain
from tests.support.frames import capacity_table, golden_table
from tests.support.golden import GOLDEN, check_golden

HEAD = SLOWER
KEY_HEADERS = ("step", "change", "QPS", "Δ step", "P99 ms", "verdict")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


@pytest.fixture(scope="module")
def database(measured_chain: MeasuredChain) -> str:
    """The session's measured synthetic chain (tests/support/chain.py), read only: baseline
    (2 ms), faster (1 ms), slower (4 ms) is the chain of HEAD."""
    return measured_chain.url


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "OPTLAB_DB")}
    return env | {"TERM": "xterm-256color"} | extra


def _optlab(database: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "optlab", "--db", database, *args]


def on_terminal(command: list[str], columns: int, env: dict[str, str] | None = None) -> str:
    """What `command` writes to a pseudo-terminal `columns` wide, colour codes removed."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(
        command, stdin=slave, stdout=slave, stderr=slave, env=env or _env(), close_fds=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end of the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")
    text = b"".join(chunks).decode()
    return ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "")


@pytest.fixture(scope="module")
def document(database: str) -> dict[str, Any]:
    """`optlab table --format json`: the figures the terminal table must show whole."""
    result = subprocess.run(
        _optlab(database, "table", HEAD, "--format", "json"),
        capture_output=True, text=True, env=_env(), check=True, timeout=120,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def _headers(text: str) -> list[str]:
    """The table's column headers: the line above the rule, split at runs of spaces (or at
    the box's bars in the full table)."""
    lines = text.splitlines()
    for above, line in zip(lines, lines[1:], strict=False):
        if line.strip() and set(line.strip()) <= set("─━┡╇┩"):
            return [h.strip() for h in re.split(r"\s{2,}|┃", above) if h.strip()]
    raise AssertionError(f"no header rule in:\n{text}")


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_the_table_fits_the_terminal(database: str, document: dict[str, Any], columns: int) -> None:
    text = on_terminal(_optlab(database, "table", HEAD), columns)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= columns, text
    assert "…" not in text, text
    headers = _headers(text)
    for header in KEY_HEADERS:
        assert header in headers, (header, headers)
    for entry in document["chain"]:
        row = next(line for line in lines if line.startswith(entry["experiment"] + " "))
        assert f"{entry['qps']:,.1f}" in row, (entry, row)
        assert f"{entry['p99_ms']:,.2f}" in row, (entry, row)
        for metric in ("qps", "p99"):
            change = entry["step_delta"][f"{metric}_pct"]
            if change is not None:
                assert f"{change:+.0f}%" in row, (metric, entry, row)
        assert entry["verdict"].split()[0] in row, (entry, row)
    assert "per step (--wide puts every column in the table):" in text


def test_a_wider_terminal_shows_more_columns(database: str) -> None:
    narrow, wide = (on_terminal(_optlab(database, "table", HEAD), c) for c in (80, 200))
    assert len(_headers(narrow)) == len(KEY_HEADERS) + 1  # two Δ step columns
    assert {"P50 ms", "Δ cum", "service P50"} <= set(_headers(wide))
    # What the table leaves out at 80 columns is in the detail block: P50, stage P50s, CPU.
    assert "latency: P50 " in narrow and "stage P50 ms: service " in narrow
    assert "resources: CPU " in narrow
    assert "latency: P50 " not in wide and "stage P50 ms" not in wide


def test_columns_in_the_environment_wins(database: str) -> None:
    text = on_terminal(_optlab(database, "table", HEAD), 200, _env(COLUMNS="80"))
    assert max(len(line) for line in text.splitlines()) <= 80, text


def test_wide_shows_every_column_as_piped_output_does(database: str) -> None:
    wide = on_terminal(_optlab(database, "table", HEAD, "--wide"), 80)
    piped = subprocess.run(
        _optlab(database, "table", HEAD), capture_output=True, text=True, env=_env(COLUMNS="80"),
        check=True, timeout=120,
    ).stdout  # fmt: skip
    assert wide == piped
    headers = _headers(piped)
    for header in ("Δ cum", "P50 ms", "service P50"):
        assert header in headers, headers
    assert max(len(line) for line in piped.splitlines()) > 80  # never squeezed to COLUMNS
    assert "per step" not in piped
    table = stacked_table(Store.open(database), HEAD)
    title = f"stacked gains: {HEAD} ({table.header.protocol_label})"
    assert piped == render_text(table, title, width=320)


def test_piped_output_is_unchanged() -> None:
    """Scripts read the piped table: every column at full width, byte for byte as before the
    table learned to fit (tests/golden/stacked.txt was written by that code)."""
    for hostile, name in ((False, "stacked.txt"), (True, "stacked-hostile.txt")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_table(golden_table(hostile=hostile), title="stacked gains: int8")
        check_golden(name, out.getvalue())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_table(capacity_table(), title="stacked gains: int8")
    check_golden("stacked-capacity.txt", out.getvalue())
    assert (GOLDEN / "stacked.txt").read_text(encoding="utf-8").count("\n") > 8


@pytest.mark.parametrize("width", [60, 80, 100, 120, 200])
def test_fitted_text_never_exceeds_its_width(width: int) -> None:
    """The hand-built table (every column of the contract) fitted to a width: no line wider,
    no cut value; every step's QPS and P99 whole."""
    text = render_text(golden_table(), "stacked gains: int8 (quick)", width, fit_to=True)
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text
    for value in ("1,000.0", "1,500.0", "1,800.0", "9.00", "6.00", "12.00", "+100%"):
        assert value in text, (value, text)
    assert "int8: missing: environment differs materially" in text
