"""Capacity under an SLO as a column of the stacked table: which sweep stands for each step,
and how much capacity each step bought, against its parent and against the baseline.

Which sweep. One SLO for the whole table (`optlab table --slo`, else the SLO of the head's
newest finished sweep). A step's sweep counts only when it FINISHED under that SLO, of the
step's current config, with the same loop (open or closed) and base protocol as the chain's
reference sweep, on an environment comparable with the reference sweep's (the one rule of
`chain.comparability`, `same_protocol` and `environment_difference`, by which a chain step's
parent run is checked). The reference sweep is the head's newest such sweep, else the chain's
newest; it fixes loop, protocol and environment, as the head's newest run does for the runs'
columns. The newest sweep that counts stands for the step; a step without one says why.

Significance. A sweep stores its capacity's 95% interval (`sweep.strategy` says how). Its
standard error is taken as the interval's half-width / 1.96. A change of capacity is a ratio,
judged on the log scale like the runs' changes (`metrics.stats`): the standard error of ln
capacity is se / capacity (the delta method), two sweeps are independent measurements, so
the log ratio's standard error is sqrt((se_b/b)² + (se_a/a)²), and its interval at the
table's confidence, exp(ln(a/b) -+ z se) - 1 in percent, never crosses -100%. The change is
beyond noise by the same test as the runs' (`metrics.stats.beyond_noise`: the interval on one
side of zero, at least 1%). A capacity with no interval (a sweep that never bracketed it) is
not judged. Capacity is its own question with its own verdict (`capacity_verdict`: gain,
within noise, regressed), never the run's: a step can gain capacity within the noise of its
QPS at one load, or the other way round.

The loop. An open loop's capacity (a rate it sustains) and a closed loop's (the throughput
of N clients) are different quantities; every sweep of the column shares the reference
sweep's loop, named in the table header's `capacity.loop` and each row's `capacity_loop`.

Δ step is against the parent (the row before), Δ cum against the baseline (the first row):
never against a step further up, whose sweep measured a different change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from optlab.chain.comparability import Environments, environment_difference, same_protocol
from optlab.config.protocol import protocol_label
from optlab.config.slo import Slo
from optlab.metrics.change import percent_change
from optlab.metrics.stats import beyond_noise, ratio_interval
from optlab.reports.stacked import CapacitySlo, StepCapacityRow

if TYPE_CHECKING:
    from optlab.reports.stacked import StackedTable, TableRow
    from optlab.store import Store, SweepRecord

__all__ = [
    "SWEEP_CONFIDENCE",
    "Capacity",
    "Change",
    "StepCapacity",
    "SweepChoice",
    "add_capacity",
    "capacity_of",
    "capacity_row",
    "capacity_verdict",
    "change",
    "choose_sweeps",
    "default_slo",
    "most_headroom",
    "stack_capacity",
]

FINISHED = "FINISHED"
SWEEP_CONFIDENCE = 0.95  # the level of a sweep's stored capacity interval
_SWEEP_Z = NormalDist().inv_cdf(0.5 + SWEEP_CONFIDENCE / 2)


@dataclass(frozen=True)
class SweepChoice:
    """The sweep that stands for one step, or why none does."""

    experiment: str
    sweep: SweepRecord | None
    reason: str | None = None


@dataclass(frozen=True)
class Capacity:
    """What one step's sweep found: requests/s under the SLO and its 95% interval."""

    qps: float | None
    interval: tuple[float, float] | None = None
    knee_qps: float | None = None

    @property
    def se(self) -> float | None:
        """Standard error: the interval's half-width over 1.96 (None without an interval)."""
        if self.interval is None:
            return None
        low, high = self.interval
        return max(high - low, 0.0) / 2.0 / _SWEEP_Z


@dataclass(frozen=True)
class Change:
    """A capacity change in percent of the earlier capacity, its interval at the table's
    confidence, and whether it is beyond noise (None: not judged, an interval is missing)."""

    pct: float
    low_pct: float | None
    high_pct: float | None
    significant: bool | None


