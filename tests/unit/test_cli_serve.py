"""``stonemq serve`` parses its flags with argparse (no Typer in the broker process); the
Typer app lists the same command: both must take the same flags, with the same help."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from stonemq.cli.commands import serve as typer_serve
from stonemq.cli.flags import HELP
from stonemq.cli.serve import parser


def test_the_typer_command_and_the_argparse_parser_take_the_same_flags() -> None:
    typer_flags = set(inspect.signature(typer_serve).parameters)
    argparse_flags = {a.dest for a in parser()._actions if a.dest != "help"}
    assert typer_flags == argparse_flags == set(HELP)


def test_each_flag_parses_to_its_setting_name_and_type() -> None:
    args = vars(
        parser().parse_args(
            [
                *("--listeners", "PLAINTEXT://127.0.0.1:1"),
                *("--advertised-listeners", "PLAINTEXT://h:1"),
                *("--data-dir", "/d", "--journal-dir", "/j", "--queue-dir", "/q"),
                *("--config", "/c.toml"),
            ]
        )
    )
    assert args == {
        "listeners": "PLAINTEXT://127.0.0.1:1",
        "advertised_listeners": "PLAINTEXT://h:1",
        "listen": None,
        "advertise": None,
        "data_dir": Path("/d"),
        "journal_dir": Path("/j"),
        "queue_dir": Path("/q"),
        "config": Path("/c.toml"),
    }


def test_an_unknown_flag_exits_2() -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--bogus"])
    assert exc.value.code == 2


def test_serve_reports_a_serving_process_that_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The settings are valid, but the interpreter to exec is gone: exit status 1 and a
    message, not a traceback (and the handover's memory file is closed)."""
    from stonemq.cli.serve import run_serve

    monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))
    before = len(list(Path("/proc/self/fd").iterdir()))
    assert run_serve(listen="127.0.0.1:1", data_dir=tmp_path / "data") == 1
    assert "cannot start the serving process" in capsys.readouterr().err
    assert len(list(Path("/proc/self/fd").iterdir())) == before
