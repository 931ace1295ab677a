"""Tests of the topic manager against a real SQLite store and a recording storage stand-in."""

from __future__ import annotations

import asyncio
import string
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import new_engine  # tests/ (on sys.path: root conftest)
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from stonemq.cluster.routing import Leadership
from stonemq.config import Settings
from stonemq.metadata.sqlite import SqliteMetadataStore
from stonemq.storage.engine import LogConfig
from stonemq.topic_configs import (
    AdminError,
    ConfigOp,
    ConfigSource,
    InvalidConfigError,
    InvalidRequestError,
)
from stonemq.topics import (
    InvalidPartitionsError,
    InvalidTopicError,
    JournalMappingError,
    TopicAlreadyExistsError,
    TopicManager,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
    check_manual_assignment,
    journal_partition_for,
    match_assignment,
    placement_candidates,
    validate_topic_name,
)

LEGAL = string.ascii_letters + string.digits + "._-"


class RecordingStorage:
    """Stands in for the storage engine: records the lifecycle calls made on it."""

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], tuple[uuid.UUID, int, LogConfig]] = {}
        self.configs: dict[str, LogConfig] = {}
        self.removed: list[str] = []

    def add_partition(
        self,
        topic_id: uuid.UUID,
        topic: str,
        partition: int,
        journal_partition: int,
        config: LogConfig,
    ) -> None:
        self.partitions[(topic, partition)] = (topic_id, journal_partition, config)
        self.configs[topic] = config

    def update_config(self, topic: str, config: LogConfig) -> None:
        self.configs[topic] = config

    def set_producer_expiration_ms(self, ms: int) -> None:
        self.producer_expiration_ms = ms

    async def remove_topic(self, topic: str) -> None:
        self.removed.append(topic)
        self.partitions = {k: v for k, v in self.partitions.items() if k[0] != topic}
        self.configs.pop(topic, None)


def grow(topics: TopicManager, name: str, total: int, **kwargs: Any) -> Any:
    """``add_partitions`` (a coroutine: the store's commit runs in its thread)."""
    return asyncio.run(topics.add_partitions(name, total, **kwargs))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, journal_partitions=4)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteMetadataStore]:
    s = SqliteMetadataStore(tmp_path / "metadata.db")
    yield s
    s.close()


@pytest.fixture
def storage() -> RecordingStorage:
    return RecordingStorage()


@pytest.fixture
def topics(
    settings: Settings, store: SqliteMetadataStore, storage: RecordingStorage
) -> TopicManager:
    return TopicManager(settings, store, storage)


# -- names -----------------------------------------------------------------------------------
@given(st.text(alphabet=LEGAL, min_size=1, max_size=249).filter(lambda s: s not in (".", "..")))
def test_legal_names_accepted(name: str) -> None:
    validate_topic_name(name)


@given(
    st.text(alphabet=LEGAL, max_size=20),
    st.characters().filter(lambda c: c not in LEGAL),
    st.text(alphabet=LEGAL, max_size=20),
)
def test_names_with_an_illegal_character_rejected(prefix: str, bad: str, suffix: str) -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic_name(prefix + bad + suffix)
    assert info.value.error_code == 17


