"""Every ``stonemq`` command's ``--help`` renders: typer formats help texts as Rich markup, so
a literal ``[...]`` that reads as a closing tag made ``stonemq cluster describe --help`` raise
``MarkupError`` instead of printing (found by an independent check)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from stonemq.cli.commands import app


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of ``command`` and of every command under it (typer's groups, whose click is
    its own copy: ``commands`` names them)."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_commands_help_renders() -> None:
    root = typer.main.get_command(app)
    paths = list(_commands(root))
    assert ("cluster", "describe") in paths and len(paths) > 10
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output[-500:], result.exception)
        assert "Usage" in result.output, path
