"""`optlab sweep`: measure level after level as the strategy asks, store each level as a run
of the sweep, and the sweep's result.

Each level is a normal run (warmup, measurement, validity verdict, histograms, windows,
resources) of the experiment with its load set by the sweep. A level that an earlier sweep of
the same config measured under the same protocol, environment and code is reused instead of
measured again. Ctrl-C ends the level in progress KILLED (as `optlab run` does), keeps the
finished levels, and marks the sweep KILLED with what they say.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from optlab.chain.comparability import (
    Environments,
    code_difference,
    environment_difference,
    same_protocol,
)
from optlab.chain.lineage import Link
from optlab.config import modes
from optlab.config.models import ResolvedConfig
from optlab.config.modes import MAX_CONCURRENCY, MAX_RATE
from optlab.config.protocol import EffectiveProtocol, effective_protocol
from optlab.config.slo import Slo
from optlab.errors import OptlabError
from optlab.run.measurement import RunOptions
from optlab.run.progress import GuardedProgress, Progress
from optlab.run.runner import Context, link_code, measure_level, open_context, process_alive
from optlab.run.validity import P99_MIN_QUERIES
from optlab.store import RunRecord, Store, SweepLevelTag, SweepResult
from optlab.sweep.levels import level_of
from optlab.sweep.probe import AGAIN
from optlab.sweep.strategy import Level, Mode, Probe, Settings, conclude, next_probe

__all__ = ["SweepOptions", "SweepOutcome", "check_options", "sweep"]

# A level gets this many more requests than the P99 bound needs, so that one it measures at
# the planned rate is not INVALID for a handful of queries.
QUERY_MARGIN = 1.1
SIZING = "sizing"  # a level too short to count, measured again at the length its rate needs
FULL_MAX_LEVEL_S = 900.0
SEED_MASK = 0x7FFFFFFF  # a level's seed stays a non-negative 31-bit integer
MAX_LEVEL_S = FULL_MAX_LEVEL_S  # --level-duration's highest value: a full run's longest


@dataclass(frozen=True)
class SweepOptions:
    slo: Slo
    mode: Mode = "open"
    quick: bool = False
    level_duration_s: float | None = None
    min_rate: float | None = None
    max_rate: float | None = None
    tolerance: float = 0.05
    budget_s: float | None = None
    chain: bool = False
    # False: measure every level anew (a knob sweep's blocks must not share levels).
    reuse: bool = True

    def settings(self, max_error_rate: float) -> Settings:
        return Settings(
            mode=self.mode,
            slo=self.slo,
            min_rate=self.min_rate,
            max_rate=self.max_rate,
            tolerance=self.tolerance,
            budget_s=self.budget_s,
            max_error_rate=max_error_rate,
        )

    def strategy(self) -> dict[str, Any]:
        """What is stored as the sweep's strategy: how it searched."""
        return {
            "min_rate": self.min_rate,
            "max_rate": self.max_rate,
            "tolerance": self.tolerance,
            "budget_s": self.budget_s,
            "level_duration_s": self.level_duration_s,
        }


@dataclass
class SweepOutcome:
    sweep_id: int
    experiment: str
    status: str  # FINISHED, KILLED, FAILED
    mode: Mode
    slo: Slo
    result: SweepResult
    levels: list[Level]
    runs: list[int]  # each level's run id, in order
    reused: list[bool]
    measured_s: float
    error: str | None = None


def check_options(options: SweepOptions) -> None:
    """Refuse what no level could measure before anything is stored, each naming the option
    the user typed and its accepted range."""
    low, high = options.min_rate, options.max_rate
    closed = options.mode == "closed"
    unit = "clients" if closed else "requests/s"
    most = MAX_CONCURRENCY if closed else MAX_RATE
    for name, value in (("--min-rate", low), ("--max-rate", high)):
        if value is None:
            continue
        if not (math.isfinite(value) and value > 0):
            raise OptlabError(
                f"{name} {value:g} must be a positive, finite number of {unit}",
                hint=f"give a number in (0, {most:,.0f}], or leave {name} out",
            )
        if closed and value < 1:
            raise OptlabError(
                f"{name} {value:g} is below one client",
                hint=f"a closed-loop sweep counts clients: give a whole number in [1, {most:,}]",
            )
        if value > most:
            what = "a closed loop runs at most" if closed else "the open loop sends at most"
            raise OptlabError(
                f"{name} {value:,.0f} is more than {what} {most:,.0f} {unit}",
                hint=f"give {name} at most {most:,.0f}"
                + (
                    " (--min-rate and --max-rate count clients with --mode closed)"
                    if closed
                    else " (spread more load over several hosts: workload.load.hosts)"
                ),
            )
    if low is not None and high is not None and high < low:
        raise OptlabError(
            f"--max-rate {high:g} is below --min-rate {low:g}",
            hint="give a range that goes up: --min-rate LOW --max-rate HIGH",
        )
    if not 0 < options.tolerance < 1:
        raise OptlabError(
            f"--tolerance {options.tolerance:.0%} must be between 0% and 100%",
            hint="the default, 5%, stops when the bracket is within 5% of the capacity",
        )
    budget = options.budget_s
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise OptlabError(
            f"--budget-s {budget:g} must be a positive, finite number of seconds",
            hint="give the most measured seconds the sweep may spend, or leave it out for no limit",
        )
    duration = options.level_duration_s
    if duration is not None and not (math.isfinite(duration) and 0 < duration <= MAX_LEVEL_S):
        raise OptlabError(
            f"--level-duration {duration:g} s is outside (0, {MAX_LEVEL_S:g}] s",
            hint="give the measured seconds of one level (a few seconds with --quick), or "
            "leave it out for the protocol's own",
        )


