"""`optlab demo`: the reference chain that suits this machine, measured under the quick protocol
into a fresh database, then its stacked-gains table.

The chains ship with the package (`optlab/_experiments`, from the repository's `experiments/`),
so the demo works from a wheel as well as from a checkout.
"""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from optlab.errors import OptlabError, RefusedError
from optlab.reports.table import stacked_table
from optlab.run.runner import RunOptions, run
from optlab.store import Store

if TYPE_CHECKING:
    import pandas as pd

    from optlab.run.runner import Progress, RunOutcome

# The quick protocol's 5 s give the naive CPU baseline (~75 requests/s here) too few requests
# for a valid P99 (662); the demo measures each step a little longer, still PROVISIONAL.
DEMO_DURATION_S = 12.0
DEMO_WARMUP_S = 2.0
# A short run on a busy machine can come out INVALID (unstable halves); the chain stops at an
# invalid step, so the demo measures that step again, at most this many times. Every run is
# stored, the invalid ones included.
DEMO_RETRIES = 2
# Chain folder -> the head experiment's file in it.
CHAINS = {"cpu": "04-int8.yaml", "gpu": "03-preprocess.yaml"}


@dataclass(frozen=True)
class DemoResult:
    chain: str
    head: str
    database: Path
    outcomes: list[RunOutcome]
    table: pd.DataFrame
    seconds: float


def experiments_dir() -> Path:
    """The shipped chains: inside the wheel, or the repository's experiments/ in a checkout."""
    packaged = importlib.resources.files("optlab") / "_experiments"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "experiments"
    if checkout.is_dir():
        return checkout
    raise OptlabError(
        f"optlab's reference chains are missing (looked for {packaged} and {checkout})",
        hint="reinstall optlab; a wheel must contain optlab/_experiments",
    )


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def choose_chain(requested: str) -> str:
    """`auto`: the seed's GPU chain where cuda is available, the CPU chain otherwise."""
    if requested == "auto":
        return "gpu" if cuda_available() else "cpu"
    if requested not in CHAINS:
        raise OptlabError(f"unknown demo chain {requested!r}", hint="use auto, cpu or gpu")
    if requested == "gpu" and not cuda_available():
        raise OptlabError(
            "the gpu chain needs CUDA, and torch sees no CUDA device here",
            hint="run `optlab demo` (auto) or `optlab demo --chain cpu`",
        )
    return requested


def fresh_database(folder: Path) -> Path:
    """A new SQLite file under `folder`: the demo never writes into an existing database."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"demo-{stamp}.db"
    suffix = 1
    while path.exists():
        suffix += 1
        path = folder / f"demo-{stamp}-{suffix}.db"
    return path


def _again(progress: Progress, last: RunOutcome, fallback: str) -> None:
    reasons = "; ".join(last.summary.reasons) or fallback
    progress.note(
        f"{last.experiment}'s run {last.run_id} is INVALID ({reasons}): a short run "
        "on a busy machine; measuring it again"
    )


def run_demo(
    chain: str,
    database: Path,
    progress: Progress,
    on_outcome: Callable[[RunOutcome], None] | None = None,
) -> DemoResult:
    """Measure the whole chain (quick protocol) into `database` and build its table."""
    started = time.monotonic()
    head_file = experiments_dir() / chain / CHAINS[chain]
    store = Store.open(f"sqlite:///{database.resolve()}")
    outcomes: list[RunOutcome] = []

    def collect(outcome: RunOutcome) -> None:
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    options = RunOptions(quick=True, duration_s=DEMO_DURATION_S, warmup_s=DEMO_WARMUP_S, chain=True)
    try:
        for attempt in range(DEMO_RETRIES + 1):
            try:
                run(head_file, store, options, progress, collect)
            except RefusedError as exc:
                last = outcomes[-1] if outcomes else None
                # Only an INVALID run is noise worth measuring again; a FAILED one is a fault.
                if last is None or last.status != "FINISHED" or attempt == DEMO_RETRIES:
                    raise
                _again(progress, last, exc.message)
                continue
            last = outcomes[-1]
            # The head's own INVALID run does not stop the chain, but is noise all the same.
            if last.status != "FINISHED" or last.summary.valid or attempt == DEMO_RETRIES:
                break
            _again(progress, last, "")
        head = outcomes[-1].experiment
        table = stacked_table(store, head)
    finally:
        store.close()
    return DemoResult(chain, head, database, outcomes, table, time.monotonic() - started)
