"""Property: any sequence of appends, splits, flushes, crashes and recoveries leaves queue logs
that hold exactly the acknowledged batches, at their acknowledged offsets, with contiguous
offsets, and the offline check passes.

A crash here is a power loss under ``journal.flush.policy = always``: the engine is dropped
without a final split, flush or checkpoint, then every byte that was not fsynced is thrown
away: each journal is cut back to its durable end, each queue log back to the recovery point
its checkpoint file records (later segments deleted).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from conftest import abandon, add_topic, build_batch, new_engine, read_all, wait_split
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stonemq.protocol.record_batch import iter_batches
from stonemq.storage.check import check_storage
from stonemq.storage.checkpoint import QUEUE_RECOVERY_POINT_FILE, read_queue_recovery_points
from stonemq.storage.engine import LogConfig, StorageEngine
from stonemq.storage.journal import list_segments, segment_name

PARTITIONS = 3
CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=200)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, PARTITIONS - 1), st.integers(1, 6)),
        st.tuples(st.just("split"), st.just(0), st.just(0)),
        st.tuples(st.just("flush"), st.just(0), st.just(0)),
        st.tuples(st.just("crash"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


def open_engine(root: Path) -> StorageEngine:
    engine = new_engine(root, flush_policy="always", journal_segment_bytes=2048)
    add_topic(engine, partitions=PARTITIONS, config=CONFIG)
    engine.recover()
    engine.start(lambda *a: None)
    return engine


def lose_unflushed(root: Path, durable_ends: list[int]) -> None:
    """Throw away every byte the engine had not fsynced (what a power loss may take)."""
    for j, end in enumerate(durable_ends):
        directory = root / "journal" / f"journal-{j}"
        for base in list_segments(str(directory)):
            path = directory / segment_name(base)
            if base > end or (base == end and base > 0):
                path.unlink()
            elif base + path.stat().st_size > end:
                os.truncate(path, end - base)
    points = read_queue_recovery_points(str(root / "queues" / QUEUE_RECOVERY_POINT_FILE))
    for p in range(PARTITIONS):
        directory = root / "queues" / f"t-{p}"
        if not directory.is_dir():
            continue
        rp = points.get(("t", p))
        if rp is None:
            shutil.rmtree(directory)
            continue
        for log in directory.glob("*.log"):
            base = int(log.stem)
            if base > rp.segment_base:
                for suffix in (".log", ".index", ".timeindex"):
                    log.with_suffix(suffix).unlink(missing_ok=True)
            elif base == rp.segment_base and log.stat().st_size > rp.position:
                os.truncate(log, rp.position)


def verify(engine: StorageEngine, acked: dict[int, dict[int, bytes]]) -> None:
    for p in range(PARTITIONS):
        data = read_all(engine, "t", p)
        stored: dict[int, bytes] = {}
        expected_offset = 0
        for pos, header in iter_batches(data):
            assert header.base_offset == expected_offset, f"t-{p}: offsets not contiguous"
            stored[header.base_offset] = bytes(data[pos + 12 : pos + header.size])
            expected_offset = header.next_offset
        assert engine.log_end_offset("t", p) == expected_offset
        for offset, batch in acked[p].items():
            assert stored.get(offset) == batch[12:], f"t-{p}: acknowledged {offset} lost"


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops)
def test_any_history_keeps_exactly_the_acknowledged_batches(
    tmp_path_factory, history: list[tuple[str, int, int]]
) -> None:
    root = tmp_path_factory.mktemp("prop")

    async def run() -> None:
        acked: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
        engine = open_engine(root)
        serial = 0
        for op, partition, count in history:
            if op == "append":
                batch = build_batch(
                    [b"%d-%d" % (serial, i) * (1 + serial % 30) for i in range(count)]
                )
                serial += 1
                result = engine.append("t", partition, batch, count)
                await result.written
                stored = bytearray(batch)
                stored[0:8] = result.base_offset.to_bytes(8, "big")
                acked[partition][result.base_offset] = bytes(stored)
            elif op == "split":
                await wait_split(engine)
            elif op == "flush":
                await wait_split(engine)
                await engine.flush()
            else:
                durable = [j.durable_end for j in engine._journals]
                abandon(engine)
                lose_unflushed(root, durable)
                engine = open_engine(root)
                verify(engine, acked)
                report = check_storage(str(root / "journal"), str(root / "queues"))
                assert report.ok, report.defects
        await wait_split(engine)
        verify(engine, acked)
        await engine.close()

    asyncio.run(run())
