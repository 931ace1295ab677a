"""Tests of the SQLite metadata store: durability across reopen, ids, schema versioning."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from stonemq.metadata.sqlite import (
    _SCHEMA_V1,
    METADATA_FILE,
    PRODUCER_ID_BLOCK,
    SCHEMA_VERSION,
    MetadataSchemaError,
    SqliteMetadataStore,
)
from stonemq.metadata.store import TopicExistsError, UnknownTopicError


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / METADATA_FILE


def test_pragmas_and_schema_version(path: Path) -> None:
    store = SqliteMetadataStore(path)
    try:
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store.schema_version() == SCHEMA_VERSION
    finally:
        store.close()


def test_topics_survive_reopen(path: Path) -> None:
    store = SqliteMetadataStore(path)
    a = store.create_topic("a", [0, 1, 2], {"retention.ms": "1000"})
    b = store.create_topic("b", [3], {})
    store.add_partitions("b", [0, 1])
    store.set_topic_configs("a", {"segment.bytes": "2048"})
    store.close()

    store = SqliteMetadataStore(path)
    try:
        got_a = store.get_topic("a")
        got_b = store.get_topic("b")
        assert got_a is not None and got_b is not None
        assert got_a.topic_id == a.topic_id
        assert got_a.journal_partitions == (0, 1, 2)
        assert dict(got_a.configs) == {"segment.bytes": "2048"}
        assert got_b.topic_id == b.topic_id
        assert got_b.journal_partitions == (3, 0, 1)
        assert got_b.partitions == 3
        assert sorted(t.name for t in store.list_topics()) == ["a", "b"]
    finally:
        store.close()


def test_create_twice_and_unknown(path: Path) -> None:
    store = SqliteMetadataStore(path)
    try:
        store.create_topic("t", [0], {})
        with pytest.raises(TopicExistsError):
            store.create_topic("t", [0], {})
        for call in (
            lambda: store.delete_topic("nope"),
            lambda: store.add_partitions("nope", [0]),
            lambda: store.set_topic_configs("nope", {}),
        ):
            with pytest.raises(UnknownTopicError):
                call()
    finally:
        store.close()


def test_delete_survives_reopen_and_recreate_gets_new_id(path: Path) -> None:
    store = SqliteMetadataStore(path)
    first = store.create_topic("t", [0, 1], {})
    deleted = store.delete_topic("t")
    assert deleted.topic_id == first.topic_id
    assert store.get_topic("t") is None
    store.close()

    store = SqliteMetadataStore(path)
    try:
        assert store.get_topic("t") is None
        second = store.create_topic("t", [1], {})
        assert second.topic_id != first.topic_id
        assert second.journal_partitions == (1,)
        count = store._conn.execute("SELECT count(*) FROM partitions").fetchone()[0]
        assert count == 1
    finally:
        store.close()


def test_cluster_id_is_stable(path: Path) -> None:
    store = SqliteMetadataStore(path)
    cid = store.cluster_id()
    assert len(cid) == 22
    assert store.cluster_id() == cid
    store.close()
    store = SqliteMetadataStore(path, cluster_id="ignored-once-stored")
    try:
        assert store.cluster_id() == cid
    finally:
        store.close()


def test_cluster_id_seed(path: Path) -> None:
    store = SqliteMetadataStore(path, cluster_id="my-cluster")
    try:
        assert store.cluster_id() == "my-cluster"
    finally:
        store.close()


def test_broker_configs_replace_and_survive(path: Path) -> None:
    store = SqliteMetadataStore(path)
    assert store.broker_configs() == {}
    store.set_broker_configs({"log.retention.ms": "5", "num.partitions": "3"})
    store.set_broker_configs({"num.partitions": "4"})
    store.close()
    store = SqliteMetadataStore(path)
    try:
        assert store.broker_configs() == {"num.partitions": "4"}
    finally:
        store.close()


def test_producer_ids_never_repeat_across_reopen(path: Path) -> None:
    seen: set[int] = set()
    for round_ in range(4):
        store = SqliteMetadataStore(path)
        # Cross a block boundary in one round, use only a few in others.
        count = PRODUCER_ID_BLOCK + 5 if round_ == 1 else 3
        for _ in range(count):
            pid = store.allocate_producer_id()
            assert pid >= 0
            assert pid not in seen
            seen.add(pid)
        store.close()
    assert len(seen) == PRODUCER_ID_BLOCK + 5 + 9


def test_a_version_1_file_is_upgraded_and_keeps_its_data(path: Path) -> None:
    """A file written by the first schema (no client quotas, broker configs without scopes)
    opens with every migration applied: its dynamic broker configs become the cluster-wide
    default, the broker's own scope starts empty, client quotas work."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V1)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version (version) VALUES (1)")
    conn.execute("INSERT INTO broker_configs (name, value) VALUES ('log.retention.ms', '5')")
    conn.commit()
    conn.close()
    store = SqliteMetadataStore(path)
    assert store.schema_version() == SCHEMA_VERSION == 3
    assert store.broker_configs() == {"log.retention.ms": "5"}
    assert store.broker_configs("1") == {}
    assert store.alter_client_quotas({(("client-id", "x"),): {"producer_byte_rate": 5.0}}) == {
        (("client-id", "x"),): {"producer_byte_rate": 5.0}
    }
    store.close()


def test_broker_config_scopes_are_separate(path: Path) -> None:
    store = SqliteMetadataStore(path)
    store.set_broker_configs({"num.partitions": "3"})
    store.set_broker_configs({"num.partitions": "5", "log.retention.ms": "7"}, "1")
    store.update_broker_configs(lambda current: {**current, "log.retention.ms": "9"})
    store.close()
    store = SqliteMetadataStore(path)
    try:
        assert store.broker_configs() == {"num.partitions": "3", "log.retention.ms": "9"}
        assert store.broker_configs("1") == {"num.partitions": "5", "log.retention.ms": "7"}
        assert store.broker_configs("2") == {}
    finally:
        store.close()


def test_newer_schema_is_refused(path: Path) -> None:
    SqliteMetadataStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(MetadataSchemaError):
        SqliteMetadataStore(path)


def test_foreign_file_is_refused(path: Path) -> None:
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE something (x)")
    conn.commit()
    conn.close()
    with pytest.raises(MetadataSchemaError):
        SqliteMetadataStore(path)


def test_failed_write_leaves_memory_and_file_unchanged(path: Path) -> None:
    store = SqliteMetadataStore(path)
    try:
        store.create_topic("t", [0], {})
        # A second row with the same (topic, partition) violates the primary key.
        record = store.get_topic("t")
        assert record is not None
        store._conn.execute("INSERT INTO partitions VALUES (?, 1, 0)", (str(record.topic_id),))
        with pytest.raises(sqlite3.IntegrityError):
            store.add_partitions("t", [2])
        assert store.get_topic("t") == record
    finally:
        store.close()


def test_in_data_dir(tmp_path: Path) -> None:
    store = SqliteMetadataStore.in_data_dir(tmp_path)
    try:
        assert store.path == tmp_path / METADATA_FILE
        assert isinstance(store.create_topic("x", [0], {}).topic_id, uuid.UUID)
    finally:
        store.close()
