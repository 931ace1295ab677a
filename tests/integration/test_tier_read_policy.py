"""Tiered reads through the Kafka protocol, per tier.read.policy (no Spark: the archive job's
own reader, writer and commit run in the test process against the broker's cold store).

- not_in_local (default): offsets whose local segments local.retention.ms deleted are served
  from the Parquet archive; ListOffsets earliest is the cold log start.
- force: archived offsets come from the archive even while local segments still hold them.
- disable: no cold reads; below the local log start is OFFSET_OUT_OF_RANGE.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest

from stonemq.tiering import manifest as mf
from stonemq.tiering.archive_job import archive_in_process
from stonemq.tiering.cold_store import StoreSpec

from .helpers import (
    assert_same,
    consume,
    create_topic,
    local_log_start,
    low_watermark,
    produce,
    sample_messages,
    unique_topic,
    wait_high_watermark,
)
from .rawclient import RawConnection, fetch_raw, split_batches

pytestmark = pytest.mark.slow

KAFKA_STORAGE_ERROR = 56
BROKER = {"log.retention.check.interval.ms": 200, "queue.checkpoint.interval.ms": 200}
N = 300


def _setup(broker: Any, config: dict[str, str]) -> tuple[str, list[Any], mf.Manifest]:
    topic = create_topic(
        broker.bootstrap,
        unique_topic("pol"),
        config={"remote.storage.enable": "true", "internal.segment.bytes": "8192", **config},
    )
    msgs = sample_messages(N)
    produce(
        broker.bootstrap,
        topic,
        msgs,
        **{"batch.num.messages": 10, "linger.ms": 0, "compression.type": "zstd"},
    )
    wait_high_watermark(broker.bootstrap, topic, N)
    spec = StoreSpec((Path(broker.data_dir) / "tier").resolve().as_uri())
    archive_in_process(spec, str(Path(broker.data_dir) / "queues"), topic, 0)
    current = mf.load(spec.open(), topic, 0)
    assert 0 < current.next_offset < N
    return topic, msgs, current


def _wait_evicted(broker: Any, topic: str, archived_next: int) -> None:
    deadline = time.monotonic() + 20
    while local_log_start(broker.data_dir, topic) < archived_next:
        assert time.monotonic() < deadline, "local segments not deleted after archiving"
        time.sleep(0.1)


def _compressions(broker: Any, topic: str, offset: int) -> list[int]:
    with RawConnection(broker.host, broker.port) as conn:
        part = fetch_raw(conn, topic, 0, offset, partition_max_bytes=4096)
        assert part.error_code == 0, part.error_code
        return [struct.unpack_from(">h", b, 21)[0] & 7 for b in split_batches(part.records)]


def test_not_in_local_serves_deleted_offsets_from_the_archive(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(**BROKER)
    topic, msgs, current = _setup(broker, {"local.retention.ms": "0"})
    _wait_evicted(broker, topic, current.next_offset)
    assert low_watermark(broker.bootstrap, topic) == 0
    assert_same(consume(broker.bootstrap, topic, N, offset=0), msgs)
    middle = current.next_offset // 2
    assert_same(consume(broker.bootstrap, topic, N - middle, offset=middle), msgs[middle:])
    assert _compressions(broker, topic, 0)[0] == 0  # re-encoded from Parquet, uncompressed


def test_the_earliest_offset_is_the_cold_log_start_from_the_first_request_after_a_restart(
    broker_factory,
) -> None:  # type: ignore[no-untyped-def]
    """After a restart a tiered partition's earliest offset (ListOffsets, and a Fetch's log
    start) is the cold log start from the first request on. It was the local log start
    until the background refresh had read the partition's manifest, so a consumer starting
    from the earliest offset then skipped every archived record (audit36 p3)."""
    from confluent_kafka import OFFSET_BEGINNING

    broker = broker_factory(**BROKER)
    topic, msgs, current = _setup(broker, {"local.retention.ms": "0"})
    _wait_evicted(broker, topic, current.next_offset)
    broker.restart()
    with RawConnection(broker.host, broker.port) as conn:  # the first request after ready
        part = fetch_raw(conn, topic, 0, N - 1, partition_max_bytes=4096)
        assert part.error_code == 0, part.error_code
        assert part.log_start_offset == 0
    assert low_watermark(broker.bootstrap, topic) == 0
    assert_same(consume(broker.bootstrap, topic, N, offset=OFFSET_BEGINNING), msgs)


def test_a_manifest_that_cannot_be_read_is_not_asked_for_at_every_fetch(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """A request that finds a tiered partition's manifest unreadable (damaged here; a store
    that is down does the same) answers from the local log start and does not ask the store
    again on every request for a while: each fetch of local data would wait for the store."""
    broker = broker_factory(**BROKER)
    topic = create_topic(
        broker.bootstrap, unique_topic("nomf"), config={"remote.storage.enable": "true"}
    )
    produce(broker.bootstrap, topic, sample_messages(10))
    wait_high_watermark(broker.bootstrap, topic, 10)
    spec = StoreSpec((Path(broker.data_dir) / "tier").resolve().as_uri())
    folder = Path(spec.open().path(mf.manifest_dir(topic, 0)))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{1:020d}.json").write_bytes(b"{not json")
    broker.restart()
    with RawConnection(broker.host, broker.port) as conn:
        for _ in range(20):
            part = fetch_raw(conn, topic, 0, 0, partition_max_bytes=4096)
            assert part.error_code == 0 and part.log_start_offset == 0
    asked = broker.log(since_start=True).count(f"manifest of {topic}-0 not read")
    assert asked == 1, asked


def test_delete_records_moves_the_log_start_through_the_archive(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """KIP-405: a tiered partition's log start covers its archive. DeleteRecords below the
    local log start answered the local start and left the archived records readable (the
    low watermark stayed 0); now the cold log start moves to the offset (archived files
    wholly below it leave the store), and above the local start both move."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition
    from confluent_kafka.admin import AdminClient

    broker = broker_factory(**BROKER)
    topic, msgs, current = _setup(broker, {"local.retention.ms": "0"})
    _wait_evicted(broker, topic, current.next_offset)
    spec = StoreSpec((Path(broker.data_dir) / "tier").resolve().as_uri())
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})

    def delete(offset: int) -> int:
        done = admin.delete_records([TopicPartition(topic, 0, offset)])
        return int(done[TopicPartition(topic, 0, offset)].result(30).low_watermark)

    middle = current.next_offset // 2
    assert middle < local_log_start(broker.data_dir, topic)
    assert delete(middle) == middle
    assert low_watermark(broker.bootstrap, topic) == middle
    earliest = consume(broker.bootstrap, topic, N - middle, offset=OFFSET_BEGINNING)
    assert_same(earliest, msgs[middle:])
    cold = mf.load(spec.open(), topic, 0)
    assert cold.start_offset == middle and all(f.last >= middle for f in cold.files)
    assert delete(3) == middle  # below the log start: nothing moves
    beyond = current.next_offset + 5  # past the archive, above the local log start
    assert delete(beyond) == beyond
    assert low_watermark(broker.bootstrap, topic) == beyond
    assert_same(
        consume(broker.bootstrap, topic, N - beyond, offset=OFFSET_BEGINNING), msgs[beyond:]
    )
    assert not mf.load(spec.open(), topic, 0).files