@dataclass(frozen=True)
class StepCapacity:
    experiment: str
    capacity: Capacity | None  # None: no sweep stands for the step (`reason` says why)
    sweep_id: int | None
    step: Change | None  # against the parent
    cumulative: Change | None  # against the baseline
    reason: str | None  # why the capacity, or a change, is missing
    loop: str | None = None  # "open" or "closed": the sweep's loop


def _newest_finished(sweeps: Sequence[SweepRecord]) -> SweepRecord | None:
    finished = [s for s in sweeps if s.status == FINISHED]
    return max(finished, key=lambda s: s.id) if finished else None


def default_slo(store: Store, names: Sequence[str]) -> Slo | None:
    """The SLO of the head's (last name's) newest finished sweep; else of the chain's newest,
    so that a head not swept yet says so under the SLO its chain was swept by. None when
    nothing in the chain was swept."""
    if not names:
        return None
    newest = _newest_finished(store.list_sweeps(names[-1]))
    if newest is None:
        newest = _newest_finished([s for name in names for s in store.list_sweeps(name)])
    return None if newest is None else newest.slo


def capacity_of(sweep: SweepRecord) -> Capacity:
    result = sweep.result
    if result is None:
        return Capacity(qps=None, interval=None, knee_qps=None)
    return Capacity(
        qps=result.capacity_qps, interval=result.capacity_interval, knee_qps=result.knee_qps
    )


def _same_slo(sweep: SweepRecord, slo: Slo) -> bool:
    return slo.same_as(sweep.slo)


def _sweep_command(path: str | None, name: str, slo: Slo, like: SweepRecord | None) -> str:
    """The command that would sweep the step as `like` (the chain's reference sweep, else its
    newest) was swept: its loop and its protocol's length."""
    extra = ""
    if like is not None:
        extra += " --mode closed" if like.mode == "closed" else ""
        extra += " --quick" if like.protocol.get("name") == "quick" else ""
    return f"`optlab sweep {path or name} --slo {slo.key}{extra}`"


def choose_sweeps(store: Store, names: Sequence[str], slo: Slo) -> list[SweepChoice]:
    """For each step (baseline first), the newest sweep that counts under `slo`, or why none
    does (module docstring)."""
    envs = Environments(store)
    hashes: dict[str, str | None] = {}
    paths: dict[str, str | None] = {}
    for name in names:
        record = store.get_experiment(name)
        config = record.current_config if record else None
        hashes[name] = config.config_hash if config else None
        paths[name] = config.source_path if config else None
    swept = {name: store.list_sweeps(name) for name in names}
    candidates = {
        name: sorted(
            (
                s
                for s in swept[name]
                if s.status == FINISHED and _same_slo(s, slo) and s.config_hash == hashes[name]
            ),
            key=lambda s: s.id,
            reverse=True,
        )
        for name in names
    }
    reference = None
    if names and candidates[names[-1]]:
        reference = candidates[names[-1]][0]
    elif any(candidates.values()):
        reference = max((s for c in candidates.values() for s in c), key=lambda s: s.id)
    reference_fp = envs.fingerprint(reference.environment_id) if reference else None
    like = reference or _newest_finished([s for name in names for s in swept[name]])
    choices = []
    for name in names:
        command = _sweep_command(paths[name], name, slo, like)
        found = candidates[name]
        if not found or reference is None:
            why = _unswept(swept[name], hashes[name], slo, command)
            choices.append(SweepChoice(name, None, why))
            continue
        choices.append(_choose_one(name, found, reference, reference_fp, envs, command))
    return choices