def base_protocol(config: ResolvedConfig, options: SweepOptions) -> EffectiveProtocol:
    """The protocol every level follows before its duration is sized."""
    return effective_protocol(
        config.protocol, quick=options.quick, duration_s=options.level_duration_s
    )


def _level_protocol(
    base: EffectiveProtocol, probe: Probe, expected_qps: float | None
) -> EffectiveProtocol:
    """`base` with the measured phase sized for the probe: its duration factor, and long
    enough that the rate expected gives the queries a P99 needs."""
    duration = base.duration_s * probe.duration_factor
    if expected_qps:
        duration = max(duration, QUERY_MARGIN * P99_MIN_QUERIES / expected_qps)
    cap = FULL_MAX_LEVEL_S if base.name == "full" else max(base.duration_s * 12, 60.0)
    duration = min(round(duration, 3), max(cap, base.duration_s))
    return dataclasses.replace(base, duration_s=duration)


def _too_short(record: RunRecord, protocol: EffectiveProtocol) -> bool:
    """Finished with too few queries for P99 at a rate that a longer level would give
    enough (and that the protocol's cap allows)."""
    if record.status != "FINISHED" or not record.qps or record.valid:
        return False
    if (record.requests or 0) >= P99_MIN_QUERIES:
        return False
    needed = QUERY_MARGIN * P99_MIN_QUERIES / record.qps
    return needed > protocol.duration_s * 1.01


def _expected_qps(probe: Probe, levels: list[Level]) -> float | None:
    """The rate a level will see: the probe's own in the open loop; in the closed loop, the
    nearest measured client count's throughput scaled by the clients (none for the first)."""
    if probe.mode == "open":
        return probe.load
    measured = [lv for lv in levels if lv.mode == "closed" and lv.achieved_qps]
    if not measured:
        return None
    nearest = min(measured, key=lambda lv: abs(lv.load - probe.load))
    return (nearest.achieved_qps or 0.0) * min(probe.load / nearest.load, 1.0)


def level_seed(base: int, position: int) -> int:
    """The workload seed of the sweep's level at `position`: its own, derived from the
    experiment's. One seed for every level would give every level the same arrival draws (and
    the synthetic target the same service draws), so an unlucky seed (arrivals that run 10%
    fast, halves that differ) would bias or fail every level alike instead of one."""
    state = np.random.SeedSequence([base, position]).generate_state(1, dtype=np.uint32)
    return int(state[0]) & SEED_MASK


def level_config(
    config: ResolvedConfig, probe: Probe, position: int | None = None
) -> ResolvedConfig:
    """The experiment's config with the sweep's load: `probe.load` clients, or that rate
    with the experiment's arrival process and in-flight limit when it has an open loop; with
    `position`, the level's own workload seed (`level_seed`)."""
    load = modes.step(config.workload.load, probe.mode, probe.load)
    update: dict[str, Any] = {"load": load}
    if position is not None:
        update["seed"] = level_seed(config.workload.seed, position)
    workload = config.workload.model_copy(update=update)
    return config.model_copy(update={"workload": workload})


