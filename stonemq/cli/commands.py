"""Every ``stonemq`` command in one Typer app (``stonemq --help``); see ``stonemq.cli``."""

from __future__ import annotations

from typing import Annotated

import typer

from stonemq.cli.flags import HELP, SERVE_HELP
from stonemq.cli.options import ConfigOpt, DataDirOpt, JournalDirOpt, QueueDirOpt

app = typer.Typer(
    name="stonemq",
    help="StoneMQ: a Kafka-compatible broker on journal -> queue-log storage.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """StoneMQ: a Kafka-compatible broker on journal -> queue-log storage."""


def serve(
    listeners: Annotated[str | None, typer.Option(help=HELP["listeners"])] = None,
    advertised_listeners: Annotated[
        str | None, typer.Option(help=HELP["advertised_listeners"])
    ] = None,
    listen: Annotated[str | None, typer.Option(help=HELP["listen"])] = None,
    advertise: Annotated[str | None, typer.Option(help=HELP["advertise"])] = None,
    data_dir: DataDirOpt = None,
    journal_dir: JournalDirOpt = None,
    queue_dir: QueueDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    # ``stonemq serve`` itself runs stonemq.cli.serve.main (argparse, no Typer); this is the
    # same command as the Typer app lists and runs it
    from stonemq.cli.serve import run_serve

    status = run_serve(
        config,
        listeners=listeners,
        advertised_listeners=advertised_listeners,
        listen=listen,
        advertise=advertise,
        data_dir=data_dir,
        journal_dir=journal_dir,
        queue_dir=queue_dir,
    )
    if status:
        raise typer.Exit(status)


serve.__doc__ = SERVE_HELP
app.command()(serve)

from stonemq.cli.storage import storage_app  # noqa: E402

app.add_typer(storage_app)
from stonemq.cli.groups import groups_app  # noqa: E402
from stonemq.cli.topics import topics_app  # noqa: E402

app.add_typer(groups_app)
app.add_typer(topics_app)
from stonemq.cli.tier import app as tier_app  # noqa: E402

app.add_typer(tier_app)
from stonemq.cli.cluster import cluster_app  # noqa: E402

app.add_typer(cluster_app)


__all__ = ["app"]
