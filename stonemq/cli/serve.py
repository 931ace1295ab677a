"""``stonemq serve``: run the broker, in a process that loads only what serving needs."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from pydantic import ValidationError

from stonemq.cli.options import ConfigOpt, DataDirOpt, JournalDirOpt, QueueDirOpt
from stonemq.config import load_settings


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def serve(
    listeners: Annotated[
        str | None,
        typer.Option(
            help="Kafka's listeners, NAME://HOST:PORT[,...] (default: PLAINTEXT://127.0.0.1:9092)"
        ),
    ] = None,
    advertised_listeners: Annotated[
        str | None,
        typer.Option(
            help="Kafka's advertised.listeners, NAME://HOST:PORT[,...] (default: listeners)"
        ),
    ] = None,
    listen: Annotated[
        str | None, typer.Option(help="HOST:PORT: alias of --listeners PLAINTEXT://HOST:PORT")
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="HOST:PORT: alias of --advertised-listeners PLAINTEXT://HOST:PORT"),
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
            listeners=listeners,
            advertised_listeners=advertised_listeners,
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
    from stonemq.server.malloc import tune_malloc

    tune_malloc()

    from stonemq.cluster import ClusterStartError

    try:
        import uvloop

        uvloop.run(run_server(settings))
    except (DirectoryInUseError, ClusterStartError) as exc:
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