def test_force_reads_archived_offsets_from_the_archive(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(**BROKER, **{"tier.read.policy": "force"})
    topic, msgs, current = _setup(broker, {})
    assert local_log_start(broker.data_dir, topic) == 0  # local data kept (retention.ms: 7 days)
    deadline = time.monotonic() + 10
    while _compressions(broker, topic, 0)[0] != 0:  # until the broker sees the manifest
        assert time.monotonic() < deadline, "force policy never read from the archive"
        time.sleep(0.2)
    assert _compressions(broker, topic, current.next_offset)[0] == 4  # local, as produced
    assert_same(consume(broker.bootstrap, topic, N, offset=0), msgs)


def test_a_failed_cold_read_answers_its_partition_and_keeps_the_connection(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """An archived file that cannot be read (damaged here; a store error or a file that
    cold retention removed under the read take the same path) is that partition's
    KAFKA_STORAGE_ERROR, which clients retry; the connection stays open and its next
    request is served. The exception escaped the Fetch handler and the broker closed the
    client's connection, every partition it fetched with it (audit36 p4)."""
    settings = {"tier.read.policy": "force", "tier.read.cache.expire.ms": 1}
    broker = broker_factory(**BROKER, **settings)
    topic, _, current = _setup(broker, {})
    deadline = time.monotonic() + 10
    while _compressions(broker, topic, 0)[0] != 0:  # until the broker reads the archive
        assert time.monotonic() < deadline, "force policy never read from the archive"
        time.sleep(0.2)
    spec = StoreSpec((Path(broker.data_dir) / "tier").resolve().as_uri())
    key = current.files[0].key
    assert key is not None
    Path(spec.open().path(key)).write_bytes(b"not a parquet file")
    time.sleep(0.05)  # the read-ahead cache expires (tier.read.cache.expire.ms 1)
    with RawConnection(broker.host, broker.port) as conn:
        part = fetch_raw(conn, topic, 0, 0, partition_max_bytes=4096)
        assert part.error_code == KAFKA_STORAGE_ERROR, part.error_code
        local = fetch_raw(conn, topic, 0, current.next_offset, partition_max_bytes=4096)
        assert local.error_code == 0 and local.records  # the same connection, served
    assert "cold read of" in broker.log(since_start=True)


def test_a_replicas_fetch_never_gets_archived_data(broker_factory) -> None:  # type: ignore[no-untyped-def]
    """Under force, a consumer's fetch of archived offsets is served from Parquet (re-encoded,
    uncompressed); a replica's fetch (replica id set, as a follower's catch-up sends) gets
    the log's own batches, as produced (zstd here), as Kafka never hands followers remote
    data: re-encoded batches made a catching-up follower refuse them for ever as a
    divergence (audit37 p4)."""
    import dataclasses

    from .rawclient import fetch_request, i32, schema

    broker = broker_factory(**BROKER, **{"tier.read.policy": "force"})
    topic, _, _ = _setup(broker, {})
    deadline = time.monotonic() + 10
    while _compressions(broker, topic, 0)[0] != 0:  # the consumer's: from the archive
        assert time.monotonic() < deadline, "force policy never read from the archive"
        time.sleep(0.2)
    request = dataclasses.replace(fetch_request(topic, 0, 0, 11, 0, 4096), replica_id=i32(2))
    with RawConnection(broker.host, broker.port) as conn:
        resp = conn.request(request, schema("fetch", 11, "response").FetchResponse)
    (part,) = resp.responses[0].partitions
    assert part.error_code == 0, part.error_code
    codecs = [struct.unpack_from(">h", b, 21)[0] & 7 for b in split_batches(part.records)]
    assert codecs and codecs[0] == 4  # zstd: the log's batch, not a re-encoded one


def test_disable_never_reads_the_archive(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(**BROKER, **{"tier.read.policy": "disable"})
    topic, msgs, current = _setup(broker, {"local.retention.ms": "0"})
    _wait_evicted(broker, topic, current.next_offset)
    local = local_log_start(broker.data_dir, topic)
    assert low_watermark(broker.bootstrap, topic) == local
    with RawConnection(broker.host, broker.port) as conn:
        assert fetch_raw(conn, topic, 0, 0).error_code == 1  # OFFSET_OUT_OF_RANGE
    assert_same(consume(broker.bootstrap, topic, N - local, offset=local), msgs[local:])
