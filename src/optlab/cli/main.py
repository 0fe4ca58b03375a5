"""The `optlab` command group, and the ONE place where errors become messages and exit codes
(docs/exit-codes.md)."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, NoReturn

import click

from optlab._version import __version__
from optlab.cli.common import silence_stdout
from optlab.errors import OptlabError

EXIT_UNEXPECTED = 1
EXIT_INTERRUPTED = 130


def interrupted(exc: BaseException) -> bool:
    """A Ctrl-C that a library turned into its own error: a KeyboardInterrupt in the chain,
    or pydantic's SchemaError, which keeps only the interrupt's name in its message (a Ctrl-C
    while a model's validator is built at import). Exit 130 for those, not "report it"."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        if type(current).__name__ == "SchemaError" and "KeyboardInterrupt" in str(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _exit_interrupted(ctx: click.Context) -> NoReturn:
    click.echo("optlab: interrupted; nothing further was written", err=True)
    ctx.exit(EXIT_INTERRUPTED)


class OptlabGroup(click.Group):
    """Renders OptlabError (exit 2 by default), Ctrl-C and unexpected failures (exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OptlabError as exc:
            click.secho(f"optlab: {exc.message}", err=True, fg="red")
            if exc.hint:
                click.echo(f"hint: {exc.hint}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            _exit_interrupted(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:
            # The reader left (`optlab log | head -1`): it had what it wanted, and whatever
            # was to be stored is stored. Quietly, and 0: under `set -o pipefail` a CI job
            # must not fail for a `| head`.
            silence_stdout()
            ctx.exit(0)
        except Exception as exc:
            if interrupted(exc):
                _exit_interrupted(ctx)
            click.secho(
                f"optlab: unexpected error: {type(exc).__name__}: {exc}", err=True, fg="red"
            )
            if os.environ.get("OPTLAB_DEBUG"):
                traceback.print_exc()
            else:
                click.echo("hint: set OPTLAB_DEBUG=1 for the traceback, and report it", err=True)
            ctx.exit(EXIT_UNEXPECTED)


@click.group(cls=OptlabGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="optlab")
@click.option(
    "--db",
    "db_url",
    envvar="OPTLAB_DB",
    default=None,
    metavar="URL",
    help="SQLAlchemy database URL [env OPTLAB_DB; default sqlite:///.optlab/optlab.db].",
)
@click.pass_context
def cli(ctx: click.Context, db_url: str | None) -> None:
    """optlab: measure serving optimisations one variable at a time.

    Experiments are YAML files: a baseline with the full config, then steps that
    each change ONE knob against their parent's stored config.
    """
    ctx.obj = {"db_url": db_url}


def _register() -> None:
    from optlab.cli import (
        bundles,
        db,
        demo,
        diagnose,
        env,
        experiments,
        knob,
        reports,
        runs,
        serve,
        sweep,
    )

    cli.add_command(env.env)
    cli.add_command(experiments.diff)
    cli.add_command(experiments.split)
    cli.add_command(runs.run)
    cli.add_command(runs.log)
    cli.add_command(sweep.sweep)
    cli.add_command(sweep.sweeps)
    cli.add_command(knob.sweep_knob)
    cli.add_command(knob.knob_sweeps)
    cli.add_command(knob.tune)
    cli.add_command(diagnose.diagnose)
    cli.add_command(db.db)
    cli.add_command(demo.demo)
    cli.add_command(serve.serve)
    cli.add_command(bundles.export)
    cli.add_command(bundles.import_)
    for command in (reports.table, reports.report, reports.audit, reports.check):
        cli.add_command(command)


_register()


def main() -> None:
    # Started with stdout or stderr closed (`optlab run X >&- 2>&-`, a daemon without a
    # terminal): Python leaves them None, and the first write would fail the command,
    # possibly mid-measurement. Output goes nowhere instead.
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    cli.main(prog_name="optlab")


if __name__ == "__main__":  # pragma: no cover
    main()
