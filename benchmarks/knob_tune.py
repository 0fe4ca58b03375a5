"""`benchmarks/knob_search.py --tune`: optlab tune against Optuna TPE and a hill climb on the
synthetic batching model's 3-knob surface, and the interaction check on a surface with a
planted interaction and one without (see knob_search.py's docstring for the goals).

The measurement routine all three searchers share measures a config's capacity the way
`optlab sweep --quick` does: optlab's own sweep strategy (`optlab.sweep.strategy`: next_probe /
conclude) on open-loop levels simulated by the batching model's discrete-event simulation
(`optlab.reference.batching.simulate_batching`) for exactly the seconds the driver would
measure (1 s warmup, then max(5 s x the probe's factor, 730 / rate)), the level's figures
computed from the simulated latencies as a real level's are, its saturation judged by the
run verdict's rule on the backlog the simulation had in flight (a level with no backlog facts
is called saturated by a 3-sigma shortfall of Poisson completions alone: 1 sweep in ~100 here
then stopped at a tenth of the truth). A shared machine drifts: each
measurement runs on a machine whose speed is drawn anew (every service time x exp(N(0,
DRIFT))), except that the cells of one `sweep-knob` block share theirs, as arms measured back
to back do. The truth of each config is `batching_capacity` (the simulation's exact capacity,
TRUTH_S of arrivals), cached in benchmarks/knob_surface.json.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optlab.config.slo import Slo
from optlab.knobs.decision import decide
from optlab.knobs.metric import METRICS
from optlab.knobs.tune import tune
from optlab.metrics.selection import Arm
from optlab.reference.batching import batching_capacity, simulate_batching
from optlab.reference.synthetic import SyntheticKnobs
from optlab.run.pace import BACKLOG_GROWTH_MIN, saturated_by
from optlab.sweep.strategy import Level, Probe, Settings, conclude, next_probe

HERE = Path(__file__).resolve().parent
OPTUNA_PYTHON = Path("/tmp/optuna-venv/bin/python")

SLO_MS = 200.0
Space = tuple[tuple[str, tuple[Any, ...]], ...]
SPACE: Space = (
    ("max_batch_size", (1, 2, 4, 8, 16, 32, 64)),
    ("servers", (1, 2, 3, 4, 6, 8)),
    ("max_wait_ms", (0, 1, 2, 5, 10)),
)
# The fine grid: batch sizes as an engineer sweeps them once the coarse grid has pointed near
# the top. Its neighbours there stand 0.6-5% apart (the additive surface's 6, 8, 10 and 12:
# 0.973, 1, 0.984, 0.947 of the optimum), within a measurement's drift, where one measurement
# per config is as likely to crown a neighbour as the best.
FINE: Space = (
    ("max_batch_size", (1, 2, 3, 4, 6, 8, 10, 12, 16, 24, 32)),
    ("servers", (1, 2, 3, 4, 6, 8)),
    ("max_wait_ms", (0, 1, 2, 5, 10)),
)
GRIDS = {
    "coarse": (SPACE, HERE / "knob_surface.json"),
    "fine": (FINE, HERE / "knob_surface_fine.json"),
}
TRUTH_S = 300.0  # simulated seconds of each truth: ~1% (batching.py's table, x sqrt(1000/300))
TRUTH_ERROR = 0.01
START = {"max_batch_size": 1, "servers": 1, "max_wait_ms": 0}
COSTS = {"service_ms": 4.0, "per_item_ms": 0.5, "per_item2_ms": 0.0625}
BLOCKS = 3
# A measurement's machine speed, log-sd between measurements: this VM's identical short runs
# differed in QPS by up to 12-17% over 100 A/A pairs (benchmarks/README.md, calibration.py),
# the largest of 100 |differences| of two draws, about 3.6 sd: 3.5-4.7%.
DRIFT = 0.045
# The second scenario: the machine also slows steadily, 15% over 10,000 measured seconds (about
# one tune here), as a shared host does when a neighbour's load grows through an afternoon.
TREND_PER_S = 0.15 / 10_000
WARMUP_S = 1.0
BASE_MEASURE_S = 5.0
MIN_REQUESTS = 730
SATURATED_STOP_S = 4.0
# A busy machine: three times this VM's drift between measurements (13.5%: the spread of its
# identical short runs beside a neighbour's load), where blocked, paired cells should matter.
BUSY = 3 * DRIFT
# The budget curve: TPE and the hill climb at these shares of tune's median measured seconds.
BUDGET_SHARES = (0.1, 0.2, 0.3, 0.5)
Config = dict[str, Any]


def knobs_of(config: Config, interaction: bool, speed: float = 1.0) -> SyntheticKnobs:
    return SyntheticKnobs(
        distribution="fixed",
        service_ms=COSTS["service_ms"] * speed,
        per_item_ms=COSTS["per_item_ms"] * speed,
        per_item2_ms=COSTS["per_item2_ms"] * speed,
        servers=config["servers"],
        max_batch_size=config["max_batch_size"],
        max_wait_ms=config["max_wait_ms"],
        interaction=interaction,
    )


def key(config: Config) -> str:
    return ",".join(f"{k}={config[k]}" for k, _ in SPACE)  # the knobs in one order, any grid


def all_configs(space: Space) -> list[Config]:
    configs: list[Config] = [{}]
    for knob, values in space:
        configs = [{**c, knob: v} for c in configs for v in values]
    return configs


def truth(interaction: bool, grid: str = "coarse") -> dict[str, float]:
    """Every config's exact capacity (the simulation's), computed once and cached."""
    space, cache = GRIDS[grid]
    name = "interaction" if interaction else "additive"
    cached = json.loads(cache.read_text()) if cache.is_file() else {}
    wanted = {
        "slo_ms": SLO_MS,
        "costs": COSTS,
        "space": [[k, list(v)] for k, v in space],
        "truth_s": TRUTH_S,
    }
    if cached.get("setup") == wanted and name in cached:
        return dict(cached[name])
    started = time.monotonic()
    found = {
        key(c): batching_capacity(knobs_of(c, interaction), SLO_MS, duration_s=TRUTH_S)
        for c in all_configs(space)
    }
    print(f"  truth of {len(found)} configs ({name}) in {time.monotonic() - started:.0f} s")
    if cached.get("setup") != wanted:
        cached = {"setup": wanted}
    cached[name] = found
    cache.write_text(json.dumps(cached, indent=1, sort_keys=True) + "\n")
    return found


# -- the measurement routine: a quick capacity sweep on simulated levels ---------------------


def _level(knobs: SyntheticKnobs, probe: Probe, rng: np.random.Generator) -> Level:
    rate = probe.load
    measured = max(BASE_MEASURE_S * probe.duration_factor, MIN_REQUESTS / rate)
    end = WARMUP_S + measured
    n = rng.poisson(rate * end)
    arrivals = np.sort(rng.uniform(0.0, end, n))
    result = simulate_batching(arrivals * 1e9, knobs)
    so = np.asarray(result.latencies_ns) / 1e9
    done = arrivals + so
    kept = arrivals >= WARMUP_S
    lat = so[kept] * 1000
    sent = arrivals[kept]
    completed = int(np.sum((done >= WARMUP_S) & (done < end)))
    w99 = []
    for k in range(int(measured)):
        window = lat[(sent >= WARMUP_S + k) & (sent < WARMUP_S + k + 1)]
        if window.size >= 5:
            w99.append(float(np.percentile(window, 99)))
    se = float(np.std(w99, ddof=1) / math.sqrt(len(w99))) if len(w99) >= 3 else None
    p99 = float(np.percentile(lat, 99)) if lat.size else None
    # The verdict's saturation rule, on the backlog the real run would have seen: requests in
    # flight when the measurement starts and ends (`run.pace.saturated_by`).
    in_flight = [int(np.sum(arrivals < t)) - int(np.sum(done < t)) for t in (WARMUP_S, end)]
    saturated = saturated_by(
        rate,
        completed / measured,
        measured,
        backlog_grew=in_flight[1] - in_flight[0] >= BACKLOG_GROWTH_MIN,
        limit_reached=False,
    )
    if completed < 0.83 * rate * measured:
        measured = min(measured, SATURATED_STOP_S)
        end = WARMUP_S + measured
    return Level(
        "open",
        rate,
        completed / measured,
        float(np.percentile(lat, 50)) if lat.size else None,
        p99,
        se,
        0.0,
        lat.size >= 100,
        measured_s=end,
        duration_s=measured,
        p99_ms=p99,
        purpose=probe.purpose,
        saturated=saturated,
    )


def _one_client(knobs: SyntheticKnobs, probe: Probe, rng: np.random.Generator) -> Level:
    """The sweep's first tier, one closed-loop client: each request alone in its batch."""
    cost = (
        knobs.service_ms
        + knobs.per_item_ms
        + knobs.per_item2_ms * (knobs.servers if knobs.interaction and knobs.servers else 1)
        + knobs.max_wait_ms
    )
    measured = max(BASE_MEASURE_S, MIN_REQUESTS * cost / 1000)
    return Level(
        "closed",
        1,
        1000 / cost,
        cost,
        cost,
        0.0,
        0.0,
        True,
        measured_s=WARMUP_S + measured,
        duration_s=measured,
        p99_ms=cost,
        purpose=probe.purpose,
    )


