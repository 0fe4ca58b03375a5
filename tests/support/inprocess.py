"""A run measured through the library in this process (no CLI, no subprocess): the evidence
tests read its summary directly. And the reference classifier's batched experiment, which the
pipeline and evidence tests both measure."""

from __future__ import annotations

from pathlib import Path

from optlab.chain.lineage import prepare
from optlab.cli.runs import PlainProgress
from optlab.config.models import ResolvedConfig
from optlab.config.protocol import effective_protocol
from optlab.run.measurement import RunOptions, measure
from optlab.store import RunSummary, Store

BATCHED = """\
name: ic-batched
target: {kind: builtin, name: image-classifier}
knobs:
  preprocess: numpy
  threads: 1
  batching: {mode: dynamic, max_batch_size: 8, max_wait_ms: 5}
workload:
  load: {mode: closed, concurrency: 8}
  inputs: {count: 64, size: 128}
"""


def run_file(folder: Path, path: Path, duration_s: float) -> RunSummary:
    """Measure the experiment at `path` (quick protocol, 0.3 s warmup) into
    `<folder>/optlab.db`; it must finish, and its stored evidence is the summary's."""
    store = Store.open(f"sqlite:///{folder / 'optlab.db'}")
    link = prepare(path, store).head
    config = ResolvedConfig.model_validate(link.stored.config)
    protocol = effective_protocol(config.protocol, quick=True, duration_s=duration_s, warmup_s=0.3)
    run_id = store.create_run(
        experiment=link.name,
        protocol_name=protocol.name,
        protocol=protocol.as_dict(),
        provisional=True,
        environment_id=None,
        code_identity={},
        git_commit=None,
        git_dirty=None,
    )
    options = RunOptions(quick=True)
    done = measure(store, link, config, protocol, run_id, PlainProgress(), options, [folder])
    assert done.status == "FINISHED", done.summary.reasons
    stored = store.get_run(run_id).summary  # the evidence is stored with the run
    assert stored is not None and stored.evidence == done.summary.evidence
    return done.summary
