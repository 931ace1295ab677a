"""``stonemq storage check`` and ``stonemq storage dump`` on real engine output: a clean data
directory passes, each kind of damage is reported with exit 1, dumps decode every entry."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from conftest import add_topic, build_batch, new_engine, wait_split
from typer.testing import CliRunner

from stonemq.cli import app
from stonemq.storage.engine import LogConfig

runner = CliRunner()


def make_data(root: Path, batches: int = 40) -> None:
    async def run() -> None:
        engine = new_engine(root)
        add_topic(
            engine, partitions=2, config=LogConfig(segment_bytes=4096, index_interval_bytes=300)
        )
        engine.start(lambda *a: None)
        results = [
            engine.append("t", i % 2, build_batch([b"value-%d" % i] * 3), 3) for i in range(batches)
        ]
        await asyncio.gather(*(r.written for r in results))
        await wait_split(engine)
        await engine.close()

    asyncio.run(run())


def check(root: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["storage", "check", "--data-dir", str(root), "-v"])
    return result.exit_code, result.output


def test_clean_data_dir_passes(tmp_path: Path) -> None:
    make_data(tmp_path)
    code, out = check(tmp_path)
    assert code == 0, out
    assert "no defect" in out and "records: 120" in out


def test_damage_is_found(tmp_path: Path) -> None:
    make_data(tmp_path)
    seg = sorted((tmp_path / "queues" / "t-0").glob("*.log"))[0]
    data = bytearray(seg.read_bytes())
    data[100] ^= 0xFF  # inside the first batch's records: CRC mismatch
    seg.write_bytes(bytes(data))
    journal = sorted((tmp_path / "journal" / "journal-1").glob("*.journal"))[-1]
    with journal.open("ab") as f:
        f.write(os.urandom(50))
    code, out = check(tmp_path)
    assert code == 1
    assert "CRC mismatch" in out and "journal-1" in out


def test_index_pointing_elsewhere_is_found(tmp_path: Path) -> None:
    make_data(tmp_path)
    index = sorted((tmp_path / "queues" / "t-1").glob("*.index"))[0]
    data = bytearray(index.read_bytes())
    assert data, "the test needs an index entry"
    data[7] ^= 0x01  # the first entry's position moves off a batch boundary
    index.write_bytes(bytes(data))
    code, out = check(tmp_path)
    assert code == 1 and "does not name the batch" in out


def test_dump_journal_and_queue_segment(tmp_path: Path) -> None:
    make_data(tmp_path, batches=4)
    journal = sorted((tmp_path / "journal" / "journal-0").glob("*.journal"))[0]
    out = runner.invoke(app, ["storage", "dump", str(journal), "--records"]).output
    assert out.count("topicId:") == 2 and "value-0" in out
    seg = sorted((tmp_path / "queues" / "t-0").glob("*.log"))[0]
    result = runner.invoke(app, ["storage", "dump", str(seg)])
    assert result.exit_code == 0
    assert [line.split()[1] for line in result.output.splitlines()] == ["0", "3"]
    bad = runner.invoke(app, ["storage", "dump", str(tmp_path / "x.txt")])
    assert bad.exit_code == 2
