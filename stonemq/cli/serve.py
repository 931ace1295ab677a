"""``stonemq serve``: run the broker, in a process that loads only what serving needs.

Its flags are parsed with argparse, not Typer: Typer and Click are about 1.4 MB of a broker
that serves with nothing else of the command line (the process size is a benchmark figure,
tests/integration/test_process_size.py). ``stonemq --help`` lists the same command through the
Typer app (``stonemq.cli.commands``), with the same flags and help (``stonemq.cli.flags``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stonemq.cli.flags import HELP, SERVE_HELP, SERVE_PATH_FLAGS
from stonemq.config import load_settings


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run_serve(config: Path | None = None, **flags: Any) -> int:
    """Run the broker with ``flags`` (the given flags; None for one not given) until it is
    stopped. Returns the exit status: 0 stopped, 1 refused to start or stopped on an I/O
    error, 2 invalid settings."""
    try:
        settings = load_settings(config, **flags)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"stonemq: invalid settings: {exc}", file=sys.stderr)
        return 2
    _setup_logging(settings.log_level)

    from stonemq.server.listener import serve as run_server
    from stonemq.server.lock import DirectoryInUseError
    from stonemq.server.malloc import tune_malloc

    tune_malloc()

    from stonemq.cluster import ClusterStartError

    try:
        import uvloop

        uvloop.run(run_server(settings))
    except (DirectoryInUseError, ClusterStartError) as exc:
        logging.getLogger("stonemq").error("refusing to start: %s", exc)
        return 1
    except OSError as exc:
        # Binding the port, opening the data dir, or an I/O error that ended the broker.
        logging.getLogger("stonemq").error("broker stopped on an I/O error: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def parser() -> argparse.ArgumentParser:
    """``stonemq serve``'s flags: ``--data-dir`` for ``data_dir``, and so on."""
    out = argparse.ArgumentParser(prog="stonemq serve", description=SERVE_HELP)
    for name, text in HELP.items():
        kind = Path if name in SERVE_PATH_FLAGS else str
        out.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help=text)
    return out


def main(argv: list[str]) -> int:
    """``stonemq serve ARGV``: parse, run, return the exit status."""
    args = vars(parser().parse_args(argv))
    return run_serve(**args)
