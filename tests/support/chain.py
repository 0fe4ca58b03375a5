"""The synthetic example chain, measured once for the whole session (tests/conftest.py's
`measured_chain`; `chain_copy` gives a test its own copy of the database to add to).

    synthetic-baseline (2 ms) -> synthetic-faster-service (1 ms) -> synthetic-slower (4 ms)
                                                                 -> synthetic-back (2 ms)

Every run measures CHAIN_DURATION_S (5 per-second windows; `COMPARED`'s 3 are the fewest a
step is judged from, but with 3 one second disturbed by the suite's other lane left the 2 ms ->
1 ms step "within noise": QPS windows 3279, 2878, 1802, an interval of [-99%, +26024%]). A copy of
the database taken after the first two runs (`pair`) holds baseline -> faster only, for tests
that count runs. `slower` is far beyond a short run's P99 noise (a regression); `back` undoes
the faster step's change (a chain whose total is about nothing). `slower` is measured before
`back`, so `back` is the newest head.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from tests.support.db import checkpoint
from tests.support.files import write
from tests.support.paths import SYNTHETIC
from tests.support.protocol import COMPARED_WARMUP_S

BASELINE = "synthetic-baseline"
FASTER = "synthetic-faster-service"
SLOWER = "synthetic-slower"
BACK = "synthetic-back"
STEPS = (BASELINE, FASTER, SLOWER, BACK)
CHAIN_DURATION_S = 5.0
CHAIN = ("--quick", "--duration", f"{CHAIN_DURATION_S:g}", "--warmup", f"{COMPARED_WARMUP_S:g}")

SLOWER_YAML = (
    f"name: {SLOWER}\nparent: {FASTER}\n"
    "hypothesis: a heavier model costs latency\nchange: {service_ms: 4.0}\n"
)
BACK_YAML = (
    f"name: {BACK}\nparent: {FASTER}\n"
    "hypothesis: undoing the change undoes its gain\nchange: {service_ms: 2.0}\n"
)


@dataclass(frozen=True)
class MeasuredChain:
    """The chain's folder (its experiment files), its checkpointed SQLite database, and the
    `run --json` lines of its four runs in the order measured (baseline, faster, slower, back);
    `pair` is a database holding the first two runs only (baseline -> faster)."""

    folder: Path
    database: Path
    lines: tuple[dict[str, Any], ...]
    pair: Path

    @property
    def url(self) -> str:
        return f"sqlite:///{self.database}"

    def line(self, experiment: str) -> dict[str, Any]:
        """The `run --json` line of `experiment`'s run."""
        return next(line for line in self.lines if line["experiment"] == experiment)


ATTEMPTS = 3  # a chain whose run came out INVALID is measured again from scratch


def measure_chain(root: Path) -> MeasuredChain:
    """Measure the chain in `root` (its folder `root/synthetic`, its database `root/chain.db`).
    The working directory is `root` meanwhile: whatever a run leaves there stays there.

    A run the suite's other lanes disturbed enough to be judged INVALID (halves that differ
    beyond their noise while a neighbour took a core: the verdict is right, the machine was
    busy) has the whole chain measured again into a fresh database, up to ATTEMPTS times, so
    the database always holds exactly the chain's four runs."""
    folder = root / "synthetic"
    shutil.copytree(SYNTHETIC, folder)
    write(folder, "02-slower.yaml", SLOWER_YAML)
    write(folder, "02-back.yaml", BACK_YAML)
    database, pair = root / "chain.db", root / "pair.db"
    here = Path.cwd()
    os.chdir(root)
    try:
        for attempt in range(1, ATTEMPTS + 1):
            for stale in (database, pair):
                for suffix in ("", "-wal", "-shm"):
                    stale.with_name(stale.name + suffix).unlink(missing_ok=True)
            lines = _measure(folder, database, pair, last=attempt == ATTEMPTS)
            if lines is not None:
                break
    finally:
        os.chdir(here)
    assert lines is not None
    checkpoint(database)
    assert [line["experiment"] for line in lines] == list(STEPS), lines
    return MeasuredChain(folder, database, tuple(lines), pair)


def _measure(
    folder: Path, database: Path, pair: Path, *, last: bool
) -> list[dict[str, Any]] | None:
    """The chain's `run --json` lines; None where a run came out INVALID (exit 4) and this
    is not the `last` attempt."""
    from optlab.cli.main import cli

    db = ["--db", f"sqlite:///{database}"]
    lines: list[dict[str, Any]] = []
    for step, chain in (("01-faster-service", True), ("02-slower", False), ("02-back", False)):
        args = ["run", str(folder / f"{step}.yaml"), *CHAIN, "--json"]
        args += ["--chain"] if chain else []
        result = CliRunner().invoke(cli, [*db, *args], catch_exceptions=False)
        if result.exit_code == 4 and not last:
            return None
        assert result.exit_code == 0, result.output
        printed = result.stdout.splitlines()
        lines += [json.loads(text) for text in printed if text.startswith("{")]
        if chain:  # baseline -> faster: the pair
            checkpoint(database)
            shutil.copy(database, pair)
    return lines
