"""A new group coordinator's reload of ``__consumer_offsets`` (a failover): it waits for the
partitions' high watermark however long it takes, answering COORDINATOR_LOAD_IN_PROGRESS
meanwhile, as Kafka's coordinator reads to its log end before it answers; an unload of the
partitions cancels it. A real storage engine in replicated mode, whose split limit stands for
the journal high watermark the ISR holds back."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engines import new_engine  # tests/ (on sys.path: root conftest)
from kio.schema.errors import ErrorCode

from stonemq.config import Settings
from stonemq.coordinator import group_store
from stonemq.coordinator.group_coordinator import OffsetCommit
from stonemq.coordinator.group_log import OFFSETS_TOPIC
from stonemq.coordinator.group_store import GroupRuntime
from stonemq.metadata.sqlite import SqliteMetadataStore
from stonemq.storage.engine import StorageEngine
from stonemq.topics import TopicManager

GROUP = "g"


async def _committed_then_taken_over(
    tmp_path: Path,
) -> tuple[StorageEngine, GroupRuntime, SqliteMetadataStore, dict[int, int]]:
    """A coordinator commits offset 7 (its journal partition led here, the split limit at
    0: acknowledged by nobody's HW yet); a new coordinator on the same storage then takes
    the partition over, the high watermark still behind its log end."""
    settings = Settings(data_dir=tmp_path, journal_partitions=1, offsets_topic_num_partitions=1)
    store = SqliteMetadataStore(tmp_path / "metadata.db")
    engine = new_engine(tmp_path, journal_partitions=1, replicated=True)
    topics = TopicManager(settings, store, engine)
    old = GroupRuntime(settings, engine, topics)
    old.log.ensure_topic()
    engine.recover()
    engine.start(lambda *a: None)
    await engine.become_leader(0, 1)
    answers: list[ErrorCode] = []
    old.coordinator.commit(GROUP, [OffsetCommit("t", 0, 7, -1, "")], answers.append)
    while not answers:
        await asyncio.sleep(0.01)
    assert answers == [ErrorCode.none]
    until = {0: engine.log_end_offset(OFFSETS_TOPIC, 0)}
    assert engine.high_watermark(OFFSETS_TOPIC, 0) < until[0]
    new = GroupRuntime(settings, engine, topics)
    new.log.ensure_topic()
    return engine, new, store, until


def _offset(runtime: GroupRuntime) -> int | None:
    got = runtime.coordinator.fetch_offsets(GROUP, None).get(("t", 0))
    return None if got is None else got.offset


def test_a_reload_waits_for_the_high_watermark_however_long_it_takes(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """helper-78's audit34 p1: the reload gave up after 60 s, replayed what was split then
    and served; the commit above it was lost for good, also once the HW moved on."""
    monkeypatch.setattr(group_store, "RELOAD_NOTE_S", 0.2)  # the warnings while it waits

    async def main() -> None:
        engine, new, store, until = await _committed_then_taken_over(tmp_path)
        try:
            task = new.start_reload(until)
            await asyncio.sleep(1.0)  # five notes: longer than any give-up would be here
            assert not task.done() and new.loading == {0}
            assert _offset(new) is None  # nothing served meanwhile
            engine.set_split_limit(0, engine.journal_written_end(0))  # the ISR caught up
            await asyncio.wait_for(task, 10)
            assert new.loading == set()
            assert _offset(new) == 7
        finally:
            await engine.close()
            store.close()

    asyncio.run(main())


def test_an_unload_cancels_a_reload_still_waiting(tmp_path: Path) -> None:
    """The journal partition was led elsewhere before its high watermark came: the reload
    loads nothing, even once this broker's copy (a follower's now) reaches that point."""

    async def main() -> None:
        engine, new, store, until = await _committed_then_taken_over(tmp_path)
        try:
            task = new.start_reload(until)
            await asyncio.sleep(0.2)
            new.unload({0})
            assert new.loading == set()
            engine.set_split_limit(0, engine.journal_written_end(0))
            await asyncio.sleep(0.5)
            assert task.cancelled()
            assert _offset(new) is None
        finally:
            await engine.close()
            store.close()

    asyncio.run(main())
