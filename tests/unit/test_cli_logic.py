"""The command group itself: its version, and help text on every command (no database)."""

from __future__ import annotations

import click
from click.testing import CliRunner

from optlab._version import __version__
from optlab.cli.main import cli


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
