"""`optlab run`: check the plan and the parent run, then measure (ancestors first with
`--chain`), `--repeats` times, or `--paired N` times alternating parent and step (A B A B ...).
One measurement's lifecycle lives in `optlab.run.measurement` (`measure`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from optlab.chain.comparability import comparable_run
from optlab.chain.lineage import Link, prepare
from optlab.config.models import ResolvedConfig
from optlab.config.protocol import EffectiveProtocol, effective_protocol
from optlab.env.collect import collect_fingerprint
from optlab.env.compare import material_hash
from optlab.errors import OptlabError, RefusedError
from optlab.run.fingerprint import hosts_section
from optlab.run.measurement import RunOptions, measure
from optlab.run.progress import GuardedProgress, LiveStatus, Progress
from optlab.store import RunRecord, RunSummary, Store, SweepLevelTag
from optlab.targets.identity import code_identity
from optlab.targets.registry import kind_of
from optlab.targets.service_env import service_environment
from optlab.targets.templates import check_environment

__all__ = [
    "Context",
    "LiveStatus",
    "Progress",
    "RunOptions",
    "RunOutcome",
    "link_code",
    "measure_in_block",
    "measure_level",
    "open_context",
    "run",
]

STALE_HEARTBEAT_S = 60.0
PID_CLOCK_SLACK_S = 2.0  # process start times are read from /proc in clock ticks


@dataclass
class RunOutcome:
    run_id: int
    experiment: str
    status: str
    summary: RunSummary
    parent_run: RunRecord | None = None
    notes: list[str] = field(default_factory=list)
    # Measured, but the database refused it: the bundle that holds the whole run until the
    # next optlab command that opens the database stores it.
    pending: Path | None = None
    unstored: str | None = None  # neither stored nor pending (no disk would take it): why


def _paths(link: Link) -> list[Path]:
    if link.path is not None:
        folder = link.path.resolve().parent
    else:
        folder = Path(link.stored.source_path).parent
    return [folder, Path.cwd()] if folder != Path.cwd() else [folder]


def _config_and_protocol(
    link: Link, options: RunOptions
) -> tuple[ResolvedConfig, EffectiveProtocol]:
    config = ResolvedConfig.model_validate(link.stored.config)
    protocol = effective_protocol(
        config.protocol,
        quick=options.quick,
        duration_s=options.duration_s,
        warmup_s=options.warmup_s,
        until_queries=True,
        max_duration_s=options.max_duration_s,
    )
    return config, protocol


@dataclass(frozen=True)
class Context:
    """What every measurement of one command shares: the chain (baseline first, plans
    checked), this machine's fingerprint and its material hash."""

    chain: list[Link]
    fingerprint: dict[str, Any]
    env_hash: str


def open_context(path: Path, store: Store, progress: Progress) -> Context:
    """Runs left RUNNING by dead processes marked CRASHED, the chain prepared (the
    one-variable rule), the environment fingerprinted (a command target's interpreter too)."""
    crashed = store.mark_crashed(STALE_HEARTBEAT_S, pid_alive=process_alive)
    for run_id in crashed:
        progress.note(f"run {run_id} was left RUNNING by a process that is gone: marked CRASHED")
    prepared = prepare(path, store)
    fingerprint = collect_fingerprint(data_dir=Path.cwd(), repo_dir=path.resolve().parent)
    chain = prepared.chain
    # A command target's service runs in an interpreter of its own: part of the environment.
    service = service_environment(chain[0].stored.config.get("target", {}), _paths(chain[0])[0])
    if service is not None:
        fingerprint["service"] = service
    # Load sent from a Ray cluster: its node set and their environments are part of it.
    hosts = hosts_section(chain[0].stored.config.get("workload"))
    if hosts is not None:
        fingerprint["hosts"] = hosts
    return Context(chain, fingerprint, material_hash(fingerprint))


def link_code(link: Link) -> dict[str, Any]:
    """The code identity of `link`'s target as it is on disk now."""
    config = ResolvedConfig.model_validate(link.stored.config)
    return code_identity(config.target.model_dump(mode="json"), _paths(link))


def _preflight(link: Link, config: ResolvedConfig) -> None:
    # A secret the target needs and the environment lacks: refused before a run row exists.
    check_environment(config.target, str(link.path or link.name))
    kind_of(config.target).preflight(config, str(link.path or link.name))


