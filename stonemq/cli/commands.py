"""Every ``stonemq`` command in one Typer app (``stonemq --help``); see ``stonemq.cli``."""

from __future__ import annotations

import typer

from stonemq.cli.serve import serve

app = typer.Typer(
    name="stonemq",
    help="StoneMQ: a Kafka-compatible broker on journal -> queue-log storage.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """StoneMQ: a Kafka-compatible broker on journal -> queue-log storage."""


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
