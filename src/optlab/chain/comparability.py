"""Hidden-variable checks before a step is measured: protocol, environment and code.

A step's result means something only against a parent run measured the same way,
on the same machine and software, with the same code under test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optlab.chain.plan import render_value
from optlab.config.diff import diff_values
from optlab.config.protocol import protocol_label
from optlab.env.compare import compare_fingerprints
from optlab.errors import RefusedError

if TYPE_CHECKING:
    from optlab.config.protocol import EffectiveProtocol
    from optlab.store import RunRecord, Store, StoredConfig


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
        and r.protocol == wanted
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
    problems: list[str] = []
    for run in runs:
        problems = []
        if run.environment_id is not None:
            env = store.get_environment(run.environment_id)
            comparison = compare_fingerprints(env.fingerprint, fingerprint)
            if not comparison.comparable:
                problems.append(
                    f"the environment differs from parent run {run.id}'s:\n"
                    + "\n".join("  " + line for line in comparison.explain().splitlines())
                )
        if run.code_identity != code:
            changes = diff_values(run.code_identity, code)
            problems.append(
                f"the target's code differs from parent run {run.id}'s:\n"
                + "\n".join(
                    f"  code.{c.path}: {render_value(c.old)} -> {render_value(c.new)}"
                    for c in changes
                )
            )
        if not problems:
            return run
    raise RefusedError(
        f"parent {parent!r} has no comparable run: " + "\n".join(problems),
        hint=f"re-measure the parent here, with this code: {rerun}; then run this step",
    )
