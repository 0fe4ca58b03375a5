"""`optlab sweep-knob` and `optlab tune` against truth: false winners, power, the tuned optimum
against Optuna TPE and a Model-Analyzer-style hill climb, interactions, and the reference
classifier swept for real.

Parts (each prints its figures and PASS/MISS; the exit status is 0 either way):

``--aa`` REAL sweeps: the synthetic target (one server, exponential service with a 2 ms mean,
4 closed-loop clients: QPS = 500/s) swept over its `sigma` knob (0.3, 0.7; the parent's 0.5),
which only a lognormal service reads: three arms with one truth. The draws are fresh every run
(`seed: null`), so each run carries the sampling noise of its ~2,500 service times (a seeded
target replays the same draws every run: each seed is then a system of its own, 2-6% faster
or slower than another, and a first A/A over seeds named such a seed twice in 20). Goal: no
winner in >= 19 of 20 sweeps.

``--power`` REAL sweeps: the same target swept over `service_ms` 1.852, 2 (the parent), 2.3:
1.852 is planted 8% better (QPS = 1000/service_ms when the server never idles, as 4 clients
keep it). Goal: 1.852 named in >= 18 of 20, and a named value never more than 2% below the
best.

Both run `optlab.knobs.search.sweep_knob` itself (a temporary folder and database per seed,
--quick runs of 5 s, 4 blocks), so the runs, their validity rules, the windows' errors and the
decision are the command's.

``--tune`` SIMULATED knob sweeps on the synthetic batching model's 3-knob surface (knob_tune.py's
COSTS) on two grids (``--grid coarse|fine|both``): the coarse grid (SPACE: batch sizes in
powers of two, whose optimum stands 14% above every config not tied with it) and the fine grid
(FINE: batch sizes 1-4, 6, 8, 10, 12, 16, 24, 32, whose neighbours of the optimum stand 0.6-5%
below it, within a measurement's drift; this VM's drift alone). The truth of every config is
the discrete-event simulation's exact capacity (`optlab.reference.batching.batching_capacity`,
cached in benchmarks/knob_surface.json and knob_surface_fine.json).
The measurement routine all three searchers share: a config's capacity measured by a quick
capacity sweep, optlab's own sweep strategy on levels simulated by that discrete-event
simulation, on a machine whose speed drifts between measurements (DRIFT; the cells of one
knob-sweep block share theirs) and, in a second scenario, also slows steadily; a third
scenario is a busy machine (BUSY: three times the drift). `tune` runs optlab's own procedure
(`optlab.knobs.tune.tune` over `optlab.knobs.decision.decide`); Optuna's TPE (Optuna in its
own venv, OPTUNA_PYTHON, asked and told over a pipe) and a hill climb in the manner of Triton
Model Analyzer's quick search (from the smallest config, step each knob up one value, one
measurement each, move to the best neighbour whenever it measured any higher: its
`COMPARISON_SCORE_THRESHOLD = 0`) get the same measured seconds as tune spent in that seed,
and, on the first scenario, a budget curve: the same two at 10-50% of tune's median seconds.
Goals: tune >= 95% of the optimum in >= 18 of 20 seeds and its median above both others';
the planted interaction flagged in >= 18 of 20, and nothing flagged on the additive surface
in >= 19 of 20 (the busy machine's verdicts are for information: the goals do not name one).

``--classifier`` REAL: `optlab sweep-knob experiments/cpu/02-dynamic-batch.yaml --knob
batching.max_batch_size --values 1,2,4,8,16 --quick` on the reference classifier, timed (goal
<= 10 minutes on 2 cores), its chart written to knob-classifier.svg.

Run: ``PYTHONPATH=src python benchmarks/knob_search.py [--aa] [--power] [--tune]
[--grid both] [--classifier] [--seeds 20]`` (no part named: all); ``--smoke``: one tune seed
on the coarse grid's planted surface (tests/e2e/test_benchmarks_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from optlab.knobs.search import KnobOptions, sweep_knob
from optlab.store import Store

REPO = Path(__file__).resolve().parents[1]

# -- real sweeps: A/A and power --------------------------------------------------------------

TARGET = """\
name: syn
description: one server, exponential service (mean 2 ms), 4 closed-loop clients
target: {kind: builtin, name: synthetic}
knobs:
  distribution: exponential
  service_ms: 2.0
  servers: 1
  sigma: 0.5
  seed: null
workload:
  load: {mode: closed, concurrency: 4}
