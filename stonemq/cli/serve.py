"""``stonemq serve``: run the broker, in a process that loads only what serving needs."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
from typing import Annotated

import typer
from pydantic import ValidationError

from stonemq.cli.options import ConfigOpt, DataDirOpt, JournalDirOpt, QueueDirOpt
from stonemq.config import load_settings

# glibc mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def tune_malloc() -> None:
    """Keep the broker's resident memory near what it uses (glibc only; a MALLOC_* variable
    in the environment wins). Request buffers of up to 100 MiB come and go: by default
    glibc raises its mmap threshold after the first free of a large block, so later large
    buffers come from the heap and their pages stay resident once freed, and every thread
    that allocates gets an arena of its own. Fixed thresholds give large blocks back to the
    kernel on free, and two arenas serve the executor threads."""
    if any(name.startswith("MALLOC_") for name in os.environ):
        return
    with contextlib.suppress(OSError, AttributeError):
        mallopt = ctypes.CDLL("libc.so.6").mallopt
        mallopt(_M_MMAP_THRESHOLD, 256 * 1024)
        mallopt(_M_TRIM_THRESHOLD, 1024 * 1024)
        mallopt(_M_ARENA_MAX, 2)


def serve(
    listen: Annotated[
        str | None, typer.Option(help="HOST:PORT to listen on (default: 127.0.0.1:9092)")
    ] = None,
    advertise: Annotated[
        str | None, typer.Option(help="HOST:PORT given to clients (default: the listen address)")
    ] = None,
    data_dir: DataDirOpt = None,
    journal_dir: JournalDirOpt = None,
    queue_dir: QueueDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Run the broker. Every setting also comes from env STONEMQ_<NAME> or the TOML file;
    a flag beats env, env beats the file, the file beats the default."""
    try:
        settings = load_settings(
            config,
            listen=listen,
            advertise=advertise,
            data_dir=data_dir,
            journal_dir=journal_dir,
            queue_dir=queue_dir,
        )
    except (ValidationError, ValueError, OSError) as exc:
        typer.echo(f"stonemq: invalid settings: {exc}", err=True)
        raise typer.Exit(2) from None
    _setup_logging(settings.log_level)

    from stonemq.server.listener import serve as run_server
    from stonemq.server.lock import DirectoryInUseError

    try:
        import uvloop

        uvloop.run(run_server(settings))
    except DirectoryInUseError as exc:
        logging.getLogger("stonemq").error("refusing to start: %s", exc)
        raise typer.Exit(1) from None
    except OSError as exc:
        # Binding the port, opening the data dir, or an I/O error that ended the broker.
        logging.getLogger("stonemq").error("broker stopped on an I/O error: %s", exc)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass


serve_app = typer.Typer(name="stonemq", add_completion=False, no_args_is_help=True)


@serve_app.callback()
def _root() -> None:
    """StoneMQ: a Kafka-compatible broker on journal -> queue-log storage."""


serve_app.command()(serve)
