"""Tiered topics through the Kafka protocol, beyond plain reads (no Spark: the archive job's own
reader, writer and commit run in the test process against the broker's cold store):

- the broker's retention round applies retention.ms to the cold tier: cold files wholly
  older leave, the manifest's cold log start moves first, and ListOffsets earliest and
  Fetch's OFFSET_OUT_OF_RANGE agree with it;
- ListOffsets by timestamp finds archived records below the local log start;
- DeleteTopics removes a tiered topic's cold data; a re-created topic of the same name
  starts empty;
- local.retention.* may not exceed retention.* (Kafka's KIP-405 checks) at CreateTopics,
  AlterConfigs and IncrementalAlterConfigs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from stonemq.tiering import manifest as mf
from stonemq.tiering.archive_job import archive_in_process
from stonemq.tiering.cold_store import ColdStore, StoreSpec

from .helpers import (
    Msg,
    admin,
    assert_same,
    consume,
    consumer,
    create_topic,
    local_log_start,
    low_watermark,
    produce,
    unique_topic,
    wait_high_watermark,
)
from .rawclient import RawConnection, fetch_raw

pytestmark = pytest.mark.slow

BROKER = {"log.retention.check.interval.ms": 200, "queue.checkpoint.interval.ms": 200}
HOUR_MS = 3_600_000
N = 300


def _store(broker: Any) -> ColdStore:
    return StoreSpec((Path(broker.data_dir) / "tier").resolve().as_uri()).open()


def _queue_dir(broker: Any) -> str:
    return str(Path(broker.data_dir) / "queues")


def _messages(n: int, base_ts: int, step_ms: int) -> list[Msg]:
    return [
        Msg(
            f"k{i}".encode(),
            f"value-{i}-".encode() * 20,
            (("i", str(i).encode()),),
            base_ts + i * step_ms,
        )
        for i in range(n)
    ]


def _wait(what: str, check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _produce_and_archive(broker: Any, topic: str, msgs: list[Msg]) -> mf.Manifest:
    produce(broker.bootstrap, topic, msgs, **{"batch.num.messages": 10, "linger.ms": 0})
    wait_high_watermark(broker.bootstrap, topic, len(msgs))
    spec = StoreSpec((Path(broker.data_dir) / "tier").resolve().as_uri())
    archive_in_process(spec, _queue_dir(broker), topic, 0)
    current = mf.load(spec.open(), topic, 0)
    assert 0 < current.next_offset < len(msgs)
    return current


def test_broker_retention_deletes_expired_cold_files(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(**BROKER)
    topic = create_topic(
        broker.bootstrap,
        unique_topic("cret"),
        config={
            "remote.storage.enable": "true",
            "internal.segment.bytes": "8192",
            "local.retention.ms": "0",
            "retention.ms": "-1",
        },
    )
    now = int(time.time() * 1000)
    msgs = _messages(N // 2, now - 3 * HOUR_MS, 1) + _messages(N // 2, now, 1)
    current = _produce_and_archive(broker, topic, msgs)
    _wait(
        "local segments not evicted",
        lambda: local_log_start(broker.data_dir, topic) >= current.next_offset,
    )
    assert low_watermark(broker.bootstrap, topic) == 0
    store = _store(broker)
    before = {f.key for f in current.files if f.key}
    # whole files whose records are all older than an hour must go; the file holding the
    # first new record stays
    expected_start = next(f.first for f in current.files if f.last >= N // 2)
    assert expected_start > 0

    client = admin(broker.bootstrap)
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", str(HOUR_MS), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    client.incremental_alter_configs([resource])[resource].result(timeout=15)

    _wait(
        "cold log start not advanced",
        lambda: mf.load(store, topic, 0).start_offset == expected_start,
    )
    trimmed = mf.load(store, topic, 0)
    kept = {f.key for f in trimmed.files if f.key}
    assert trimmed.files[0].first == expected_start
    for key in before - kept:
        _wait(f"{key} not deleted", lambda key=key: not store.exists(key))
    assert all(store.exists(k) for k in kept)
    _wait(
        "ListOffsets earliest != cold start",
        lambda: low_watermark(broker.bootstrap, topic) == expected_start,
    )
    with RawConnection(broker.host, broker.port) as conn:
        part = fetch_raw(conn, topic, 0, 0)
        assert part.error_code == 1  # OFFSET_OUT_OF_RANGE
        assert part.log_start_offset == expected_start
    assert_same(
        consume(broker.bootstrap, topic, N - expected_start, offset=expected_start),
        msgs[expected_start:],
    )


def test_list_offsets_by_timestamp_searches_the_archive(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(**BROKER)
    topic = create_topic(
        broker.bootstrap,
        unique_topic("cts"),
        config={
            "remote.storage.enable": "true",
            "internal.segment.bytes": "8192",
            "local.retention.ms": "0",
        },
    )
    base = int(time.time() * 1000) - HOUR_MS
    msgs = _messages(N, base, 1000)
    current = _produce_and_archive(broker, topic, msgs)
    _wait(
        "local segments not evicted",
        lambda: local_log_start(broker.data_dir, topic) >= current.next_offset,
    )
    local = local_log_start(broker.data_dir, topic)
    c = consumer(broker.bootstrap)
    try:
        wanted = [0, 7, local // 2, local - 1, local, N - 1]
        for i in wanted:
            # a timestamp between two records finds the later one
            for target, offset in ((msgs[i].timestamp, i), (msgs[i].timestamp - 500, i)):
                got = c.offsets_for_times([TopicPartition(topic, 0, target)], timeout=10)[0]
                assert got.offset == offset, (i, target, got)
        got = c.offsets_for_times([TopicPartition(topic, 0, base - HOUR_MS)], timeout=10)[0]
        assert got.offset == 0
        got = c.offsets_for_times([TopicPartition(topic, 0, base + N * 1000)], timeout=10)[0]
        assert got.offset == -1  # none that late (librdkafka reports the end as -1)
    finally:
        c.close()


def test_delete_topic_removes_cold_data_and_recreate_starts_empty(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(**BROKER)
    name = unique_topic("cdel")
    config = {
        "remote.storage.enable": "true",
        "internal.segment.bytes": "8192",
        "local.retention.ms": "0",
    }
    create_topic(broker.bootstrap, name, config=config)
    msgs = _messages(N, int(time.time() * 1000), 1)
    current = _produce_and_archive(broker, name, msgs)
    store = _store(broker)
    assert store.list(mf.partition_dir(name, 0))
    assert store.list(mf.manifest_dir(name, 0))

    client = admin(broker.bootstrap)
    client.delete_topics([name], operation_timeout=10)[name].result(timeout=15)

    def gone() -> bool:
        return not store.exists(mf.tombstone_key(name)) and not any(
            store.list(d) or store.list_dirs(d) for d in mf.topic_dirs(name)
        )

    _wait("cold data of the deleted topic still there", gone)
    assert mf.load(store, name, 0).files == ()

    create_topic(broker.bootstrap, name, config=config)
    assert low_watermark(broker.bootstrap, name) == 0
    fresh = [Msg(b"new", f"new-{i}".encode(), (), int(time.time() * 1000)) for i in range(5)]
    produce(broker.bootstrap, name, fresh)
    assert_same(consume(broker.bootstrap, name, 5, offset=0), fresh)
    assert current.next_offset > 5  # the old archive reached past what the new topic has


def _create_error(bootstrap: str, config: dict[str, str]) -> str:
    client = admin(bootstrap)
    name = unique_topic("cval")
    future = client.create_topics([NewTopic(name, 1, 1, config=config)], request_timeout=15)[name]
    with pytest.raises(KafkaException) as info:
        future.result(timeout=15)
    err = info.value.args[0]
    assert err.name() == "INVALID_CONFIG", err
    return str(err.str())


def test_local_retention_may_not_exceed_retention(module_broker) -> None:  # type: ignore[no-untyped-def]
    bootstrap = module_broker.bootstrap
    tiered = {"remote.storage.enable": "true"}
    msg = _create_error(bootstrap, {**tiered, "retention.ms": "1000", "local.retention.ms": "2000"})
    assert msg == (
        "Invalid value 2000 for configuration local.retention.ms: Value must not be more than "
        "retention.ms property value: 1000"
    )
    msg = _create_error(
        bootstrap, {**tiered, "retention.bytes": "100", "local.retention.bytes": "200"}
    )
    assert "local.retention.bytes" in msg and "retention.bytes property value: 100" in msg
    msg = _create_error(bootstrap, {**tiered, "retention.ms": "1000", "local.retention.ms": "-1"})
    assert "Value must not be -1 as retention.ms value is set as 1000." in msg
    # allowed: -2 (same as retention), retention -1 (unlimited), not tiered, equal values
    for ok in (
        {**tiered, "retention.ms": "1000", "local.retention.ms": "-2"},
        {**tiered, "retention.ms": "-1", "local.retention.ms": "99999"},
        {"retention.ms": "1000", "local.retention.ms": "2000"},
        {**tiered, "retention.bytes": "100", "local.retention.bytes": "100"},
    ):
        create_topic(bootstrap, unique_topic("cok"), config=ok)

    topic = create_topic(
        bootstrap, unique_topic("calt"), config={**tiered, "local.retention.ms": "1000"}
    )
    client = admin(bootstrap)
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "500", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as info:
        client.incremental_alter_configs([resource])[resource].result(timeout=15)
    assert info.value.args[0].name() == "INVALID_CONFIG"
    assert (
        "Value must not be more than retention.ms property value: 500" in info.value.args[0].str()
    )
    whole = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        set_config={
            "remote.storage.enable": "true",
            "retention.ms": "500",
            "local.retention.ms": "1000",
        },
    )
    with pytest.raises(KafkaException) as info:
        client.alter_configs([whole])[whole].result(timeout=15)
    assert info.value.args[0].name() == "INVALID_CONFIG"
    configs = client.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    described = next(iter(configs.values())).result(timeout=15)
    assert described["retention.ms"].value == str(7 * 24 * HOUR_MS)  # unchanged
    assert described["local.retention.ms"].value == "1000"
