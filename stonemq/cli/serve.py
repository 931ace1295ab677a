"""``stonemq serve``: validate the settings, then become the process that serves them.

The settings are checked here with pydantic-settings; the serving process that replaces this
one (:mod:`stonemq.server.run`, same pid) gets the validated values and loads only what
serving needs (pydantic and the built model are about 13 MB of a broker's memory).
Its flags are parsed with argparse, not Typer: Typer and Click are about 1.4 MB of a broker
that serves with nothing else of the command line (the process size is a benchmark figure,
tests/integration/test_process_size.py). ``stonemq --help`` lists the same command through the
Typer app (``stonemq.cli.commands``), with the same flags and help (``stonemq.cli.flags``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stonemq.cli.flags import HELP, SERVE_HELP, SERVE_PATH_FLAGS
from stonemq.config import field_specs, load_settings
from stonemq.config_values import encode_handover
from stonemq.server.run import handover_argv, run_broker


def run_serve(config: Path | None = None, *, in_process: bool = False, **flags: Any) -> int:
    """Run the broker with ``flags`` (the given flags; None for one not given) until it is
    stopped. Returns the exit status: 0 stopped, 1 refused to start or stopped on an I/O
    error, 2 invalid settings.

    The settings are validated here, with pydantic-settings; then this process becomes the
    serving one (``os.execv``, the same pid), which gets the validated values and never
    imports pydantic (:mod:`stonemq.server.run`). ``in_process`` serves here instead: for
    wrappers that change something in this process first (tests' fault injection, the
    benchmark's storage-free sink)."""
    try:
        settings = load_settings(config, **flags)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"stonemq: invalid settings: {exc}", file=sys.stderr)
        return 2
    if in_process:
        return run_broker(settings)
    fd = os.memfd_create("stonemq-settings")
    os.set_inheritable(fd, True)  # the new program reads it
    os.write(fd, encode_handover(field_specs(), dict(settings), settings.model_fields_set))
    argv = handover_argv(fd)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(argv[0], argv)
    except OSError as exc:  # returns only on failure
        os.close(fd)
        print(f"stonemq: cannot start the serving process {argv[0]}: {exc}", file=sys.stderr)
        return 1


def parser() -> argparse.ArgumentParser:
    """``stonemq serve``'s flags: ``--data-dir`` for ``data_dir``, and so on."""
    out = argparse.ArgumentParser(prog="stonemq serve", description=SERVE_HELP)
    for name, text in HELP.items():
        kind = Path if name in SERVE_PATH_FLAGS else str
        out.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text)
    return out


def main(argv: list[str], *, in_process: bool = False) -> int:
    """``stonemq serve ARGV``: parse, run, return the exit status (``in_process``: see
    :func:`run_serve`)."""
    args = vars(parser().parse_args(argv))
    return run_serve(in_process=in_process, **args)
