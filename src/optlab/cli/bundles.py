"""`optlab export` and `optlab import`: runs between databases as versioned bundle files."""

from __future__ import annotations

import json
from pathlib import Path

import click

from optlab.cli.common import open_store
from optlab.errors import ConfigError


def _run_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        ids = []
    if not ids:
        raise ConfigError(
            f"--runs {text!r} is not a list of run ids", hint="for example: --runs 3,4,7"
        )
    return ids


@click.command("export")
@click.argument("head", required=False)
@click.option("--runs", "runs_text", metavar="ID,ID,...", help="Exactly these runs (by id).")
@click.option("--all", "all_runs", is_flag=True, help="Every run in the database.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The bundle file to write (JSON lines; replaced atomically).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as one JSON object.")
@click.pass_context
def export(
    ctx: click.Context,
    head: str | None,
    runs_text: str | None,
    all_runs: bool,
    output: Path,
    as_json: bool,
) -> None:
    """Write runs to a bundle file that `optlab import` stores in another database: each run
    with its chain's experiments and configs, its environment, histograms, per-second
    windows, resource samples and errors.

    HEAD exports every run of the chain from the baseline to HEAD (an experiment's name or
    its file; default the newest chain head, as `optlab table`). RUNNING runs are left out.
    """
    from optlab.store.bundle_files import export_file

    if sum((head is not None, runs_text is not None, all_runs)) > 1:
        raise ConfigError(
            "choose one of HEAD, --runs and --all",
            hint="optlab export HEAD -o runs.jsonl, or --runs 3,4, or --all",
        )
    from optlab.store.files import refuse_unsafe_target

    # Refused before reading any run: a symlink, a device, a FIFO or a folder there.
    refuse_unsafe_target(output, "a run bundle")
    store = open_store(ctx, read_only=True)
    if runs_text is not None:
        result = export_file(store, output, run_ids=_run_ids(runs_text))
    elif all_runs:
        result = export_file(store, output)
    else:
        from optlab.reports.chain import chain_names, resolve_head

        names = chain_names(store, resolve_head(store, head))
        result = export_file(store, output, experiments=names)
    if as_json:
        payload = {
            "schema_version": 1,
            "path": str(result.path),
            "runs": [
                {"run_id": r.id, "uid": r.uid, "experiment": r.experiment, "status": r.status}
                for r in result.runs
            ],
            "left_out": [
                {"run_id": r.id, "uid": r.uid, "status": r.status} for r in result.left_out
            ],
        }
        click.echo(json.dumps(payload))
        return
    for run in result.runs:
        click.echo(f"run {run.id} {run.experiment}: {run.status} (uid {run.uid})")
    for run in result.left_out:
        click.echo(f"left out run {run.id} {run.experiment}: still RUNNING", err=True)
    sweeps = store.list_sweeps()
    if sweeps:
        levels = len({lv.run_id for sweep in sweeps for lv in sweep.levels})
        click.echo(
            f"left out {len(sweeps)} sweep{'' if len(sweeps) == 1 else 's'} and their {levels} "
            "level runs: bundles do not carry sweeps yet (sweep again in the other database)",
            err=True,
        )
    count = len(result.runs)
    click.echo(f"wrote {count} run{'' if count == 1 else 's'} to {result.path}")


@click.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print what was stored as one JSON object.")
@click.pass_context
def import_(ctx: click.Context, files: tuple[Path, ...], as_json: bool) -> None:
    """Store the runs of bundle files written by `optlab export` (or kept pending under
    .optlab/pending/). A run already stored is skipped, so importing twice adds nothing; a
    run stored RUNNING or CRASHED is completed from the bundle. An experiment name stored
    here with another config or parent is refused (exit 2) and nothing is written.

    Every run is checked as if it were measured here (docs/bundles.md): names, numbers and
    config hashes, and its figures against its histograms. One bad run refuses the whole
    import (exit 2, naming the file, line, run and field): nothing is stored.
    """
    from optlab.run.imported import check_all
    from optlab.store.bundle_files import read_bundles

    # Read and check every run first (a bad one refuses the whole import), and before
    # storing pending runs (open_store), which moves a pending file named here.
    bundles = read_bundles(files)
    check_all(bundles)
    results = open_store(ctx).import_bundles(bundles)
    counts = {
        action: sum(r.action == action for r in results)
        for action in ("imported", "completed", "skipped")
    }
    if as_json:
        runs = [
            {"uid": r.run_uid, "run_id": r.run_id, "experiment": r.experiment, "action": r.action}
            for r in results
        ]
        click.echo(json.dumps({"schema_version": 1, "runs": runs, **counts}))
        return
    for r in results:
        note = ", already stored" if r.action == "skipped" else ""
        click.echo(f"run {r.run_id} {r.experiment}: {r.action}{note} (uid {r.run_uid})")
    click.echo(
        f"{len(results)} run{'' if len(results) == 1 else 's'}: {counts['imported']} imported, "
        f"{counts['completed']} completed, {counts['skipped']} skipped"
    )
