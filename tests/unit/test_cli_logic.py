"""The command group itself: its version, help text on every command (no database), and how
an error that wraps a Ctrl-C exits."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from pydantic_core import SchemaError

from optlab._version import __version__
from optlab.cli.main import OptlabGroup, cli, interrupted


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_every_command_has_help_text() -> None:
    def walk(command: click.Command, path: str) -> list[tuple[str, click.Command]]:
        found = [(path, command)]
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                found += walk(sub, f"{path} {name}")
        return found

    commands = walk(cli, "optlab")
    assert {p for p, _ in commands} >= {
        "optlab env",
        "optlab diff",
        "optlab split",
        "optlab db upgrade",
        "optlab db current",
    }
    for path, command in commands:
        assert command.help and len(command.help.strip()) > 20, f"{path} has no help text"


def _group_raising(exc: Exception) -> click.Group:
    group = OptlabGroup(name="optlab")

    @group.command(help="raises what the test gives it, as a command's body would")
    def boom() -> None:
        raise exc

    return group


def _wrapped_interrupt() -> Exception:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise RuntimeError("a library's own error") from interrupt
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    "exc",
    [
        # What pydantic-core raised for a Ctrl-C while it built a model's validator at import
        # (seen once in 100 interrupts of `optlab run` in its first second).
        SchemaError(
            'Error building "model" validator:\n  SchemaError: Field "schema_version":\n'
            "  KeyboardInterrupt: "
        ),
        _wrapped_interrupt(),
    ],
    ids=["pydantic-schema", "chained"],
)
def test_a_ctrl_c_inside_a_librarys_error_is_an_interrupt_not_a_bug(exc: Exception) -> None:
    assert interrupted(exc)
    result = CliRunner().invoke(_group_raising(exc), ["boom"])
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output and "report it" not in result.output


def test_an_unexpected_error_is_still_one() -> None:
    exc = SchemaError("Error building a validator: invalid schema")
    assert not interrupted(exc)
    result = CliRunner().invoke(_group_raising(exc), ["boom"])
    assert result.exit_code == 1 and "unexpected error: SchemaError" in result.output