def _choose_one(
    name: str,
    found: Sequence[SweepRecord],
    reference: SweepRecord,
    reference_fp: dict[str, Any] | None,
    envs: Environments,
    command: str,
) -> SweepChoice:
    """The newest of `found` (a step's sweeps under the SLO, newest first) that the chain's
    reference sweep can stand beside, or why none can."""
    # An open loop's capacity (a rate it sustains) and a closed loop's (the throughput of
    # N clients) are different quantities: the reference sweep's loop fixes which.
    same_loop = [s for s in found if s.mode == reference.mode]
    if not same_loop:
        return SweepChoice(
            name,
            None,
            f"swept only with a {found[0].mode} loop (the chain's reference sweep "
            f"{reference.id} is {reference.mode}-loop): run {command}",
        )
    measured_alike = [s for s in same_loop if same_protocol(s.protocol, reference.protocol)]
    if not measured_alike:
        return SweepChoice(
            name,
            None,
            f"swept under another protocol ({protocol_label(found[0].protocol)}; the "
            f"chain's reference sweep {reference.id} is under "
            f"{protocol_label(reference.protocol)}): run {command}",
        )
    first_difference = ""
    for sweep in measured_alike:
        difference = environment_difference(reference_fp, envs.fingerprint(sweep.environment_id))
        if difference is None:
            return SweepChoice(name, sweep)
        first_difference = first_difference or difference.splitlines()[0]
    return SweepChoice(
        name,
        None,
        f"swept in a materially different environment from reference sweep "
        f"{reference.id}'s ({first_difference}): re-sweep it here with {command}",
    )


def _unswept(sweeps: Sequence[SweepRecord], config_hash: str | None, slo: Slo, command: str) -> str:
    """Why a step has no finished sweep of its current config under `slo`."""
    current = [s for s in sweeps if s.config_hash == config_hash]
    under = [s for s in current if _same_slo(s, slo)]
    if under:
        newest = max(under, key=lambda s: s.id)
        return f"its sweep {newest.id} under {slo.label} is {newest.status}: run {command}"
    others = sorted({s.slo.label for s in current if s.status == FINISHED})
    if others:
        return f"swept under {', '.join(others)}, not under {slo.label}: run {command}"
    if any(_same_slo(s, slo) and s.status == FINISHED for s in sweeps):
        return f"its sweeps under {slo.label} are of an older config: run {command}"
    return f"no sweep under {slo.label}: run {command}"


def change(before: Capacity, after: Capacity, confidence: float) -> Change | None:
    """`after` against `before` (module docstring: the log-scale interval and the test);
    None when a side has no capacity, or `before`'s is zero."""
    pct = percent_change(before.qps, after.qps)
    if pct is None or before.qps is None or after.qps is None:
        return None
    se_before, se_after = before.se, after.se
    if se_before is None or se_after is None or before.qps <= 0 or after.qps <= 0:
        return Change(pct, None, None, None)
    se = math.hypot(se_before / before.qps, se_after / after.qps)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    _, low, high = ratio_interval(math.log(after.qps / before.qps), z * se)
    return Change(pct, low, high, beyond_noise(pct, low, high))


def capacity_verdict(step: Change | None) -> str | None:
    """The capacity question's own verdict on a Δ step: gain, within noise or regressed;
    "not judged" without an interval; None without a Δ."""
    if step is None:
        return None
    if step.significant is None:
        return "not judged"
    if not step.significant:
        return "within noise"
    return "gain" if step.pct > 0 else "regressed"


def _no_capacity(choice: SweepChoice) -> str:
    """Why a chosen sweep still gives no capacity, or why there is no sweep."""
    if choice.sweep is None:
        return choice.reason or "no sweep"
    message = choice.sweep.result.message if choice.sweep.result else None
    return f"sweep {choice.sweep.id} found no capacity" + (f": {message}" if message else "")