def measure_level(
    store: Store,
    link: Link,
    config: ResolvedConfig,
    protocol: EffectiveProtocol,
    options: RunOptions,
    progress: Progress,
    context: Context,
    level: SweepLevelTag,
) -> RunOutcome:
    """One level of a sweep: `link` measured under `config` (its load set by the sweep) and
    `protocol`, stored as a run tagged with `level`."""
    _preflight(link, config)
    code = link_code(link)
    run_id = _start_run(
        store, link, protocol, code, context.fingerprint, context.env_hash, progress, level
    )
    measured = measure(store, link, config, protocol, run_id, progress, options, _paths(link))
    return RunOutcome(
        run_id,
        link.name,
        measured.status,
        measured.summary,
        pending=measured.pending,
        unstored=measured.unstored,
    )


def measure_in_block(
    store: Store,
    link: Link,
    options: RunOptions,
    progress: Progress,
    context: Context,
    tag: dict[str, Any],
) -> RunOutcome:
    """One arm of a block (`optlab sweep-knob`): `link` measured and stored as a normal run
    whose summary carries the block's `paired` tag ({"session", "index", "role"}), so the
    table compares a promoted value with the parent block by block. No parent run is asked
    for: every arm of the sweep is measured by this one command, on this environment and
    code, and their comparison is the sweep's, not the runner's."""
    return _measure_link(
        store, link, None, options, progress, context.fingerprint, context.env_hash, tag
    )


def _measure_link(
    store: Store,
    link: Link,
    parent: Link | None,
    options: RunOptions,
    progress: Progress,
    fingerprint: dict[str, Any],
    env_hash: str,
    paired: dict[str, Any] | None = None,
) -> RunOutcome:
    config, protocol = _config_and_protocol(link, options)
    paths = _paths(link)
    code = code_identity(config.target.model_dump(mode="json"), paths)
    _preflight(link, config)
    parent_run = None
    if parent is not None:
        # Refuse before anything expensive: no target is built, no row written.
        parent_run = comparable_run(
            store,
            parent.name,
            parent.stored,
            protocol,
            fingerprint,
            code,
            str(parent.path) if parent.path is not None else None,
        )
    run_id = _start_run(store, link, protocol, code, fingerprint, env_hash, progress)
    measured = measure(
        store,
        link,
        config,
        protocol,
        run_id,
        progress,
        options,
        paths,
        parent_run=parent_run,
        paired=paired,
    )
    return RunOutcome(
        run_id,
        link.name,
        measured.status,
        measured.summary,
        parent_run,
        pending=measured.pending,
        unstored=measured.unstored,
    )


def _start_run(
    store: Store,
    link: Link,
    protocol: EffectiveProtocol,
    code: dict[str, Any],
    fingerprint: dict[str, Any],
    env_hash: str,
    progress: Progress,
    level: SweepLevelTag | None = None,
) -> int:
    """The run's row, RUNNING from here on: a failure after this leaves it FAILED."""
    environment_id = store.record_environment(fingerprint, env_hash)
    git = (fingerprint.get("provenance") or {}).get("git") or {}
    plan = link.plan
    run_id = store.create_run(
        experiment=link.name,
        protocol_name=protocol.name,
        protocol=protocol.as_dict(),
        provisional=protocol.provisional,
        environment_id=environment_id,
        code_identity=code,
        git_commit=git.get("commit"),
        git_dirty=git.get("dirty"),
        repeat=bool(plan is not None and plan.repeat),
        level=level,
    )
    progress.note(
        f"run {run_id}: {link.name} ({protocol.name} protocol"
        f"{', PROVISIONAL' if protocol.provisional else ''}; warmup "
        f"{'until stable' if protocol.warmup == 'stable' else f'{protocol.warmup_s:g} s'}, "
        f"measure {protocol.duration_s:g} s"
        + (
            f", longer until {protocol.min_queries} queries, at most {protocol.max_duration_s:g} s)"
            if protocol.min_queries and protocol.max_duration_s
            else ")"
        )
    )
    return run_id


