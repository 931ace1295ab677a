"""``stonemq storage``: offline storage tools, ``check`` (verify a data directory) and ``dump``
(print a journal or queue-log file, like kafka-dump-log). The logic is
:mod:`stonemq.storage.check`; this module only parses arguments and prints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from stonemq.cli.options import DataDirOpt, JournalDirOpt, QueueDirOpt
from stonemq.config import load_settings
from stonemq.metadata.sqlite import METADATA_FILE, store_defect
from stonemq.protocol.record_batch import set_stored_limit
from stonemq.server.lock import lock_holder
from stonemq.storage.check import check_storage, dump_file

storage_app = typer.Typer(
    name="storage",
    help="Offline storage tools: check a data directory, dump a journal or queue-log file.",
    no_args_is_help=True,
    add_completion=False,
)


@storage_app.command()
def check(
    data_dir: DataDirOpt = None,
    journal_dir: JournalDirOpt = None,
    queue_dir: QueueDirOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="one row per queue log")] = False,
) -> None:
    """Verify every journal entry and queue-log batch (checksums, offset contiguity, index
    consistency) and the topic store (metadata.db) and print a summary; exit 1 on any
    defect. Changes no file."""
    settings = load_settings(None, data_dir=data_dir, journal_dir=journal_dir, queue_dir=queue_dir)
    set_stored_limit(settings.batch_max_uncompressed_bytes)  # what the broker accepted
    if not settings.journal_path.is_dir() and not settings.queue_path.is_dir():
        # a mistyped path "passed" with nothing checked
        typer.echo(
            f"stonemq storage check: no StoneMQ data: neither {settings.journal_path} nor "
            f"{settings.queue_path} is a directory",
            err=True,
        )
        raise typer.Exit(2)
    holder = lock_holder(settings.data_dir)
    if holder is not None:  # its files change under the check: false defects at their tails
        typer.echo(
            f"stonemq storage check: data directory {settings.data_dir} is in use by pid "
            f"{holder} (a running broker); stop it first",
            err=True,
        )
        raise typer.Exit(2)
    report = check_storage(str(settings.journal_path), str(settings.queue_path))
    store = store_defect(settings.data_dir / METADATA_FILE, len(report.queue_logs))
    if store is not None:  # the topics the queue logs belong to
        report.defects.append(store)
    console = Console()
    journals = Table(title=f"journal ({settings.journal_path})")
    for column in ("partition", "segments", "entries", "bytes", "start", "end"):
        journals.add_column(column, justify="right" if column != "partition" else "left")
    for j in report.journals:
        journals.add_row(
            j.name,
            str(j.segments),
            str(j.entries),
            str(j.bytes),
            str(j.start_position),
            str(j.end_position),
        )
    console.print(journals)
    logs = report.queue_logs
    if verbose:
        queues = Table(title=f"queue logs ({settings.queue_path})")
        for column in ("queue log", "segments", "batches", "records", "bytes", "start", "end"):
            queues.add_column(column, justify="right" if column != "queue log" else "left")
        for q in logs:
            queues.add_row(
                q.name,
                str(q.segments),
                str(q.batches),
                str(q.records),
                str(q.bytes),
                str(q.log_start_offset),
                str(q.next_offset),
            )
        console.print(queues)
    console.print(
        f"queue logs: {len(logs)}, segments: {sum(q.segments for q in logs)}, "
        f"batches: {sum(q.batches for q in logs)}, records: {sum(q.records for q in logs)}, "
        f"bytes: {sum(q.bytes for q in logs)}"
    )
    for note in report.notes:
        console.print(f"[yellow]PENDING[/yellow] {note}", highlight=False, soft_wrap=True)
    if report.ok:
        console.print("[green]storage check passed: no defect[/green]")
        return
    for defect in report.defects:
        console.print(f"[red]DEFECT[/red] {defect}", highlight=False, soft_wrap=True)
    console.print(f"[red]storage check failed: {len(report.defects)} defect(s)[/red]")
    raise typer.Exit(1)


@storage_app.command()
def dump(
    file: Annotated[Path, typer.Argument(help="a .journal, .log, .index or .timeindex file")],
    records: Annotated[bool, typer.Option("--records", help="decode each batch's records")] = False,
) -> None:
    """Print every entry of a journal segment or batch of a queue-log segment (or the entries
    of an index file)."""
    try:
        for line in dump_file(str(file), records):
            typer.echo(line)
    except (ValueError, OSError) as exc:
        typer.echo(f"stonemq storage dump: {exc}", err=True)
        raise typer.Exit(2) from None