protocol: {name: quick}
"""

BLOCKS = 4
RUN_S = 5.0
WARMUP_S = 0.5


class _Quiet:
    def update(self, status: Any) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def real_sweep(seed: int, knob: str, values: str) -> dict[str, Any]:
    """One `sweep-knob` in a fresh folder and database; its document."""
    with tempfile.TemporaryDirectory(prefix="knob-bench-") as tmp:
        folder = Path(tmp)
        path = folder / "syn.yaml"
        path.write_text(TARGET, encoding="utf-8")
        options = KnobOptions(
            knob=knob,
            values=values,
            blocks=BLOCKS,
            quick=True,
            duration_s=RUN_S,
            warmup_s=WARMUP_S,
            seed=seed,
        )
        with Store.open(f"sqlite:///{folder / 'db.sqlite'}") as store:
            return sweep_knob(path, store, options, _Quiet()).document


def aa(seeds: int) -> None:
    print(
        f"\n== A/A: sigma 0.5 (parent) vs 0.3, 0.7, unread by exponential service: one truth "
        f"(500/s), fresh draws every run; {BLOCKS} blocks of {RUN_S:g} s runs =="
    )
    winners = 0
    for seed in range(seeds):
        doc = real_sweep(seed, "sigma", "0.3,0.7")
        winners += doc["winner"] is not None
        effects = ", ".join(
            f"{r['value']}: {r['effect_pct']:+.1f}%" for r in doc["values"] if not r["control"]
        )
        print(
            f"  seed {seed:2d}: winner {doc['winner']}, tie {doc['tie']}; {effects}; "
            f"{doc['measured_s']:.0f} s",
            flush=True,
        )
    ok = seeds - winners >= math.ceil(seeds * 19 / 20)
    print(
        f"A/A: no winner in {seeds - winners}/{seeds} (goal >= 19/20): {'PASS' if ok else 'MISS'}"
    )


PLANTED = round(2.0 / 1.08, 4)  # 8% more QPS than the parent's 2 ms (as --values gives it)


def power(seeds: int) -> None:
    values = f"{PLANTED:.4f},2,2.3"
    print(f"\n== power: service_ms {values} (parent 2; {PLANTED:.4f} is +8% QPS) ==")
    named = wrong = 0
    for seed in range(seeds):
        doc = real_sweep(seed, "service_ms", values)
        winner = doc["winner"]
        named += winner is not None and abs(winner - PLANTED) < 1e-6
        # The truth: QPS = 1000 / service_ms; the best is the planted value.
        if winner is not None and PLANTED / winner < 0.98:
            wrong += 1
        row = next(r for r in doc["values"] if r["value"] == winner) if winner else None
        said = f"{row['effect_pct']:+.1f}% {row['interval']}" if row else doc["sentence"]
        print(f"  seed {seed:2d}: winner {winner}; {said}; {doc['measured_s']:.0f} s", flush=True)
    ok = named >= math.ceil(seeds * 18 / 20) and wrong == 0
    print(
        f"power: planted value named in {named}/{seeds} (goal >= 18/20), a named value more "
        f"than 2% below the best in {wrong}: {'PASS' if ok else 'MISS'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument(
        "--smoke", action="store_true", help="One tune seed on the planted surface (seconds)."
    )
    parser.add_argument(
        "--tune-blocks", type=int, default=3, help="Blocks of tune's knob sweeps (--tune)."
    )
    parser.add_argument(
        "--grid",
        choices=("coarse", "fine", "both"),
        default="both",
        help="Which batching grid --tune searches (default both).",
    )
    for part in ("aa", "power", "tune", "classifier"):
        parser.add_argument(f"--{part}", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        from knob_tune import run_tune_benchmark

        run_tune_benchmark(1, smoke=True)
        return
    parts = [p for p in ("aa", "power", "tune", "classifier") if getattr(args, p)] or [
        "aa",
        "power",
        "tune",
        "classifier",
    ]
    print(f"knob_search on {platform.node()} ({os.cpu_count()} CPUs), parts {parts}")
    started = time.monotonic()
    if "aa" in parts:
        aa(args.seeds)
    if "power" in parts:
        power(args.seeds)
    if "tune" in parts:
        import knob_tune

        knob_tune.BLOCKS = args.tune_blocks
        grids = ("coarse", "fine") if args.grid == "both" else (args.grid,)
        knob_tune.run_tune_benchmark(args.seeds, grids=grids)
    if "classifier" in parts:
        classifier()
    print(f"\ntotal {time.monotonic() - started:.0f} s")


def classifier() -> None:
    """The reference classifier's dynamic-batch step swept over max_batch_size, for real, by
    the command a user runs; its wall time, its answer and its chart (an SVG beside this
    script, to look at)."""
    print("\n== the reference classifier: sweep-knob batching.max_batch_size 1,2,4,8,16 --quick ==")
    with tempfile.TemporaryDirectory(prefix="knob-clf-") as tmp:
        folder = Path(tmp) / "cpu"
        shutil.copytree(REPO / "experiments" / "cpu", folder)
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        cmd = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{Path(tmp) / 'db.sqlite'}"]
        started = time.monotonic()
        done = subprocess.run(
            [*cmd, "sweep-knob", str(folder / "02-dynamic-batch.yaml"), "--knob",
             "batching.max_batch_size", "--values", "1,2,4,8,16", "--quick", "--json"],
            check=False, env=env, capture_output=True, text=True,
        )  # fmt: skip
        took = time.monotonic() - started
        shown = [
            line
            for line in done.stderr.splitlines()
            if not line.startswith(("[", "run ")) and " block " not in line
        ]
        print("\n".join(shown))
        if done.returncode != 0:
            print(f"exit {done.returncode} after {took:.0f} s: MISS")
            return
        doc = json.loads(done.stdout.strip().splitlines()[-1])
        svg = subprocess.run(
            [*cmd, "knob-sweeps", "--show", str(doc["knob_sweep_id"]), "--format", "svg"],
            check=False, env=env, capture_output=True, text=True,
        ).stdout  # fmt: skip
        out = REPO / "benchmarks" / "knob-classifier.svg"
        out.write_text(svg, encoding="utf-8")
        print(
            f"sweep-knob took {took:.0f} s wall ({doc['measured_s']:.0f} s measured) on "
            f"{os.cpu_count()} CPUs (goal <= 600 s: {'PASS' if took <= 600 else 'MISS'}); "
            f"chart: {out}"
        )


if __name__ == "__main__":
    main()