@given(st.text(alphabet=LEGAL, min_size=250, max_size=400))
def test_long_names_rejected(name: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", ".."])
def test_special_names_rejected(name: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


def test_boundary_names() -> None:
    validate_topic_name("a" * 249)
    validate_topic_name("...")
    validate_topic_name("_-.")


def test_dot_underscore_collision(topics: TopicManager) -> None:
    topics.create("a.b", 1)
    with pytest.raises(InvalidTopicError, match="collides"):
        topics.create("a_b", 1)
    with pytest.raises(TopicAlreadyExistsError):
        topics.create("a.b", 1)
    asyncio.run(topics.delete("a.b"))
    topics.create("a_b", 1)


def test_collision_survives_restart(
    settings: Settings, store: SqliteMetadataStore, storage: RecordingStorage
) -> None:
    TopicManager(settings, store, storage).create("x.y", 1)
    with pytest.raises(InvalidTopicError):
        TopicManager(settings, store, storage).create("x_y", 1)


# -- create ----------------------------------------------------------------------------------
def test_create_registers_with_storage(
    topics: TopicManager, storage: RecordingStorage, store: SqliteMetadataStore
) -> None:
    created = topics.create("t", 6, {"retention.ms": "1000"})
    record = created.record
    assert record.partitions == 6
    assert store.get_topic("t") == record
    assert dict(record.configs) == {"retention.ms": "1000"}
    for p in range(6):
        topic_id, journal, config = storage.partitions[("t", p)]
        assert topic_id == record.topic_id
        assert journal == record.journal_partitions[p]
        assert config.retention_ms == 1000
    # Six partitions over four journal partitions: no journal partition gets more than two.
    assert max(Counter(record.journal_partitions).values()) == 2


def test_journal_spread_is_even_and_stable() -> None:
    journals = [journal_partition_for("topic", p, 8) for p in range(800)]
    assert Counter(journals) == {j: 100 for j in range(8)}
    assert journals == [journal_partition_for("topic", p, 8) for p in range(800)]
    starts = {journal_partition_for(f"t{i}", 0, 8) for i in range(100)}
    assert len(starts) > 4


def test_journal_spread_over_every_candidate_is_the_counts() -> None:
    """A candidate list naming every journal partition routes as the count did: the single
    node's (and a cluster with every broker live) routing is unchanged."""
    for name in ("topic", "t1", "__consumer_offsets", "x" * 200):
        assert [journal_partition_for(name, p, list(range(6))) for p in range(60)] == [
            journal_partition_for(name, p, 6) for p in range(60)
        ]


def test_journal_spread_over_candidates_uses_only_them_evenly() -> None:
    journals = [journal_partition_for("topic", p, [0, 1, 4, 5]) for p in range(400)]
    assert Counter(journals) == {0: 100, 1: 100, 4: 100, 5: 100}


def _lead(replicas: tuple[int, ...], leader: int) -> Leadership:
    return Leadership(replicas, leader, 0, replicas)


def test_placement_candidates_prefer_wholly_live_then_live_leaders_then_all() -> None:
    # replication factor 1, two journal partitions per broker, broker 3 dead
    one = [_lead((b,), b) for b in (1, 1, 2, 2, 3, 3)]
    assert placement_candidates(one, lambda b: b != 3) == [0, 1, 2, 3]
    assert placement_candidates(one, lambda b: True) == list(range(6))
    # replication factor 2: broker 3 dead; every journal partition naming it is left out
    two = [_lead((1, 2), 1), _lead((2, 3), 2), _lead((3, 1), 3), _lead((2, 1), 2)]
    assert placement_candidates(two, lambda b: b != 3) == [0, 3]
    # brokers 2 and 3 dead: no journal partition wholly live; those with a live leader
    assert placement_candidates(two, lambda b: b == 1) == [0]
    # broker 1's leader gone (not re-elected yet) and the others dead: nothing live, all
    assert placement_candidates(two, lambda b: False) == [0, 1, 2, 3]
    # a journal partition not known yet (no replicas) is never a live candidate
    assert placement_candidates([_lead((), -1), _lead((1,), 1)], lambda b: True) == [1]


def test_match_assignment_exact_list_first_then_the_same_set() -> None:
    journals = [_lead((1, 2, 3), 1), _lead((2, 3, 1), 2), _lead((1, 2, 3), 1), _lead((3, 1, 2), 3)]
    assert match_assignment([1, 2, 3], journals) == [0, 2]
    assert match_assignment([2, 3, 1], journals) == [1]
    assert match_assignment([3, 2, 1], journals) == [0, 1, 2, 3]  # no exact: the same set
    assert match_assignment([1, 2], journals) == []
    assert match_assignment([1], [_lead((), -1), _lead((1,), 1)]) == [1]


@pytest.mark.parametrize(
    ("replicas", "factor", "message"),
    [
        ((), None, "The manual partition assignment includes an empty replica list."),
        (
            (1, 4),
            None,
            "The manual partition assignment includes broker 4, but no such broker is registered.",
        ),
        ((2, 1, 2), None, "The manual partition assignment includes the broker 2 more than once."),
        (
            (1, 2),
            3,
            "The manual partition assignment includes a partition with 2 replica(s), but this is "
            "not consistent with previous partitions, which have 3 replica(s).",
        ),
    ],
)
def test_check_manual_assignment_has_kafkas_messages(
    replicas: tuple[int, ...], factor: int | None, message: str
) -> None:
    with pytest.raises(AdminError) as raised:
        check_manual_assignment(replicas, lambda b: b in (1, 2, 3), factor)
    assert raised.value.error_code == ErrorCode.invalid_replica_assignment
    assert raised.value.message == message


def test_check_manual_assignment_accepts_registered_distinct_brokers() -> None:
    check_manual_assignment((3, 1, 2), lambda b: b in (1, 2, 3), 3)


def test_create_default_partitions(topics: TopicManager, store: SqliteMetadataStore) -> None:
    assert topics.create("t").record.partitions == 1
    asyncio.run(topics.alter_broker_configs({"num.partitions": "3"}))
    assert topics.create("u", -1).record.partitions == 3


@pytest.mark.parametrize("count", [0, -2])
def test_create_bad_partition_count(topics: TopicManager, count: int) -> None:
    with pytest.raises(InvalidPartitionsError):
        topics.create("t", count)


def test_create_bad_config(topics: TopicManager, store: SqliteMetadataStore) -> None:
    with pytest.raises(InvalidConfigError):
        topics.create("t", 1, {"cleanup.policy": "compact"})
    assert store.get_topic("t") is None


def test_validate_only_creates_nothing(
    topics: TopicManager, storage: RecordingStorage, store: SqliteMetadataStore
) -> None:
    created = topics.create("t", 3, {"segment.bytes": "1048576"}, validate_only=True)
    assert created.record.partitions == 3
    assert created.config.log_config.segment_bytes == 1048576
    assert store.get_topic("t") is None
    assert storage.partitions == {}


def test_register_all_with_storage(
    settings: Settings, store: SqliteMetadataStore, tmp_path: Path
) -> None:
    first = RecordingStorage()
    manager = TopicManager(settings, store, first)
    manager.create("a", 2, {"retention.bytes": "99"})
    manager.create("b", 3)
    store.close()

    reopened = SqliteMetadataStore(tmp_path / "metadata.db")
    try:
        second = RecordingStorage()
        assert TopicManager(settings, reopened, second).register_all_with_storage() == 5
        assert second.partitions == first.partitions
        assert second.configs["a"].retention_bytes == 99
    finally:
        reopened.close()


def test_lowering_journal_partitions_is_refused(store: SqliteMetadataStore, tmp_path: Path) -> None:
    wide = Settings(data_dir=tmp_path, journal_partitions=16)
    TopicManager(wide, store, RecordingStorage()).create("t", 16)
    narrow = Settings(data_dir=tmp_path, journal_partitions=4)
    with pytest.raises(JournalMappingError, match=r"journal\.partitions"):
        TopicManager(narrow, store, RecordingStorage()).register_all_with_storage()


# -- ensure ----------------------------------------------------------------------------------
def test_ensure_auto_creates(topics: TopicManager, storage: RecordingStorage) -> None:
    record = topics.ensure("auto")
    assert record.partitions == 1
    assert ("auto", 0) in storage.partitions
    assert topics.ensure("auto") == record


def test_ensure_disabled(topics: TopicManager) -> None:
    asyncio.run(topics.alter_broker_configs({"auto.create.topics.enable": "false"}))
    with pytest.raises(UnknownTopicOrPartitionError):
        topics.ensure("auto")
    with pytest.raises(InvalidTopicError):
        topics.ensure("bad name")


def test_ensure_disabled_by_setting(store: SqliteMetadataStore, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, auto_create_topics_enable=False)
    with pytest.raises(UnknownTopicOrPartitionError):
        TopicManager(settings, store, RecordingStorage()).ensure("auto")


# -- delete ----------------------------------------------------------------------------------
def test_delete(
    topics: TopicManager, storage: RecordingStorage, store: SqliteMetadataStore
) -> None:
    record = topics.create("t", 2).record
    assert topics.by_id(record.topic_id) == record
    assert asyncio.run(topics.delete("t")) == record
    assert store.get_topic("t") is None
    assert storage.removed == ["t"]
    assert storage.partitions == {}
    with pytest.raises(UnknownTopicOrPartitionError):
        asyncio.run(topics.delete("t"))
    with pytest.raises(UnknownTopicIdError):
        topics.by_id(record.topic_id)
    with pytest.raises(UnknownTopicOrPartitionError):
        topics.produce_config("t")
    again = topics.create("t", 1).record
    assert again.topic_id != record.topic_id


# -- partitions ------------------------------------------------------------------------------
def test_add_partitions(topics: TopicManager, storage: RecordingStorage) -> None:
    record = topics.create("t", 2, {"segment.ms": "777"}).record
    grown = grow(topics, "t", 5)
    assert grown.partitions == 5
    assert grown.journal_partitions[:2] == record.journal_partitions
    assert grown.topic_id == record.topic_id
    for p in range(5):
        assert storage.partitions[("t", p)][1] == grown.journal_partitions[p]
        assert storage.partitions[("t", p)][2].segment_ms == 777
    with pytest.raises(InvalidPartitionsError):
        grow(topics, "t", 5)
    with pytest.raises(InvalidPartitionsError):
        grow(topics, "t", 3)
    with pytest.raises(UnknownTopicOrPartitionError):
        grow(topics, "nope", 3)


def test_add_partitions_validate_only(topics: TopicManager, storage: RecordingStorage) -> None:
    topics.create("t", 1)
    assert grow(topics, "t", 4, validate_only=True).partitions == 4
    assert topics.require("t").partitions == 1
    assert ("t", 1) not in storage.partitions


# -- configs ---------------------------------------------------------------------------------
def test_alter_configs_replaces_whole_set(
    topics: TopicManager, storage: RecordingStorage, store: SqliteMetadataStore
) -> None:
    topics.create("t", 1, {"retention.ms": "1000", "segment.ms": "5000"})
    assert topics.produce_config("t").max_message_bytes == 1_048_588
    asyncio.run(
        topics.alter_configs(
            "t", {"max.message.bytes": "100", "message.timestamp.type": "LogAppendTime"}
        )
    )
    record = store.get_topic("t")
    assert record is not None
    assert dict(record.configs) == {
        "max.message.bytes": "100",
        "message.timestamp.type": "LogAppendTime",
    }
    produce = topics.produce_config("t")
    assert produce.max_message_bytes == 100
    assert produce.log_append_time
    # retention.ms went back to the broker default and storage heard about it.
    assert storage.configs["t"].retention_ms == LogConfig().retention_ms


def test_alter_configs_validate_only_and_invalid(
    topics: TopicManager, store: SqliteMetadataStore
) -> None:
    topics.create("t", 1, {"retention.ms": "1000"})
    asyncio.run(topics.alter_configs("t", {"retention.ms": "5"}, validate_only=True))
    with pytest.raises(InvalidConfigError):
        asyncio.run(topics.alter_configs("t", {"retention.ms": "x"}))
    record = store.get_topic("t")
    assert record is not None and dict(record.configs) == {"retention.ms": "1000"}
    with pytest.raises(UnknownTopicOrPartitionError):
        asyncio.run(topics.alter_configs("nope", {}))


def test_configs_are_checked_against_each_other_as_kafka_does(
    topics: TopicManager, store: SqliteMetadataStore
) -> None:
    """Reproduced (an independent audit, f4 and f5): these were accepted. Kafka's LogConfig
    refuses min.compaction.lag.ms over max.compaction.lag.ms, remote.log.copy.disable with
    local retention other than the whole log's, and turning remote storage off without
    remote.log.delete.on.disable (INVALID_CONFIG, each with Kafka's message)."""
    lags = {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}
    with pytest.raises(InvalidConfigError, match=r"conflict topic config setting"):
        topics.create("lags", 1, lags)
    topics.create("t", 1, {"remote.storage.enable": "true"})
    with pytest.raises(InvalidConfigError, match=r"conflict topic config setting"):
        asyncio.run(topics.alter_configs("t", {"remote.storage.enable": "true", **lags}))
    read_only = {"remote.storage.enable": "true", "remote.log.copy.disable": "true"}
    with pytest.raises(InvalidConfigError, match=r"`local.retention.ms` and `retention.ms`"):
        asyncio.run(topics.alter_configs("t", {**read_only, "local.retention.ms": "1000"}))
    with pytest.raises(InvalidConfigError, match=r"`local.retention.bytes` and"):
        topics.create("ro", 1, {**read_only, "retention.bytes": "9", "local.retention.bytes": "8"})
    asyncio.run(topics.alter_configs("t", {**read_only, "local.retention.ms": str(7 * 86400000)}))
    with pytest.raises(InvalidConfigError, match=r"invalid to disable remote storage"):
        asyncio.run(topics.alter_configs("t", {"remote.storage.enable": "false"}))
    record = store.get_topic("t")
    assert record is not None and record.configs["remote.storage.enable"] == "true"
    off = {"remote.storage.enable": "false", "remote.log.delete.on.disable": "true"}
    asyncio.run(topics.alter_configs("t", off))
    record = store.get_topic("t")
    assert record is not None and dict(record.configs) == off
    assert store.get_topic("lags") is None and store.get_topic("ro") is None


def test_incremental_alter(topics: TopicManager, store: SqliteMetadataStore) -> None:
    topics.create("t", 1, {"retention.ms": "1000"})
    asyncio.run(
        topics.incremental_alter_configs(
            "t",
            [("retention.ms", ConfigOp.DELETE, None), ("segment.bytes", ConfigOp.SET, "2097152")],
        )
    )
    record = store.get_topic("t")
    assert record is not None and dict(record.configs) == {"segment.bytes": "2097152"}
    with pytest.raises(InvalidConfigError):
        asyncio.run(
            topics.incremental_alter_configs("t", [("cleanup.policy", ConfigOp.APPEND, "compact")])
        )
    with pytest.raises(InvalidConfigError):
        asyncio.run(topics.incremental_alter_configs("t", [("retention.ms", ConfigOp.APPEND, "1")]))


def test_broker_dynamic_config_reaches_topics_without_override(
    topics: TopicManager, storage: RecordingStorage
) -> None:
    topics.create("plain", 1)
    topics.create("pinned", 1, {"retention.ms": "1000", "max.message.bytes": "10"})
    assert topics.produce_config("plain").max_message_bytes == 1_048_588
    asyncio.run(
        topics.alter_broker_configs({"log.retention.ms": "2000", "message.max.bytes": "500"})
    )
    assert storage.configs["plain"].retention_ms == 2000
    assert storage.configs["pinned"].retention_ms == 1000
    assert topics.produce_config("plain").max_message_bytes == 500
    assert topics.produce_config("pinned").max_message_bytes == 10
    entry = next(e for e in topics.effective_config("plain").entries if e.name == "retention.ms")
    assert entry.source is ConfigSource.DYNAMIC_BROKER_CONFIG


def test_broker_dynamic_configs_survive_restart(
    settings: Settings, store: SqliteMetadataStore, storage: RecordingStorage
) -> None:
    asyncio.run(
        TopicManager(settings, store, storage).alter_broker_configs({"num.partitions": "7"})
    )
    assert TopicManager(settings, store, storage).default_partitions() == 7


def test_incremental_broker_configs(topics: TopicManager) -> None:
    asyncio.run(topics.incremental_alter_broker_configs([("num.partitions", ConfigOp.SET, "4")]))
    asyncio.run(topics.incremental_alter_broker_configs([("log.retention.ms", ConfigOp.SET, "9")]))
    assert topics.broker_dynamic_configs() == {"num.partitions": "4", "log.retention.ms": "9"}
    asyncio.run(
        topics.incremental_alter_broker_configs([("num.partitions", ConfigOp.DELETE, None)])
    )
    assert topics.broker_dynamic_configs() == {"log.retention.ms": "9"}
    with pytest.raises(InvalidRequestError):
        asyncio.run(
            topics.incremental_alter_broker_configs([("journal.partitions", ConfigOp.SET, "8")])
        )


def test_concurrent_partition_growth_of_one_topic_is_serialized(
    topics: TopicManager, storage: RecordingStorage
) -> None:
    """Two CreatePartitions for one topic in flight at once each added their partitions to
    the count the other had not committed yet: grow-to-10 and grow-to-20 left 29."""
    topics.create("t", 1)

    async def both() -> list[Any]:
        return await asyncio.gather(
            topics.add_partitions("t", 10), topics.add_partitions("t", 20), return_exceptions=True
        )

    results = asyncio.run(both())
    assert [r.partitions for r in results] == [10, 20]
    assert topics.require("t").partitions == 20
    assert sorted(p for (t, p) in storage.partitions if t == "t") == list(range(20))


def test_partition_growth_racing_a_delete_gets_unknown_topic(topics: TopicManager) -> None:
    """Growth that waits behind a deletion answers UNKNOWN_TOPIC_OR_PARTITION (it failed
    with a traceback when the store's row vanished under it)."""
    topics.create("t", 1)

    async def race() -> list[Any]:
        return await asyncio.gather(
            topics.delete("t"), topics.add_partitions("t", 5), return_exceptions=True
        )

    deleted, grown = asyncio.run(race())
    assert deleted.name == "t"
    assert isinstance(grown, UnknownTopicOrPartitionError)
    assert topics.get("t") is None


def test_a_delete_racing_a_large_create_leaves_no_partition_behind(
    settings: Settings, store: SqliteMetadataStore, tmp_path: Path
) -> None:
    """With the real storage engine: a deletion that arrived while a 30,000-partition topic
    was still being registered forgot the partitions registered so far, the rest went on
    being registered as partitions of no topic, and the next create of the name followed by
    CreatePartitions failed with a traceback (found by the long fuzz run)."""

    async def race() -> None:
        engine = new_engine(
            tmp_path,
            journal_partitions=settings.journal_partitions,
            journal_segment_bytes=1 << 20,
        )
        engine.recover()
        engine.start(lambda *a: None)
        topics = TopicManager(settings, store, engine)
        creating = asyncio.ensure_future(topics.create_async("big", 30_000))
        while topics.get("big") is None:  # committed: registration is under way in steps
            await asyncio.sleep(0)
        deleted, _ = await asyncio.gather(topics.delete("big"), creating)
        assert deleted.name == "big"
        assert not [key for key in engine._by_name if key[0] == "big"]
        again = await topics.create_async("big", 3)
        await topics.add_partitions("big", 5)
        assert sorted(p for (t, p) in engine._by_name if t == "big") == list(range(5))
        assert {s.topic_id for s in engine._by_name.topic("big")} == {again.record.topic_id.bytes}
        await engine.close()

    asyncio.run(race())
