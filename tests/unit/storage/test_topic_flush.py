"""A topic's flush.messages and flush.ms (Kafka's per-log flush) under a journal policy that
never fsyncs on its own: what an ack covers survives a power loss (the fault model keeps only
what fsyncs made durable), and what the topic leaves to the policy does not."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from conftest import abandon, add_topic, build_batch, new_engine, wait_split

from stonemq.protocol.record_batch import parse_header
from stonemq.storage import fileio
from stonemq.storage.engine import NO_FLUSH, LogConfig, StorageEngine
from stonemq.storage.faults import Durability, FaultyFileOps

SMALL = dict(segment_bytes=16 * 1024, index_interval_bytes=512)


@pytest.fixture
def durability(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Every file operation goes through the power-loss model."""
    model = Durability([str(tmp_path)])
    previous = fileio.install(FaultyFileOps(durability=model))
    yield model
    fileio.install(previous)


def _open(root: Path, configs: dict[str, LogConfig]) -> StorageEngine:
    engine = new_engine(root, flush_policy="never")
    for topic, config in configs.items():
        add_topic(engine, topic, config=config, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, topic))
    engine.recover()
    return engine


def _count(engine: StorageEngine, topic: str) -> int:
    return engine.high_watermark(topic, 0) - engine.log_start_offset(topic, 0)


async def _append(engine: StorageEngine, topic: str, n: int, tag: bytes) -> None:
    for i in range(n):
        batch = build_batch([tag + b"%d" % i])
        appended = engine.append(topic, 0, batch, parse_header(batch).record_count)
        await appended.written


def _after_power_loss(root: Path, model: Durability, configs: dict[str, LogConfig]) -> dict:
    model.power_loss()

    async def counts() -> dict[str, int]:
        engine = _open(root, configs)
        engine.start(lambda *a: None)
        await wait_split(engine)
        out = {topic: _count(engine, topic) for topic in configs}
        await engine.close()
        return out

    return asyncio.run(counts())


@pytest.mark.parametrize(
    "durable",
    [
        LogConfig(**SMALL, flush_messages=1),
        LogConfig(**SMALL, flush_ms=0),
    ],
    ids=["flush.messages=1", "flush.ms=0"],
)
def test_every_ack_of_the_topic_is_durable(tmp_path: Path, durability: Durability, durable):
    configs = {"durable": durable, "loose": LogConfig(**SMALL)}

    async def life() -> None:
        engine = _open(tmp_path, configs)
        engine.start(lambda *a: None)
        await _append(engine, "durable", 5, b"d")
        abandon(engine)  # a crash right after the acks

    asyncio.run(life())
    assert _after_power_loss(tmp_path, durability, configs)["durable"] == 5


def test_the_policy_alone_keeps_nothing_unfsynced(tmp_path: Path, durability: Durability):
    """The control: without the topic's flush settings, acked batches of a journal the
    policy never fsyncs are lost by the power loss (so the test above sees the fsync)."""
    configs = {"loose": LogConfig(**SMALL)}

    async def life() -> None:
        engine = _open(tmp_path, configs)
        engine.start(lambda *a: None)
        await _append(engine, "loose", 5, b"l")
        abandon(engine)

    asyncio.run(life())
    assert _after_power_loss(tmp_path, durability, configs)["loose"] == 0


def test_flush_messages_fsyncs_when_the_count_is_reached(tmp_path: Path, durability: Durability):
    """flush.messages=3: the third record's ack waits for the fsync that covers all three;
    the fourth is left to the policy."""
    configs = {"t": LogConfig(**SMALL, flush_messages=3)}

    async def life() -> None:
        engine = _open(tmp_path, configs)
        engine.start(lambda *a: None)
        await _append(engine, "t", 4, b"t")
        abandon(engine)

    asyncio.run(life())
    assert _after_power_loss(tmp_path, durability, configs)["t"] == 3


def test_positive_flush_ms_fsyncs_soon_after_without_holding_the_ack(
    tmp_path: Path, durability: Durability
):
    # the fsync is due flush.ms after the first append: long enough that three acks on a
    # loaded machine come well before it (50 ms failed once under load), short for the test
    flush_s = 0.5
    configs = {"t": LogConfig(**SMALL, flush_ms=int(flush_s * 1000))}

    async def life() -> None:
        engine = _open(tmp_path, configs)
        engine.start(lambda *a: None)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await _append(engine, "t", 3, b"t")
        assert loop.time() - started < flush_s  # the acks did not wait for the fsync
        await asyncio.sleep(flush_s + 0.3)
        abandon(engine)

    asyncio.run(life())
    assert _after_power_loss(tmp_path, durability, configs)["t"] == 3


def test_default_is_no_flush_of_its_own() -> None:
    assert LogConfig().flush_messages == LogConfig().flush_ms == NO_FLUSH
