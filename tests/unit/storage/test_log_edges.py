"""Kafka's semantics at the log's edges, on the engine: a fetch between the high watermark
(what is split) and the log end (what is acknowledged) is empty, not out of range
(reproduced defect 4 of the I/O-error issue), and offsets by timestamp start at the log
start (defect 5)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import add_topic, build_batch, new_engine, wait_split

from stonemq.storage.engine import OffsetOutOfRangeError


def test_a_fetch_between_high_watermark_and_log_end_is_empty(tmp_path: Path) -> None:
    """Reproduced: with up to splitter.max.lag.bytes between ack and split, a consumer that
    seeked to a just-acknowledged offset got OFFSET_OUT_OF_RANGE and was reset by
    auto.offset.reset. Kafka answers an offset up to the log end with no records."""

    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        for i in range(2):
            await engine.append("t", 0, build_batch([b"split%d" % i]), 1).written
        await wait_split(engine)
        await engine.close()
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.recover()  # no start(): nothing more is split, the journal still takes writes
        results = [engine.append("t", 0, build_batch([b"v%d" % i]), 1) for i in range(3)]
        await asyncio.gather(*(r.written for r in results))
        assert engine.high_watermark("t", 0) == 2 and engine.log_end_offset("t", 0) == 5
        assert engine.read("t", 0, 1, 1000).data  # split: served
        for offset in (2, 3, 5):
            read = engine.read("t", 0, offset, 1000)
            assert read.data == b"" and read.high_watermark == 2
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, 6, 1000)
        with pytest.raises(OffsetOutOfRangeError):
            engine.read("t", 0, -1, 1000)
        await engine.close()

    asyncio.run(main())


def test_offsets_by_timestamp_start_at_the_log_start(tmp_path: Path) -> None:
    async def main() -> None:
        engine = new_engine(tmp_path)
        add_topic(engine)
        engine.start(lambda *a: None)
        for i in range(4):  # offsets 3i..3i+2, timestamps 100i + 1000 + j
            batch = build_batch([b"x"] * 3, [100 * i + 1000 + j for j in range(3)])
            await engine.append("t", 0, batch, 3).written
        await wait_split(engine)
        engine.delete_records("t", 0, 4)  # inside the second batch
        assert await engine.offset_for_timestamp("t", 0, 0) == (4, 1101)
        assert await engine.offset_for_timestamp("t", 0, 1101) == (4, 1101)
        assert await engine.offset_for_timestamp("t", 0, 1102) == (5, 1102)
        assert await engine.offset_for_timestamp("t", 0, 1301) == (10, 1301)
        assert await engine.offset_for_timestamp("t", 0, 1303) is None
        assert await engine.max_timestamp("t", 0) == (11, 1302)
        engine.delete_records("t", 0, 12)
        assert await engine.offset_for_timestamp("t", 0, 0) is None
        assert await engine.max_timestamp("t", 0) is None
        await engine.close()

    asyncio.run(main())