def stack_capacity(
    choices: Sequence[SweepChoice], slo: Slo, confidence: float
) -> list[StepCapacity]:
    """Each step's capacity, its change against its parent and the baseline, and why
    anything is missing. Pure: the sweeps are already chosen."""
    capacities = [capacity_of(c.sweep) if c.sweep is not None else None for c in choices]
    measured = [cap if cap is not None and cap.qps is not None else None for cap in capacities]
    steps: list[StepCapacity] = []
    for index, choice in enumerate(choices):
        here = measured[index]
        reasons: list[str] = []
        step = cumulative = None
        if here is None:
            reasons.append(_no_capacity(choice))
        elif index > 0:
            parent, base = measured[index - 1], measured[0]
            if parent is None:
                reasons.append(
                    f"no Δ step: parent {choices[index - 1].experiment} has no capacity under "
                    f"{slo.label} here"
                )
            else:
                step = change(parent, here, confidence)
            if base is None:
                reasons.append(
                    f"no Δ cum: baseline {choices[0].experiment} has no capacity under "
                    f"{slo.label} here"
                )
            else:
                cumulative = change(base, here, confidence)
            if here.interval is None and (step is not None or cumulative is not None):
                reasons.append("not judged: its sweep gives no interval")
        steps.append(
            StepCapacity(
                experiment=choice.experiment,
                capacity=capacities[index],
                sweep_id=choice.sweep.id if choice.sweep is not None else None,
                step=step,
                cumulative=cumulative,
                reason="; ".join(reasons) or None,
                loop=choice.sweep.mode if choice.sweep is not None else None,
            )
        )
    return steps


def capacity_row(step: StepCapacity) -> StepCapacityRow:
    """A step's capacity cells of the table."""
    cap = step.capacity
    interval = cap.interval if cap is not None else None
    cells: dict[str, Any] = {
        "capacity_qps": cap.qps if cap is not None else None,
        "capacity_low_qps": interval[0] if interval else None,
        "capacity_high_qps": interval[1] if interval else None,
        "capacity_knee_qps": cap.knee_qps if cap is not None else None,
        "capacity_sweep_id": step.sweep_id,
        "capacity_reason": step.reason,
    }
    for kind, found in (("step", step.step), ("cumulative", step.cumulative)):
        cells[f"capacity_{kind}_pct"] = found.pct if found else None
        cells[f"capacity_{kind}_low_pct"] = found.low_pct if found else None
        cells[f"capacity_{kind}_high_pct"] = found.high_pct if found else None
    cells["capacity_significant"] = step.step.significant if step.step else None
    cells["capacity_cumulative_significant"] = (
        step.cumulative.significant if step.cumulative else None
    )
    cells["capacity_verdict"] = capacity_verdict(step.step)
    cells["capacity_loop"] = step.loop
    return StepCapacityRow(**cells)


def add_capacity(
    table: StackedTable, store: Store, slo: Slo | None, confidence: float
) -> StackedTable:
    """The table with each step's capacity and the header's `capacity` SLO, its rows'
    experiments taken as the chain; unchanged when there is no SLO (`slo` None and nothing in
    the chain was swept)."""
    names = [row.experiment for row in table.rows]
    slo = slo or default_slo(store, names)
    if slo is None:
        return table
    choices = choose_sweeps(store, names, slo)
    steps = stack_capacity(choices, slo, confidence)
    protocols = [c.sweep.protocol for c in choices if c.sweep is not None]
    loops = [c.sweep.mode for c in choices if c.sweep is not None]
    capacity = CapacitySlo(
        slo=slo,
        # The chosen sweeps' base protocol (they share it), which may differ from the runs'.
        protocol_label=protocol_label(protocols[0]) if protocols else None,
        # The chosen sweeps' loop (they share it): an open loop's capacity is a rate it
        # sustains, a closed loop's the throughput of N clients.
        loop=loops[0] if loops else None,  # a SweepRecord's mode: open or closed
    )
    rows = tuple(
        row.model_copy(update={"capacity": capacity_row(step)})
        for row, step in zip(table.rows, steps, strict=True)
    )
    return table.model_copy(
        update={"header": table.header.model_copy(update={"capacity": capacity}), "rows": rows}
    )


def most_headroom(rows: Sequence[TableRow]) -> tuple[int, float] | None:
    """(index, requests/s) of the step whose own capacity gain, against its parent, is the
    largest; None when no step has a positive one. `rows`: the table's rows."""
    best: tuple[int, float] | None = None
    for index in range(1, len(rows)):
        before, after = rows[index - 1].get("capacity_qps"), rows[index].get("capacity_qps")
        if not _number(before) or not _number(after):
            continue
        if not _number(rows[index].get("capacity_step_pct")):
            continue
        gained = float(after) - float(before)
        if gained > 0 and (best is None or gained > best[1]):
            best = (index, gained)
    return best


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
