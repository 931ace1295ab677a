"""The command-line options every command that reads the broker's state shares (one place)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from stonemq.cli.flags import HELP

DataDirOpt = Annotated[Path | None, typer.Option(help=HELP["data_dir"])]
JournalDirOpt = Annotated[Path | None, typer.Option(help=HELP["journal_dir"])]
QueueDirOpt = Annotated[Path | None, typer.Option(help=HELP["queue_dir"])]
ConfigOpt = Annotated[Path | None, typer.Option(help=HELP["config"])]