@dataclass(frozen=True)
class Measured:
    capacity: float | None
    interval: tuple[float, float] | None
    seconds: float


def measure(config: Config, interaction: bool, speed: float, rng: np.random.Generator) -> Measured:
    """One quick capacity sweep of `config` on a machine of this `speed`."""
    knobs = knobs_of(config, interaction, speed)
    settings = Settings("open", Slo("p99", SLO_MS))
    levels: list[Level] = []
    while (probe := next_probe(levels, settings)) is not None:
        level = (
            _one_client(knobs, probe, rng) if probe.mode == "closed" else _level(knobs, probe, rng)
        )
        levels.append(level)
    result = conclude(levels, settings)
    return Measured(
        result.capacity_qps, result.capacity_interval, sum(lv.measured_s for lv in levels)
    )


# -- the searchers ------------------------------------------------------------------------


class Bench:
    """One seed on one surface: the measurement routine, its seconds, the truth."""

    def __init__(
        self,
        seed: int,
        interaction: bool,
        truths: dict[str, float],
        trend: bool = False,
        drift: float = DRIFT,
        space: Space = SPACE,
    ) -> None:
        self.rng = np.random.default_rng(
            [seed, int(interaction), int(trend)] + ([] if drift == DRIFT else [round(drift * 1e4)])
        )
        self.interaction = interaction
        self.space = space
        self.drift = drift
        self.truths = truths
        self.best = max(truths.values())
        self.trend = trend
        self.clock = 0.0  # measured seconds of the searcher running now

    def start(self) -> None:
        """A searcher begins: the machine is back to its first speed."""
        self.clock = 0.0

    def speed(self) -> float:
        """How slow the machine is for the next measurement (service times x this)."""
        slower = 1.0 + TREND_PER_S * self.clock if self.trend else 1.0
        return float(math.exp(self.rng.normal(0.0, self.drift))) * slower

    def fraction(self, config: Config) -> float:
        return self.truths[key(config)] / self.best

    def cell(self, config: Config, speed: float) -> tuple[float, float, float, float]:
        """(log capacity, its se, df, seconds) of one measurement; nan where none."""
        m = measure(config, self.interaction, speed, self.rng)
        self.clock += m.seconds
        if m.capacity is None or m.capacity <= 0:
            return math.nan, math.nan, math.nan, m.seconds
        se = math.nan
        if m.interval is not None and m.interval[0] > 0 and m.interval[1] > m.interval[0]:
            se = (math.log(m.interval[1]) - math.log(m.interval[0])) / (2 * 1.96)
        return math.log(m.capacity), se, 1e6, m.seconds

    def sweep(
        self, config: Config, knob: str, values: Sequence[Any], purpose: str
    ) -> dict[str, Any]:
        """A knob sweep as `optlab sweep-knob --slo` runs it: blocks of every arm, the arms
        of a block on one machine speed, decided by optlab's own `decide`."""
        parent = config[knob]
        others = [v for v in values if v != parent]
        arms_cfg = [config] + [{**config, knob: v} for v in others]
        logs = [[math.nan] * BLOCKS for _ in arms_cfg]
        ses = [[math.nan] * BLOCKS for _ in arms_cfg]
        dfs = [[math.nan] * BLOCKS for _ in arms_cfg]
        seconds = 0.0
        for block in range(BLOCKS):
            speed = self.speed()
            for arm in self.rng.permutation(len(arms_cfg)):
                log, se, df, s = self.cell(arms_cfg[arm], speed)
                logs[arm][block], ses[arm][block], dfs[arm][block] = log, se, df
                seconds += s
        doc = decide(
            [Arm(logs[i], ses[i], dfs[i], averages_out=False) for i in range(len(arms_cfg))],
            values=[parent, *others],
            experiments=[key(c) for c in arms_cfg],
            asked=list(values),
            parent_value=parent,
            knob=knob,
            m=METRICS["capacity"],
            tie_break="best",  # tune's: it seeks the optimum
            cpu=[None] * len(arms_cfg),
        )
        doc["measured_s"] = seconds
        return doc

    def tune(self) -> tuple[Config, list[str], float]:
        self.start()
        result = tune(
            dict(START),
            self.space,
            sweep=self.sweep,
            derive=lambda c, k, v: {**c, k: v},
            value_of=lambda c, k: c[k],
        )
        return result.final, result.flags, result.measured_s

    def hill_climb(self, budget_s: float) -> Config:
        """Model Analyzer's quick search, in spirit: from the smallest config, measure each
        one-notch-up neighbour once, move to the best if it measured any higher than the
        current; stop at a local top or when the seconds run out."""
        self.start()
        current = {k: v[0] for k, v in self.space}
        spent = 0.0
        log, _, _, s = self.cell(current, self.speed())
        spent += s
        here = log if math.isfinite(log) else -math.inf
        while spent < budget_s:
            best, best_log = None, here
            for knob, values in self.space:
                i = values.index(current[knob])
                if i + 1 >= len(values) or spent >= budget_s:
                    continue
                neighbour = {**current, knob: values[i + 1]}
                log, _, _, s = self.cell(neighbour, self.speed())
                spent += s
                if math.isfinite(log) and log > best_log:
                    best, best_log = neighbour, log
            if best is None:
                break
            current, here = best, best_log
        return current

    def optuna(self, budget_s: float, seed: int) -> Config | None:
        """Optuna's TPE (its own venv), asked and told over a pipe, one measurement per trial,
        until the seconds run out; its answer is the trial that measured highest."""
        if not OPTUNA_PYTHON.is_file():
            return None
        self.start()
        space = json.dumps([[k, list(v)] for k, v in self.space])
        worker = subprocess.Popen(
            [str(OPTUNA_PYTHON), str(HERE / "optuna_worker.py"), space, str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert worker.stdin is not None and worker.stdout is not None
        spent, best, best_log = 0.0, None, -math.inf
        try:
            while spent < budget_s:
                worker.stdin.write("ask\n")
                worker.stdin.flush()
                asked = json.loads(worker.stdout.readline())
                config = {k: asked["params"][k] for k, _ in self.space}
                log, _, _, s = self.cell(config, self.speed())
                spent += s
                value = log if math.isfinite(log) else -1e9
                worker.stdin.write(json.dumps({"tell": asked["number"], "value": value}) + "\n")
                worker.stdin.flush()
                worker.stdout.readline()
                if value > best_log:
                    best, best_log = config, value
        finally:
            worker.stdin.close()
            worker.wait(timeout=30)
        return best


def run_tune_benchmark(
    seeds: int, smoke: bool = False, grids: Sequence[str] = ("coarse", "fine")
) -> None:
    if not OPTUNA_PYTHON.is_file():
        print(
            f"  Optuna skipped: no {OPTUNA_PYTHON} (python -m venv /tmp/optuna-venv && "
            "/tmp/optuna-venv/bin/pip install optuna)"
        )
    for grid in ("coarse",) if smoke else grids:
        space = ", ".join(f"{k} {list(v)}" for k, v in GRIDS[grid][0])
        print(
            f"\n== tune on the batching surface, {grid} grid (P99 <= {SLO_MS:g} ms; {space}; "
            f"{BLOCKS} blocks; machine drift {DRIFT:.1%}) =="
        )
        # (slowing trend, drift): this VM, the same slowing through the afternoon, a busy
        # machine; the fine grid on this VM's drift alone (its point is the close neighbours).
        scenarios = [(False, DRIFT)]
        if not smoke and grid == "coarse":
            scenarios += [(True, DRIFT), (False, BUSY)]
        for trend, drift in scenarios:
            for interaction in (True,) if smoke else (True, False):
                spent = _surface_run(seeds, interaction, trend, drift, grid)
                if not smoke and not trend and drift == DRIFT and grid == "coarse":
                    _budget_curve(seeds, interaction, statistics.median(spent))


def _at_optimum(fractions: Sequence[float]) -> int:
    """How many answers are the optimum to within the truth's own error."""
    return sum(f >= 1 - TRUTH_ERROR for f in fractions)


def _budget_curve(seeds: int, interaction: bool, tune_s: float) -> None:
    """TPE and the hill climb at shares of tune's median seconds: the budget at which each
    finds the optimum (tune's own fewest seconds are printed beside the surface's line)."""
    truths = truth(interaction)
    for share in BUDGET_SHARES:
        budget = share * tune_s
        climb, tpe = [], []
        for seed in range(seeds):
            bench = Bench(seed, interaction, truths)
            climb.append(bench.fraction(bench.hill_climb(budget)))
            found = bench.optuna(budget, seed)
            tpe.append(bench.fraction(found) if found is not None else math.nan)
        print(
            f"  budget curve, {share:.0%} of tune's seconds ({budget:,.0f} s): "
            + ", ".join(
                f"{name} median {statistics.median(v):.3f}, at the optimum {_at_optimum(v)}/{seeds}"
                for name, v in (("Optuna TPE", tpe), ("hill climb", climb))
            ),
            flush=True,
        )


def _surface_run(
    seeds: int, interaction: bool, trend: bool, drift: float, grid: str = "coarse"
) -> list[float]:
    truths = truth(interaction, grid)
    best_cfg = max(truths, key=lambda k: truths[k])
    described = (
        f"drift {drift:.1%} per measurement"
        + (" (a busy machine)" if drift != DRIFT else "")
        + (f" and slowing {TREND_PER_S * 1e4:.0%} per 10,000 s" if trend else "")
    )
    print(
        f"\n-- {'planted interaction' if interaction else 'additive'} surface, {described}: "
        f"optimum {best_cfg} = {truths[best_cfg]:,.1f}/s --"
    )
    ours: list[float] = []
    tpe: list[float] = []
    climb: list[float] = []
    secs: list[float] = []
    flagged = 0
    for seed in range(seeds):
        bench = Bench(seed, interaction, truths, trend, drift, GRIDS[grid][0])
        final, flags, spent = bench.tune()
        secs.append(spent)
        ours.append(bench.fraction(final))
        flagged += bool(flags)
        climb.append(bench.fraction(bench.hill_climb(spent)))
        op = bench.optuna(spent, seed)
        tpe.append(bench.fraction(op) if op is not None else math.nan)
        print(
            f"  seed {seed:2d}: tune {ours[-1]:.3f} ({key(final)}; {spent:,.0f} s; flags: "
            f"{'; '.join(flags) or 'none'}); TPE {tpe[-1]:.3f}; hill climb {climb[-1]:.3f}",
            flush=True,
        )
    # The goals name no noise level beyond this VM's: a busy machine's verdicts inform.
    aside = "" if drift == DRIFT else " (busy machine: for information)"
    reach = sum(f >= 0.95 for f in ours)
    others = {"Optuna TPE": tpe, "hill climb": climb}
    print(
        f"tune >= 95% of the optimum in {reach}/{seeds} (goal >= 18/20): "
        f"{'PASS' if reach >= math.ceil(seeds * 0.9) else 'MISS'}{aside}"
    )
    line = ", ".join(
        f"{name} median {statistics.median(v):.3f} mean {statistics.fmean(v):.3f}, >= 95% in "
        f"{sum(f >= 0.95 for f in v)}/{seeds}, at the optimum {_at_optimum(v)}/{seeds}"
        for name, v in {"tune": ours, **others}.items()
    )
    # Configs whose truths differ by less than the truth's own error (TRUTH_S: ~1%) are one
    # optimum: a median above another's by less than that is a tie, not a win.
    beats = all(
        statistics.median(ours) > statistics.median(v) + TRUTH_ERROR for v in others.values()
    )
    print(
        f"at equal measured seconds (median {statistics.median(secs):,.0f} s each, tune's "
        f"fewest {min(secs):,.0f} s): {line}: "
        f"{'PASS' if beats else 'MISS'} (tune's median above both by more than the truth's "
        f"{TRUTH_ERROR:.0%}){aside}"
    )
    if interaction:
        print(
            f"planted interaction flagged in {flagged}/{seeds} (goal >= 18/20): "
            f"{'PASS' if flagged >= math.ceil(seeds * 0.9) else 'MISS'}{aside}"
        )
    else:
        print(
            f"additive surface flagged in {flagged}/{seeds} (goal <= 1/20): "
            f"{'PASS' if seeds - flagged >= math.ceil(seeds * 0.95) else 'MISS'}{aside}"
        )
    return secs