class _Sweep:
    """One experiment's sweep: the loop of probes, reuse, storing."""

    def __init__(
        self,
        store: Store,
        link: Link,
        options: SweepOptions,
        progress: Progress,
        context: Context,
        on_level: Callable[[SweepOutcome], None] | None,
    ) -> None:
        self.store, self.link, self.options, self.progress = store, link, options, progress
        self.context = context
        self.on_level = on_level
        self.config = ResolvedConfig.model_validate(link.stored.config)
        self.base = base_protocol(self.config, options)
        self.settings = options.settings(self.base.max_error_rate)
        self.code = link_code(link)
        environment_id = store.record_environment(context.fingerprint, context.env_hash)
        self.sweep_id = store.create_sweep(
            experiment=link.name,
            mode=options.mode,
            slo_percentile=options.slo.percentile,
            slo_ms=options.slo.ms,
            slo_json=None if options.slo.plain else options.slo.model_dump(mode="json"),
            protocol=self.base.as_dict(),
            strategy=options.strategy(),
            environment_id=environment_id,
            code_identity=self.code,
        )
        self.outcome = SweepOutcome(
            self.sweep_id,
            link.name,
            "RUNNING",
            options.mode,
            options.slo,
            conclude([], self.settings),
            [],
            [],
            [],
            0.0,
        )
        self.reusable = self._reusable()
        self.position = 0  # the next stored level's (sizing levels included)

    def _reusable(self) -> dict[tuple[str, float], list[RunRecord]]:
        """Finished, valid levels of earlier sweeps of this config that this sweep may use,
        by loop and load, oldest sweep's first: same environment and code (chain.comparability's
        rules; a run with no environment recorded is not reused). Which of them has the
        level's protocol is asked when the level is measured (`_measure`)."""
        found: dict[tuple[str, float], list[RunRecord]] = {}
        if not self.options.reuse:
            return found
        # One query for the experiment's runs, and one comparison per environment: a level
        # reused by several sweeps is listed by each.
        runs = {r.id: r for r in self.store.list_runs(self.link.name, levels=True)}
        envs = Environments(self.store)
        comparable: dict[int, bool] = {}
        for sweep in self.store.list_sweeps(self.link.name):
            if sweep.config_hash != self.link.stored.config_hash:
                continue
            for lv in sweep.levels:
                run = runs.get(lv.run_id)
                if run is None or run.status != "FINISHED" or not run.valid:
                    continue
                if code_difference(run.code_identity, self.code) is not None:
                    continue
                if run.environment_id is None:
                    continue
                if run.environment_id not in comparable:
                    comparable[run.environment_id] = (
                        environment_difference(
                            envs.fingerprint(run.environment_id), self.context.fingerprint
                        )
                        is None
                    )
                if comparable[run.environment_id]:
                    found.setdefault((lv.mode, round(lv.load, 6)), []).append(run)
        return found

    def run(self) -> SweepOutcome:
        try:
            while (probe := next_probe(self.outcome.levels, self.settings)) is not None:
                status = self._level(probe)
                if status == "KILLED":
                    return self._finish("KILLED")
        except KeyboardInterrupt:
            self._finish("KILLED")
            raise
        except Exception as exc:
            self._finish("FAILED", error=f"{type(exc).__name__}: {exc}")
            raise
        failed = [lv for lv in self.outcome.levels if lv.failed is not None]
        if failed and len(failed) == len(self.outcome.levels):
            return self._finish(
                "FAILED", error=f"the target failed at every level: {failed[-1].failed}"
            )
        self._parent_note()
        return self._finish("FINISHED")

    def _parent_note(self) -> None:
        """A step swept alone, whose parent has no sweep to compare with: say so now, not when
        the table has a hole."""
        plan = self.link.plan
        chain = self.context.chain
        index = next((i for i, link in enumerate(chain) if link is self.link), 0)
        if self.options.chain or plan is None or index == 0:
            return
        parent = chain[index - 1]
        slo, mode = self.options.slo, self.options.mode
        for sweep in self.store.list_sweeps(parent.name):
            if (
                sweep.status == "FINISHED"
                and sweep.mode == mode
                and sweep.slo.same_as(slo)
                and same_protocol(sweep.protocol, self.base.as_dict())
            ):
                return
        self.progress.note(
            f"note: parent {parent.name!r} has no finished {mode}-loop sweep under {slo.label} "
            f"and this protocol, so the stacked table cannot compare {self.link.name}'s capacity "
            f"with it; sweep the chain with `optlab sweep {self.link.path or self.link.name} "
            f"--chain --slo {slo.key}{' --mode closed' if mode == 'closed' else ''}"
            f"{' --quick' if self.options.quick else ''}`"
        )

    def _level(self, probe: Probe) -> str:
        protocol = _level_protocol(self.base, probe, _expected_qps(probe, self.outcome.levels))
        status, record = self._measure(probe, protocol)
        longer = None
        if record is not None and _too_short(record, protocol):
            assert record.qps is not None
            longer = _level_protocol(self.base, probe, record.qps)
        if record is not None and longer is not None and longer.duration_s > protocol.duration_s:
            # The first closed level has no rate to size it by: now it has one. The short run
            # stays stored (as a "sizing" level), and the level is measured again, long enough
            # (unless the protocol's longest level is what it already had: again, as few).
            assert record.qps is not None
            self.store.relabel_level(self.sweep_id, self.position - 1, SIZING)
            self.outcome.measured_s += (record.warmup_s or 0.0) + (record.duration_s or 0.0)
            self.progress.note(
                f"sweep {self.sweep_id}: {record.requests} queries at {record.qps:,.1f}/s are too "
                f"few for P99 ({P99_MIN_QUERIES}); measuring {_describe(probe)} again, longer"
            )
            status, record = self._measure(probe, longer)
        if record is None:
            return status
        return self._add(probe, record, status == "reused")

    def _measure(self, probe: Probe, protocol: EffectiveProtocol) -> tuple[str, RunRecord | None]:
        """The level's run: reused, or measured now and stored at the next position."""
        position = self.position
        self.position += 1
        # A rate measured again is measured anew: reusing a run would only repeat its verdict.
        reused = None if probe.purpose == AGAIN else self._reuse(probe, protocol)
        if reused is not None:
            self.store.add_sweep_level(
                self.sweep_id, position, reused.id, probe.mode, probe.load, probe.purpose
            )
            self.progress.note(
                f"sweep {self.sweep_id} level {position}: {_describe(probe)} ({probe.purpose}): "
                f"reusing run {reused.id}"
            )
            return "reused", reused
        self.progress.note(
            f"sweep {self.sweep_id} level {position}: {_describe(probe)} ({probe.purpose})"
        )
        tag = SweepLevelTag(self.sweep_id, position, probe.mode, probe.load, probe.purpose)
        outcome = measure_level(
            self.store,
            self.link,
            level_config(self.config, probe, position),
            protocol,
            # The level's pace is judged against the sweep's SLO, which may differ from the
            # experiment file's (a send lag is small or not against the bound being tested).
            RunOptions(
                quick=self.options.quick, stop_when_saturated=True, slo_ms=self.options.slo.ms
            ),
            self.progress,
            self.context,
            tag,
        )
        if outcome.status == "KILLED":
            return "KILLED", None
        return outcome.status, self.store.get_run(outcome.run_id)

    def _reuse(self, probe: Probe, protocol: EffectiveProtocol) -> RunRecord | None:
        """The first reusable level at the probe's loop and load measured under this protocol
        (duration included: `same_protocol`)."""
        wanted = protocol.as_dict()
        candidates = self.reusable.get((probe.mode, round(probe.load, 6)), [])
        return next((run for run in candidates if same_protocol(run.protocol, wanted)), None)

    def _add(self, probe: Probe, record: RunRecord, reused: bool) -> str:
        windows = self.store.get_windows(record.id, "measure")
        level = level_of(record, windows, probe.mode, probe.load, self.options.slo, probe.purpose)
        out = self.outcome
        out.levels.append(level)
        out.runs.append(record.id)
        out.reused.append(reused)
        out.measured_s += 0.0 if reused else level.measured_s
        out.result = conclude(out.levels, self.settings)
        if self.on_level is not None:
            self.on_level(out)
        return record.status

    def _finish(self, status: str, error: str | None = None) -> SweepOutcome:
        out = self.outcome
        out.status = status
        out.error = error
        out.result = conclude(out.levels, self.settings)
        self.store.finish_sweep(
            self.sweep_id,
            status=status,
            result=out.result,
            measured_s=out.measured_s,
            error=error,
        )
        return out


def _describe(probe: Probe) -> str:
    if probe.mode == "closed":
        return f"{int(probe.load)} client{'s' if probe.load != 1 else ''}"
    return f"{probe.load:,.1f} requests/s"


def sweep(
    path: Any,
    store: Store,
    options: SweepOptions,
    progress: Progress,
    on_level: Callable[[SweepOutcome], None] | None = None,
    on_sweep: Callable[[SweepOutcome], None] | None = None,
) -> list[SweepOutcome]:
    """Sweep the experiment at `path` (with `options.chain`, every experiment of its chain,
    baseline first); each sweep is stored as it goes."""
    check_options(options)
    progress = GuardedProgress(progress)
    for sweep_id in store.mark_sweeps_crashed(process_alive):
        progress.note(f"sweep {sweep_id} was left RUNNING by a process that is gone: CRASHED")
    context = open_context(path, store, progress)
    links = context.chain if options.chain else [context.chain[-1]]
    outcomes = []
    for link in links:
        outcome = _Sweep(store, link, options, progress, context, on_level).run()
        outcomes.append(outcome)
        if on_sweep is not None:
            on_sweep(outcome)
        if outcome.status == "KILLED":
            break
    return outcomes
