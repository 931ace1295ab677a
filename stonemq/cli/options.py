"""The command-line options every command that reads the broker's state shares (one place)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DataDirOpt = Annotated[Path | None, typer.Option(help="root of all broker state (default: ./data)")]
JournalDirOpt = Annotated[
    Path | None, typer.Option(help="write directory (default: DATA_DIR/journal)")
]
QueueDirOpt = Annotated[Path | None, typer.Option(help="read directory (default: DATA_DIR/queues)")]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(help="TOML settings file (Kafka names, e.g. num.partitions = 3)"),
]
