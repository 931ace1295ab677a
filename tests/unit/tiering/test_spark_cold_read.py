"""The Spark source's cold part (``stonemq.spark.kafka_io.read_cold``): rows of a planned
range read straight from the archived Parquet files, and what a file removed after the plan
(cold retention) does to the range."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tier_helpers import archive_in_process, data_segments, expected_records, write_segments

from stonemq.spark import options as so
from stonemq.spark.kafka_io import DataLossError, read_cold
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import StoreSpec


def _archived(tmp_path: Path) -> tuple[StoreSpec, mf.Manifest, dict[int, tuple]]:
    spec = StoreSpec((tmp_path / "tier").as_uri())
    segments = data_segments(4, 4, 50)
    write_segments(tmp_path / "queues", "t", 0, segments)
    archive_in_process(spec.open(), "t", 0, tmp_path / "queues")
    current = mf.load(spec.open(), "t", 0)
    assert len(current.files) == 3
    return spec, current, expected_records(segments[:3])


def _offsets(spec: StoreSpec, current: mf.Manifest, lose: str) -> list[int]:
    opts = so.parse(
        {
            "kafka.bootstrap.servers": "localhost:9",  # never asked: the range is cold
            "subscribe": "t",
            "failOnDataLoss": lose,
            "stonemq.tier.store.url": spec.url,
        },
        streaming=False,
    )
    files = tuple((f.first, f.last, f.key) for f in current.files)
    r = so.OffsetRange("t", 0, 0, current.next_offset, cold=True, files=files)
    return [o for batch in read_cold(opts, r) for o in batch.column("offset").to_pylist()]


def test_a_file_removed_after_the_plan_loses_only_its_own_offsets(tmp_path: Path) -> None:
    """failOnDataLoss=false reads the files still there, as Spark's Kafka source goes on
    from the earliest offset still in the log; the rest of the range was dropped with the
    removed file (audit36 p2). The default fails, naming the file's offsets."""
    spec, current, expected = _archived(tmp_path)
    assert _offsets(spec, current, "false") == sorted(expected)
    gone = current.files[1]
    assert gone.key is not None
    os.unlink(spec.open().path(gone.key))
    kept = [o for o in sorted(expected) if not gone.first <= o <= gone.last]
    assert _offsets(spec, current, "false") == kept
    with pytest.raises(DataLossError, match=rf"offsets {gone.first}\.\.{gone.last}: archived"):
        _offsets(spec, current, "true")
