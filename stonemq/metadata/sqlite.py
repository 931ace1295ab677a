"""The embedded metadata backend: topics, partitions' journal mapping, configs and ids in SQLite.

One file, ``<data_dir>/metadata.db``, in WAL mode with ``synchronous=FULL`` so every committed
change survives a crash or power loss. The store keeps one connection, used from the event-loop
thread only, and an in-memory copy of every topic: reads (metadata requests, produce) never touch
the database; writes go to the database first and update the copy once they have committed.

Producer ids are reserved in blocks: the database records the end of the last reserved block,
so an id is never handed out twice, even across a crash (a restart skips the unused rest of the
block, as Kafka does).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from stonemq.metadata.store import (
    CLUSTER_DEFAULT,
    MetadataStore,
    TopicExistsError,
    TopicRecord,
    TopicTable,
    UnknownTopicError,
    random_uuid,
    uuid_text,
)
from stonemq.quotas.entity import Entity, apply_ops, entity_of

METADATA_FILE = "metadata.db"
SCHEMA_VERSION = 3
PRODUCER_ID_BLOCK = 1000

_SCHEMA_V1 = """
CREATE TABLE cluster (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE topics (
    name     TEXT PRIMARY KEY,
    topic_id TEXT NOT NULL UNIQUE,
    configs  TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE partitions (
    topic_id          TEXT NOT NULL REFERENCES topics(topic_id) ON DELETE CASCADE,
    partition         INTEGER NOT NULL CHECK (partition >= 0),
    journal_partition INTEGER NOT NULL CHECK (journal_partition >= 0),
    PRIMARY KEY (topic_id, partition)
) WITHOUT ROWID;
CREATE TABLE broker_configs (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE producer_ids (
    next_block_start INTEGER NOT NULL
);
INSERT INTO producer_ids (next_block_start) VALUES (0);
"""

# Upgrades from version N to N+1, applied in order when an older file is opened (and after
# the version-1 schema when a new file is made).
_MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE client_quotas (
    entity TEXT PRIMARY KEY,
    quotas TEXT NOT NULL
);
""",
    # dynamic broker configs get Kafka's two scopes: "" (cluster-wide default, where every
    # config set before this version goes) and a broker's own (its id)
    2: """
CREATE TABLE broker_configs_scoped (
    scope TEXT NOT NULL,
    name  TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;
INSERT INTO broker_configs_scoped (scope, name, value) SELECT '', name, value FROM broker_configs;
DROP TABLE broker_configs;
ALTER TABLE broker_configs_scoped RENAME TO broker_configs;
""",
}


_HAS_SCHEMA_VERSION = "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'"


class MetadataStoreError(Exception):
    """The metadata file cannot be used: damaged, unreadable, or missing beside topic data."""


class MetadataSchemaError(MetadataStoreError):
    """The metadata file was written by a newer StoneMQ (or is not a StoneMQ file)."""


def holds_store(path: Path) -> bool:
    """Whether ``path`` is a metadata file some start created (a missing or empty file is
    not, SQLite would take it as a new, empty database, unless its write-ahead log holds
    what a crash left there)."""
    for held in (path, path.with_name(path.name + "-wal")):
        with contextlib.suppress(FileNotFoundError):
            if held.stat().st_size > 0:
                return True
    return False


def store_defect(path: Path, queue_logs: int) -> str | None:
    """What makes the metadata file at ``path`` unusable, read only (``storage check``): a
    damaged database, or one emptied while ``queue_logs`` queue logs hold its topics' data;
    None when it is sound, or absent (a ZooKeeper broker keeps none)."""
    if not path.exists():
        return None
    if not holds_store(path):
        if queue_logs:
            return f"{path} is empty, but {queue_logs} queue logs hold topic data"
        return None
    # read a copy, with its write-ahead log (after a crash the last changes, even the
    # schema, may be there only): opening the file itself would make -shm and -wal files
    with tempfile.TemporaryDirectory(prefix="stonemq-check-") as scratch:
        copy = Path(scratch) / path.name
        try:
            shutil.copyfile(path, copy)
            wal = path.with_name(path.name + "-wal")
            if wal.exists():
                shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
        except OSError as exc:
            return f"{path} cannot be read: {exc}"
        try:
            conn = sqlite3.connect(copy)
        except sqlite3.Error as exc:
            return f"{path} cannot be opened: {exc}"
        try:
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                return f"{path} is damaged: {verdict}"
            has_version = conn.execute(_HAS_SCHEMA_VERSION).fetchone()
            if not has_version:
                return f"{path} is not a StoneMQ metadata file (no schema version)"
        except sqlite3.DatabaseError as exc:
            return f"{path} is damaged: {exc}"
        finally:
            conn.close()
    return None


def new_cluster_id() -> str:
    """A Kafka-style cluster id: a random UUID in URL-safe base64 without padding (22 chars)."""
    return uuid_text(random_uuid())


class SqliteMetadataStore(MetadataStore):
    """:class:`MetadataStore` on one SQLite file.

    ``cluster_id`` seeds the cluster id the first time the file is used (the ``cluster.id``
    setting); once one is stored it never changes.
    """

    def __init__(self, path: str | Path, *, cluster_id: str | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # writes come from the broker's metadata thread (TopicManager) and, for small ones,
        # from the event loop: one connection, one lock around every use of it
        try:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise MetadataStoreError(f"{self.path} cannot be opened: {exc}") from exc
        self._lock = threading.RLock()
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            self._seed_cluster_id = cluster_id
            self._cluster_id: str | None = None
            self._topics = TopicTable(self._load_topics())
        except sqlite3.DatabaseError as exc:  # damaged: never a traceback at start
            self._conn.close()
            raise MetadataStoreError(
                f"{self.path} cannot be read ({exc}): restore it from a backup"
            ) from exc
        except BaseException:
            self._conn.close()
            raise
        self._pid_next = 0
        self._pid_end = 0  # ids in [_pid_next, _pid_end) are reserved and unused

    @classmethod
    def in_data_dir(
        cls, data_dir: str | Path, *, cluster_id: str | None = None
    ) -> SqliteMetadataStore:
        return cls(Path(data_dir) / METADATA_FILE, cluster_id=cluster_id)

    # -- schema -----------------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; committed (durably) on normal exit, rolled back on error."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _migrate(self) -> None:
        with self._tx() as db:
            has_version = db.execute(_HAS_SCHEMA_VERSION).fetchone()
            if not has_version:
                others = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if others:
                    raise MetadataSchemaError(f"{self.path}: not a StoneMQ metadata file")
                db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                for statement in _statements(_SCHEMA_V1):
                    db.execute(statement)
                db.execute("INSERT INTO schema_version (version) VALUES (1)")
            version = db.execute("SELECT version FROM schema_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise MetadataSchemaError(
                    f"{self.path}: schema version {version} is newer than this StoneMQ "
                    f"understands ({SCHEMA_VERSION})"
                )
            while version < SCHEMA_VERSION:
                for statement in _statements(_MIGRATIONS[version]):
                    db.execute(statement)
                version += 1
                db.execute("UPDATE schema_version SET version = ?", (version,))

    def schema_version(self) -> int:
        return int(self._conn.execute("SELECT version FROM schema_version").fetchone()[0])

    def _load_topics(self) -> dict[str, TopicRecord]:
        journal: dict[str, list[int]] = {}
        rows = self._conn.execute(
            "SELECT topic_id, journal_partition FROM partitions ORDER BY topic_id, partition"
        )
        for topic_id, journal_partition in rows:
            journal.setdefault(topic_id, []).append(journal_partition)
        topics: dict[str, TopicRecord] = {}
        for name, topic_id, configs in self._conn.execute(
            "SELECT name, topic_id, configs FROM topics ORDER BY name"
        ):
            topics[name] = TopicRecord(
                name=name,
                topic_id=uuid.UUID(topic_id),
                journal_partitions=tuple(journal.get(topic_id, ())),
                configs=json.loads(configs),
            )
        return topics

    # -- cluster ----------------------------------------------------------------------------------
    def cluster_id(self) -> str:
        """The cluster id: stored once, never changed, so read once (every Metadata request
        asks for it on the event loop, where waiting for the lock behind a commit of the
        metadata thread stalled every client)."""
        if self._cluster_id is not None:
            return self._cluster_id
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM cluster WHERE key = 'cluster_id'"
            ).fetchone()
        if row:
            self._cluster_id = str(row[0])
            return self._cluster_id
        value = self._seed_cluster_id or new_cluster_id()
        with self._tx() as db:
            db.execute("INSERT INTO cluster (key, value) VALUES ('cluster_id', ?)", (value,))
        self._cluster_id = value
        return value

    # -- topics -----------------------------------------------------------------------------------
    def list_topics(self) -> list[TopicRecord]:
        return list(self._topics.values())

    def partition_total(self) -> int:
        return self._topics.partitions

    def get_topic(self, name: str) -> TopicRecord | None:
        return self._topics.get(name)

    def create_topic(
        self, name: str, journal_partitions: list[int], configs: Mapping[str, str]
    ) -> TopicRecord:
        if name in self._topics:
            raise TopicExistsError(name)
        record = TopicRecord(
            name=name,
            topic_id=random_uuid(),
            journal_partitions=tuple(journal_partitions),
            configs=dict(configs),
        )
        tid = str(record.topic_id)
        with self._tx() as db:
            try:
                db.execute(
                    "INSERT INTO topics (name, topic_id, configs) VALUES (?, ?, ?)",
                    (name, tid, _dump(record.configs)),
                )
            except sqlite3.IntegrityError as e:
                raise TopicExistsError(name) from e
            db.executemany(
                "INSERT INTO partitions (topic_id, partition, journal_partition) VALUES (?, ?, ?)",
                [(tid, p, j) for p, j in enumerate(record.journal_partitions)],
            )
        self._topics[name] = record
        return record

    def delete_topic(self, name: str) -> TopicRecord:
        record = self._require(name)
        with self._tx() as db:
            db.execute("DELETE FROM partitions WHERE topic_id = ?", (str(record.topic_id),))
            db.execute("DELETE FROM topics WHERE name = ?", (name,))
        del self._topics[name]
        return record

    def add_partitions(self, name: str, journal_partitions: list[int]) -> TopicRecord:
        record = self._require(name)
        first = record.partitions
        tid = str(record.topic_id)
        with self._tx() as db:
            db.executemany(
                "INSERT INTO partitions (topic_id, partition, journal_partition) VALUES (?, ?, ?)",
                [(tid, first + i, j) for i, j in enumerate(journal_partitions)],
            )
        updated = TopicRecord(
            name=name,
            topic_id=record.topic_id,
            journal_partitions=record.journal_partitions + tuple(journal_partitions),
            configs=record.configs,
        )
        self._topics[name] = updated
        return updated

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicRecord:
        record = self._require(name)
        new_configs = dict(configs)
        with self._tx() as db:
            db.execute("UPDATE topics SET configs = ? WHERE name = ?", (_dump(new_configs), name))
        updated = TopicRecord(
            name=name,
            topic_id=record.topic_id,
            journal_partitions=record.journal_partitions,
            configs=new_configs,
        )
        self._topics[name] = updated
        return updated

    def _require(self, name: str) -> TopicRecord:
        record = self._topics.get(name)
        if record is None:
            raise UnknownTopicError(name)
        return record

    # -- broker configs ---------------------------------------------------------------------------
    def broker_configs(self, scope: str = CLUSTER_DEFAULT) -> dict[str, str]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, value FROM broker_configs WHERE scope = ? ORDER BY name", (scope,)
            )
            return {name: value for name, value in rows}

    def update_broker_configs(
        self,
        change: Callable[[dict[str, str]], dict[str, str]],
        scope: str = CLUSTER_DEFAULT,
    ) -> dict[str, str]:
        with self._tx() as db:
            rows = db.execute("SELECT name, value FROM broker_configs WHERE scope = ?", (scope,))
            configs = {str(k): str(v) for k, v in change(dict(rows.fetchall())).items()}
            db.execute("DELETE FROM broker_configs WHERE scope = ?", (scope,))
            db.executemany(
                "INSERT INTO broker_configs (scope, name, value) VALUES (?, ?, ?)",
                [(scope, name, value) for name, value in configs.items()],
            )
        return configs

    # -- client quotas ----------------------------------------------------------------------------
    def client_quotas(self) -> dict[Entity, dict[str, float]]:
        with self._lock:
            rows = self._conn.execute("SELECT entity, quotas FROM client_quotas").fetchall()
        return {_entity_from_text(entity): json.loads(quotas) for entity, quotas in rows}

    def alter_client_quotas(
        self, changes: Mapping[Entity, Mapping[str, float | None]]
    ) -> dict[Entity, dict[str, float]]:
        with self._tx() as db:
            for entity, ops in changes.items():
                key = _entity_text(entity)
                row = db.execute(
                    "SELECT quotas FROM client_quotas WHERE entity = ?", (key,)
                ).fetchone()
                updated = apply_ops(json.loads(row[0]) if row else {}, ops)
                if updated:
                    db.execute(
                        "INSERT OR REPLACE INTO client_quotas (entity, quotas) VALUES (?, ?)",
                        (key, json.dumps(updated, sort_keys=True)),
                    )
                elif row:
                    db.execute("DELETE FROM client_quotas WHERE entity = ?", (key,))
        return self.client_quotas()

    # -- producer ids -----------------------------------------------------------------------------
    def allocate_producer_id(self) -> int:
        with self._lock:
            return self._allocate_producer_id()

    def _allocate_producer_id(self) -> int:
        if self._pid_next >= self._pid_end:
            with self._tx() as db:
                start = int(db.execute("SELECT next_block_start FROM producer_ids").fetchone()[0])
                db.execute(
                    "UPDATE producer_ids SET next_block_start = ?", (start + PRODUCER_ID_BLOCK,)
                )
            self._pid_next, self._pid_end = start, start + PRODUCER_ID_BLOCK
        pid = self._pid_next
        self._pid_next += 1
        return pid

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _dump(configs: Mapping[str, str]) -> str:
    return json.dumps(dict(configs), sort_keys=True, separators=(",", ":"))


def _entity_text(entity: Entity) -> str:
    return json.dumps([list(pair) for pair in entity], separators=(",", ":"))


def _entity_from_text(text: str) -> Entity:
    return entity_of((str(t), None if n is None else str(n)) for t, n in json.loads(text))


def _statements(script: str) -> list[str]:
    """Split a schema script into statements (``executescript`` would commit our transaction)."""
    return [s.strip() for s in script.split(";") if s.strip()]
