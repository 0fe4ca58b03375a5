"""Hidden-variable checks: protocol, environment and code, the one definition of "comparable".

A step's result means something only against a parent run measured the same way, on the
same machine and software, with the same code under test; a sweep reuses a level, and a table
stacks a run or a capacity, by the same three rules (`same_protocol`,
`environment_difference`, `code_difference`). Before a step is measured, `comparable_run`
finds its parent's run or refuses saying what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from optlab.chain.plan import render_value
from optlab.config.diff import diff_values
from optlab.config.protocol import protocol_label
from optlab.env.compare import compare_fingerprints
from optlab.errors import RefusedError

if TYPE_CHECKING:
    from optlab.config.protocol import EffectiveProtocol
    from optlab.store import EnvironmentRecord, RunRecord, Store, StoredConfig

__all__ = [
    "NO_ENVIRONMENT",
    "Environments",
    "code_difference",
    "comparable_run",
    "environment_difference",
    "protocol_key",
    "same_protocol",
    "valid_runs",
]

# Why two environments cannot be told comparable: one of them was never recorded.
NO_ENVIRONMENT = "no environment recorded"


# Fields that do not change how a valid run was measured: `provisional` follows from the
# others (`EffectiveProtocol.provisional`); `max_duration_s`, the cap on a quick run that
# measures until its P99's queries, only decides whether a slow target's run ends INVALID
# (short of them) -- every valid run under any cap measured its duration, then until the
# queries. Runs stored under the earlier 30 s cap so stay comparable with today's.
NOT_COMPARED = frozenset({"provisional", "max_duration_s"})


def protocol_key(protocol: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A stored protocol as a key: its items, sorted, without the NOT_COMPARED ones. Values
    are kept as they are (a nested value is compared, never hashed)."""
    return tuple(sorted((k, v) for k, v in protocol.items() if k not in NOT_COMPARED))


def same_protocol(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Measured the same way: every protocol field equal (NOT_COMPARED aside)."""
    return protocol_key(a) == protocol_key(b)


def environment_difference(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str | None:
    """None when the two environments are materially the same (`env.compare`), or when
    neither was recorded; else why not, one line per difference (`NO_ENVIRONMENT` when only
    one was recorded)."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        return NO_ENVIRONMENT
    comparison = compare_fingerprints(a, b)
    if comparison.comparable:
        return None
    return comparison.explain() or "material fields differ"


def code_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """None when the code under test is the same; else one `code.<path>: old -> new` line per
    difference."""
    if a == b:
        return None
    return "\n".join(
        f"code.{c.path}: {render_value(c.old)} -> {render_value(c.new)}" for c in diff_values(a, b)
    )


class Environments:
    """Environment records by id, each read from the store once."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cache: dict[int, EnvironmentRecord] = {}

    def record(self, environment_id: int | None) -> EnvironmentRecord | None:
        if environment_id is None:
            return None
        if environment_id not in self.cache:
            self.cache[environment_id] = self.store.get_environment(environment_id)
        return self.cache[environment_id]

    def fingerprint(self, environment_id: int | None) -> dict[str, Any] | None:
        found = self.record(environment_id)
        return None if found is None else found.fingerprint


def valid_runs(
    store: Store, experiment: str, config: StoredConfig, protocol: EffectiveProtocol
) -> list[RunRecord]:
    """Valid FINISHED runs of the experiment's current config under this protocol, newest first."""
    wanted = protocol.as_dict()
    runs = [
        r
        for r in store.list_runs(experiment)
        if r.status == "FINISHED"
        and r.valid
        and r.config_hash == config.config_hash
        and same_protocol(r.protocol, wanted)
    ]
    return list(reversed(runs))


def comparable_run(
    store: Store,
    parent: str,
    parent_config: StoredConfig,
    protocol: EffectiveProtocol,
    fingerprint: dict[str, Any],
    code: dict[str, Any],
    parent_file: str | None,
) -> RunRecord:
    """The parent run this step will be compared with, or a refusal saying how to get one."""
    rerun = f"`optlab run {parent_file or parent}{' --quick' if protocol.name == 'quick' else ''}`"
    runs = valid_runs(store, parent, parent_config, protocol)
    if not runs:
        others = [r for r in store.list_runs(parent) if r.config_hash == parent_config.config_hash]
        seen = sorted({protocol_label(r.protocol, warmup=True) for r in others if r.valid})
        detail = f"; its valid runs are under: {', '.join(seen)}" if seen else ""
        wanted = protocol_label(protocol.as_dict(), warmup=True)
        raise RefusedError(
            f"parent {parent!r} has no valid run under the {wanted} protocol{detail}",
            hint=f"measure the parent first with {rerun}, or run this step with --chain",
        )
    envs = Environments(store)
    problems: list[str] = []
    for run in runs:
        problems = []
        # A parent run stored without an environment (an old bundle's) is not held against.
        parent_env = envs.fingerprint(run.environment_id)
        if parent_env is not None:
            env_differs = environment_difference(parent_env, fingerprint)
            if env_differs is not None:
                problems.append(
                    f"the environment differs from parent run {run.id}'s:\n" + _indent(env_differs)
                )
        code_differs = code_difference(run.code_identity, code)
        if code_differs is not None:
            problems.append(
                f"the target's code differs from parent run {run.id}'s:\n" + _indent(code_differs)
            )
        if not problems:
            return run
    raise RefusedError(
        f"parent {parent!r} has no comparable run: " + "\n".join(problems),
        hint=f"re-measure the parent here, with this code: {rerun}; then run this step",
    )


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