def process_alive(pid: int, started_at: datetime) -> bool:
    """True when `pid` is a live process that existed when the run started: a pid reused by
    a later process does not keep a dead run RUNNING."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created = float(process.create_time())
    except (psutil.NoSuchProcess, ValueError):
        return False
    except psutil.AccessDenied:  # another user's process: it exists, its age is unknown
        return True
    return created <= started_at.timestamp() + PID_CLOCK_SLACK_S


def _needs_run(store: Store, link: Link, options: RunOptions, fingerprint: dict[str, Any]) -> bool:
    """True when `link` has no valid run this chain can build on (same protocol, env, code)."""
    config, protocol = _config_and_protocol(link, options)
    code = code_identity(config.target.model_dump(mode="json"), _paths(link))
    try:
        comparable_run(store, link.name, link.stored, protocol, fingerprint, code, None)
    except RefusedError:
        return True
    return False


def run(
    path: Path,
    store: Store,
    options: RunOptions,
    progress: Progress,
    on_outcome: Callable[[RunOutcome], None] | None = None,
    *,
    paired: int = 0,
) -> list[RunOutcome]:
    """Check the plan, then measure (ancestors first with `chain`), `repeats` times.

    ``paired`` > 0 measures the head's parent and the head alternately, that many times each
    (A B A B ...): each is a normal stored run whose summary carries
    ``paired = {"session", "index", "role": "parent" | "step"}``, so that the table can compare
    them pair by pair and a slow drift of a shared machine cancels in the differences.
    """
    _check_counts(options, paired)
    progress = GuardedProgress(progress)
    context = open_context(path, store, progress)
    chain, fingerprint, env_hash = context.chain, context.fingerprint, context.env_hash
    todo, tags = _schedule(store, chain, options, fingerprint, paired)
    outcomes = []
    for (link, parent), tag in zip(todo, tags, strict=True):
        outcome = _measure_link(store, link, parent, options, progress, fingerprint, env_hash, tag)
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
        if outcome.status == "KILLED":
            break
        usable = outcome.status == "FINISHED" and outcome.summary.valid
        if not usable and link is not chain[-1]:
            raise RefusedError(
                f"{link.name}'s run {outcome.run_id} is {outcome.status}"
                f"{'' if outcome.summary.valid else ' and INVALID'}; the chain stops here",
                hint=f"see its reasons with `optlab --db {store.url} log {link.name}`; fix "
                "them and run again",
            )
    return outcomes


def _check_counts(options: RunOptions, paired: int) -> None:
    if options.repeats < 1:
        raise OptlabError("--repeats must be at least 1", hint="leave it out to measure once")
    if paired < 0:
        raise OptlabError("--paired must be at least 1", hint="leave it out to measure once")
    if paired and options.repeats > 1:
        raise OptlabError(
            "--paired and --repeats both ask for several runs",
            hint="use --paired N alone: it measures the parent and the step N times each",
        )


def _schedule(
    store: Store,
    chain: list[Link],
    options: RunOptions,
    fingerprint: dict[str, Any],
    paired: int,
) -> tuple[list[tuple[Link, Link | None]], list[dict[str, Any] | None]]:
    """The runs to measure in order, each (experiment, its parent), and each one's `paired`
    tag: ancestors without a usable run first (`chain`), then the head, or A B A B."""
    todo: list[tuple[Link, Link | None]] = []
    if options.chain:
        for index, link in enumerate(chain[:-1]):
            parent = chain[index - 1] if index > 0 else None
            if link.plan is not None and _needs_run(store, link, options, fingerprint):
                todo.append((link, parent))
    head_parent = chain[-2] if len(chain) > 1 else None
    tags: list[dict[str, Any] | None] = [None] * len(todo)
    if paired:
        if head_parent is None:
            raise RefusedError(
                f"{chain[-1].name} is a baseline: --paired alternates a step with its parent",
                hint="run a step (an experiment with a parent) with --paired",
            )
        session = uuid.uuid4().hex
        grandparent = chain[-3] if len(chain) > 2 else None
        for index in range(paired):
            todo += [(head_parent, grandparent), (chain[-1], head_parent)]
            tags += [
                {"session": session, "index": index, "role": role} for role in ("parent", "step")
            ]
    else:
        todo += [(chain[-1], head_parent)] * options.repeats
        tags += [None] * options.repeats
    return todo, tags
