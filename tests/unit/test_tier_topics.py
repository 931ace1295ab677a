"""Which topics the archive job (``stonemq tier run``, also started by the broker) and ``tier
status`` see: those with ``remote.storage.enable=true`` in the metadata store the settings
name, SQLite on a single node and ZooKeeper on a cluster (a cluster broker has no
``metadata.db``: both saw no topic there, so a cluster never archived; an independent
cluster check found it)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from stonemq.config import load_settings
from stonemq.metadata.sqlite import SqliteMetadataStore
from stonemq.metadata.store import MetadataStore
from stonemq.tiering.status import tiered_topics


def _topics(store: MetadataStore) -> None:
    store.create_topic("tt", [0, 1], {"remote.storage.enable": "true", "retention.ms": "5000"})
    store.create_topic("plain", [0], {})


def test_a_single_nodes_tiered_topics_come_from_its_sqlite_file(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "metadata.db")
    try:
        _topics(store)
    finally:
        store.close()
    found = tiered_topics(load_settings(None, data_dir=tmp_path))
    assert [(t.name, t.partitions, t.retention_ms) for t in found] == [("tt", 2, 5000)]


@pytest.mark.cluster
def test_a_cluster_brokers_tiered_topics_come_from_zookeeper(
    tmp_path: Path, zookeeper: Any
) -> None:
    from stonemq.metadata.zookeeper import ZooKeeperMetadataStore

    connect = f"{zookeeper.connect}/stonemq-tier-{uuid.uuid4().hex[:8]}"
    store = ZooKeeperMetadataStore(connect)
    try:
        _topics(store)
    finally:
        store.close()
    settings = load_settings(None, data_dir=tmp_path, zookeeper_connect=connect)
    assert not (tmp_path / "metadata.db").exists()
    found = tiered_topics(settings)
    assert [(t.name, t.partitions, t.retention_ms) for t in found] == [("tt", 2, 5000)]
    assert [t.name for t in tiered_topics(settings, ["plain"])] == []
