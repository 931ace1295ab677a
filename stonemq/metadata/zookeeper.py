"""The cluster metadata backend: topics, their journal mapping, configs and ids in ZooKeeper.

Used when ``zookeeper.connect`` is set (``host:port[,host:port...][/chroot]``, Kafka's form;
the chroot is created if missing). Every broker of the cluster opens one; what one writes,
the others see through watches. The layout follows Kafka's ZooKeeper layout where Kafka has
the same thing, and is per topic, never per topic partition:

- ``/cluster/id``: ``{"version": "1", "id": <cluster id>}``
- ``/brokers/topics/<topic>``: ``{"version": 1, "topic_id": <uuid>, "journal_partitions":
  <base64 of one big-endian uint16 per partition>}``: the partition → journal-partition
  mapping, chosen once when a partition is created and never changed. Two bytes per
  partition keep a 100,000-partition topic at 267 KB, under ZooKeeper's 1 MB node limit.
- ``/config/topics/<topic>``: ``{"version": 1, "config": {...}}`` (the topic's overrides)
- ``/config/brokers/<default>``: ``{"version": 1, "config": {...}}`` (the cluster-wide dynamic
  broker configs), ``/config/brokers/<id>``: the same for one broker's own
- ``/config/client-quotas``: ``{"version": 1, "quotas": [{"entity": [[type, name or null],
  ...], "config": {key: value}}, ...]}``: every client quota in one node (Kafka's ZooKeeper
  mode kept one node per entity plus change notifications; one node is enough for the
  thousands of entities a cluster configures, about 100 bytes each against the 1 MB limit),
  updated by conditional writes and followed by one data watch on every broker.
- ``/latest_producer_id_block``: ``{"version": 1, "broker": <id>, "block_start": s,
  "block_end": e}`` (inclusive), as Kafka's ZooKeeper-mode brokers reserve producer ids.

Every update is conditional (the version of the node the change was computed from) or an
atomic multi-operation transaction: two brokers changing the same topic at once cannot both
win; the loser gets :class:`ConcurrentChangeError` and its caller re-reads and re-validates.
Reads never go to ZooKeeper: the store keeps every topic in memory, loaded at start and kept
current by one children watch on ``/brokers/topics`` and one data watch per topic node and
per topic config node (kazoo re-arms them after a reconnect or a new session).
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import sys
import threading
import uuid
from array import array
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry

from stonemq.metadata.sqlite import PRODUCER_ID_BLOCK, new_cluster_id
from stonemq.metadata.store import (
    CLUSTER_DEFAULT,
    ConcurrentChangeError,
    MetadataStore,
    TopicExistsError,
    TopicRecord,
    TopicTable,
    UnknownTopicError,
    random_uuid,
)
from stonemq.quotas.entity import Entity, apply_ops, entity_of

log = logging.getLogger(__name__)

CLUSTER_ID_PATH = "/cluster/id"
TOPICS_PATH = "/brokers/topics"
TOPIC_CONFIGS_PATH = "/config/topics"
BROKER_CONFIGS_PATH = "/config/brokers"
BROKER_CONFIG_PATH = f"{BROKER_CONFIGS_PATH}/<default>"
PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
CLIENT_QUOTAS_PATH = "/config/client-quotas"

MAX_JOURNAL_PARTITION = 0xFFFF
QuotaListener = Callable[[dict[Entity, dict[str, float]]], None]
"""Called with every configured client quota when they change, in kazoo's thread."""
TopicListener = Callable[[str, TopicRecord | None], None]
"""Called as ``listener(name, record)`` (None: deleted) when a topic changes, in kazoo's thread."""


def encode_mapping(journal_partitions: tuple[int, ...] | list[int]) -> str:
    """The partition → journal-partition mapping as stored in a topic node (big-endian
    uint16s in base64; OverflowError beyond MAX_JOURNAL_PARTITION)."""
    values = array("H", journal_partitions)
    if sys.byteorder == "little":
        values.byteswap()
    return base64.b64encode(values.tobytes()).decode("ascii")


def decode_mapping(text: str) -> tuple[int, ...]:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 2:
        raise ValueError(f"journal mapping of {len(raw)} bytes is not whole uint16s")
    values = array("H")
    values.frombytes(raw)
    if sys.byteorder == "little":
        values.byteswap()
    return tuple(values)


def _json(node: dict[str, Any]) -> bytes:
    return json.dumps(node, sort_keys=True, separators=(",", ":")).encode()


class ZooKeeperMetadataStore(MetadataStore):
    """:class:`MetadataStore` in ZooKeeper (see the module docstring for the layout).

    ``connect`` is Kafka's ``zookeeper.connect``; ``cluster_id`` seeds the cluster id the
    first time the ensemble (chroot) is used; ``broker_id`` is recorded in producer-id blocks.
    """

    def __init__(
        self,
        connect: str,
        *,
        cluster_id: str | None = None,
        broker_id: int = 0,
        session_timeout_ms: int = 18_000,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.connect = connect
        self._seed_cluster_id = cluster_id
        self._broker_id = broker_id
        hosts, slash, chroot = connect.partition("/")
        if slash and chroot.strip("/"):
            self._ensure_chroot(hosts, "/" + chroot.strip("/"), connect_timeout_s)
        self.client = KazooClient(
            hosts=connect,
            timeout=session_timeout_ms / 1000,
            connection_retry=KazooRetry(max_tries=-1, max_delay=2.0),
            command_retry=KazooRetry(max_tries=10, max_delay=2.0),
        )
        self.client.start(timeout=connect_timeout_s)
        self._retry = self.client.retry
        self._lock = threading.RLock()  # the topic cache
        # the producer-id block: its own lock, so that a reservation waiting on ZooKeeper
        # never holds the cache's readers (a Metadata request's list_topics on the event loop)
        self._pid_lock = threading.Lock()
        self._cluster_id: str | None = None
        self._topics = TopicTable()
        self._versions: dict[str, tuple[int, int]] = {}  # name: (topic node, config node)
        # topics with armed watches: name -> the token their watch callbacks carry (a watch
        # whose token is no longer the name's stops itself)
        self._watched: dict[str, int] = {}
        self._tokens = itertools.count()
        self._listeners: list[TopicListener] = []
        self._pid_next = 0
        self._pid_end = 0  # ids in [_pid_next, _pid_end) are reserved and unused
        try:
            for path in (TOPICS_PATH, TOPIC_CONFIGS_PATH, "/cluster", BROKER_CONFIGS_PATH):
                self._retry(self.client.ensure_path, path)
            self.client.ChildrenWatch(TOPICS_PATH, self._on_topic_names)
        except BaseException:
            self.client.stop()
            self.client.close()
            raise

    @staticmethod
    def _ensure_chroot(hosts: str, chroot: str, timeout_s: float) -> None:
        """Create the chroot node, as Kafka's brokers do at their first start."""
        client = KazooClient(hosts=hosts, timeout=10.0)
        client.start(timeout=timeout_s)
        try:
            client.retry(client.ensure_path, chroot)
        finally:
            client.stop()
            client.close()

    # -- the cache, kept current by watches -------------------------------------------------
    def add_listener(self, listener: TopicListener) -> None:
        """Be told of every topic created, changed or deleted, by any broker."""
        self._listeners.append(listener)

    def _on_topic_names(self, names: list[str]) -> None:
        """Children watch on the topics node (kazoo's thread): watch new topics, drop gone.

        The list was read when the watch fired, before this callback runs: a topic this store
        created meanwhile (cached at once, ``_cached``) is missing from it without being gone.
        Taken as gone, it was dropped from the cache and its listeners told it was deleted,
        until the next list brought it back (the store's partition total read 0 with a topic
        alive, in the unit test beside other work), and a broker removes a deleted topic's
        queue logs. So a name missing from the list is dropped only once its node is gone."""
        current = set(names)
        with self._lock:
            missing = [n for n in set(self._topics) | set(self._watched) if n not in current]
        for name in missing:
            try:
                if self._retry(self.client.exists, f"{TOPICS_PATH}/{name}") is None:
                    continue
            except Exception:  # ZooKeeper unreachable: kept until a list settles it
                pass
            current.add(name)  # the list predates it
        with self._lock:
            # only names found gone above: one this store cached while ZooKeeper was asked
            # is missing from the list too, and alive
            cached = set(self._topics) | set(self._watched)
            gone = [name for name in missing if name not in current and name in cached]
            for name in gone:
                self._watched.pop(name, None)
            new = {name: next(self._tokens) for name in current if name not in self._watched}
            self._watched.update(new)
        for name in gone:
            self._forget(name)
        for name, token in new.items():
            self._watch_topic(name, token)

    def _watch_topic(self, name: str, token: int) -> None:
        def on_topic(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if self._watched.get(name) != token:
                return False  # deleted meanwhile: stop watching
            if data is None:
                self._forget(name)
            else:
                self._reload(name)
            return None

        def on_config(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if self._watched.get(name) != token:
                return False
            if data is not None:
                self._reload(name)
            return None

        self.client.DataWatch(f"{TOPICS_PATH}/{name}", on_topic)
        self.client.DataWatch(f"{TOPIC_CONFIGS_PATH}/{name}", on_config)

    def _reload(self, name: str) -> TopicRecord | None:
        """Read a topic's two nodes (a consistent pair: the topic node's version is checked
        again after the config is read) and update the cache."""
        while True:
            try:
                topic_data, topic_stat = self._retry(self.client.get, f"{TOPICS_PATH}/{name}")
                config_data, config_stat = self._retry(
                    self.client.get, f"{TOPIC_CONFIGS_PATH}/{name}"
                )
                again = self._retry(self.client.exists, f"{TOPICS_PATH}/{name}")
            except NoNodeError:
                self._forget(name)
                return None
            if again is None:
                self._forget(name)
                return None
            if again.version == topic_stat.version:
                break
        try:
            record = _topic_record(name, topic_data, config_data)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("topic %s: unreadable metadata in ZooKeeper, ignored: %s", name, exc)
            return None
        with self._lock:
            old = self._topics.get(name)
            versions = (topic_stat.version, config_stat.version)
            if self._versions.get(name, (-1, -1)) > versions and old is not None:
                return old  # an older read finished after a newer one
            self._topics[name] = record
            self._versions[name] = versions
        if old != record:
            self._notify(name, record)
        return record

    def _forget(self, name: str) -> None:
        with self._lock:
            old = self._topics.pop(name, None)
            self._versions.pop(name, None)
        if old is not None:
            self._notify(name, None)

    def _notify(self, name: str, record: TopicRecord | None) -> None:
        for listener in self._listeners:
            try:
                listener(name, record)
            except Exception:
                log.exception("topic listener failed for %s", name)

    def _cached(self, name: str, record: TopicRecord, versions: tuple[int, int]) -> None:
        """A write of this store succeeded: its result is read back at once (the watch
        confirms it later)."""
        with self._lock:
            if self._versions.get(name, (-1, -1)) > versions:
                return
            self._topics[name] = record
            self._versions[name] = versions

    # -- cluster ----------------------------------------------------------------------------------
    def cluster_id(self) -> str:
        """The cluster id: created by the first broker, never changed, so read once (every
        Metadata request asks for it on the event loop: it read ZooKeeper there each time,
        and a stop with ZooKeeper gone waited on that read for good)."""
        if self._cluster_id is None:
            value = self._seed_cluster_id or new_cluster_id()
            try:
                self._retry(
                    self.client.create, CLUSTER_ID_PATH, _json({"version": "1", "id": value})
                )
            except NodeExistsError:
                data, _ = self._retry(self.client.get, CLUSTER_ID_PATH)
                value = str(json.loads(data)["id"])
            self._cluster_id = value
        return self._cluster_id

    # -- topics -----------------------------------------------------------------------------------
    def list_topics(self) -> list[TopicRecord]:
        with self._lock:
            return list(self._topics.values())

    def partition_total(self) -> int:
        return self._topics.partitions

    def get_topic(self, name: str) -> TopicRecord | None:
        return self._topics.get(name)

    def topic_ids_gone(self, topic_ids: set[bytes]) -> set[bytes]:
        """Which of ``topic_ids`` no topic holds now (blocking: a thread). A follower's
        journal may name topics its watches have not brought yet: ZooKeeper is synced first
        (a topic named by its leader's journal was created before that leader took the
        produce), then the topics not cached here, or cached under one of those ids (grown
        since), are read again, and, while an id is still unfound, every other topic (one
        deleted and created again under its name). Each read updates the cache and tells
        the listeners, which register what is new; the ids left are deleted topics'."""
        want = set(topic_ids)
        self._retry(self.client.sync, TOPICS_PATH)
        names = self._retry(self.client.get_children, TOPICS_PATH)
        with self._lock:
            cached = {name: record.topic_id.bytes for name, record in self._topics.items()}
        first = [n for n in names if cached.get(n) is None or cached[n] in want]
        rest = [n for n in names if cached.get(n) is not None and cached[n] not in want]
        for name in first:
            record = self._reload(name)
            if record is not None:
                want.discard(record.topic_id.bytes)
        for name in rest:
            if not want:
                break
            record = self._reload(name)
            if record is not None:
                want.discard(record.topic_id.bytes)
        return want

    def create_topic(
        self, name: str, journal_partitions: list[int], configs: Mapping[str, str]
    ) -> TopicRecord:
        record = TopicRecord(
            name=name,
            topic_id=random_uuid(),
            journal_partitions=tuple(journal_partitions),
            configs=dict(configs),
        )

        def commit() -> list[Any]:
            # a new transaction each attempt: kazoo refuses to commit one twice ("Transaction
            # already committed": CreateTopics answered UNKNOWN_SERVER_ERROR after a lost
            # connection, with the topic often created; audit33 p2)
            tx = self.client.transaction()
            tx.create(f"{TOPICS_PATH}/{name}", _topic_node(record))
            tx.create(f"{TOPIC_CONFIGS_PATH}/{name}", _config_node(record.configs))
            return tx.commit()

        results = self._retry(commit)
        if any(isinstance(r, NodeExistsError) for r in results):
            # a commit retried after a lost connection finds its own first attempt
            try:
                data, _ = self._retry(self.client.get, f"{TOPICS_PATH}/{name}")
            except NoNodeError:
                data = b"{}"
            if json.loads(data).get("topic_id") != str(record.topic_id):
                raise TopicExistsError(name)
        else:
            _raise_first(results)
        self._cached(name, record, (0, 0))
        return record

    def delete_topic(self, name: str) -> TopicRecord:
        record, (topic_version, config_version) = self._current(name)
        attempts = 0

        def commit() -> list[Any]:
            nonlocal attempts
            attempts += 1
            tx = self.client.transaction()  # a new one each attempt (create_topic says why)
            tx.delete(f"{TOPIC_CONFIGS_PATH}/{name}", version=config_version)
            tx.delete(f"{TOPICS_PATH}/{name}", version=topic_version)
            return tx.commit()

        results = self._retry(commit)
        if any(isinstance(r, NoNodeError) for r in results):
            if attempts == 1:
                raise UnknownTopicError(name)
            # after an attempt cut by a lost connection: that attempt deleted the nodes (or
            # another broker did meanwhile); the topic is gone either way
        else:
            _raise_conflict(results, name)
        self._forget(name)
        return record

    def add_partitions(self, name: str, journal_partitions: list[int]) -> TopicRecord:
        record, (topic_version, config_version) = self._current(name)
        updated = TopicRecord(
            name=name,
            topic_id=record.topic_id,
            journal_partitions=record.journal_partitions + tuple(journal_partitions),
            configs=record.configs,
        )
        stat = self._set(
            f"{TOPICS_PATH}/{name}",
            _topic_node(updated),
            topic_version,
            name,
            f"topic {name} changed meanwhile (another broker grew or deleted it)",
        )
        self._cached(name, updated, (stat.version, config_version))
        return updated

    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicRecord:
        record, (topic_version, config_version) = self._current(name)
        updated = TopicRecord(
            name=name,
            topic_id=record.topic_id,
            journal_partitions=record.journal_partitions,
            configs=dict(configs),
        )
        stat = self._set(
            f"{TOPIC_CONFIGS_PATH}/{name}",
            _config_node(updated.configs),
            config_version,
            name,
            f"the configs of topic {name} changed meanwhile (another broker altered them)",
        )
        self._cached(name, updated, (topic_version, stat.version))
        return updated

    def _set(self, path: str, data: bytes, version: int, name: str, conflict: str) -> ZnodeStat:
        """A conditional write of a topic's node: ConcurrentChangeError when the node is no
        longer at ``version`` (unless it already holds ``data``: a write retried after a
        lost connection finds its own first attempt), UnknownTopicError when it is gone."""
        try:
            return self._retry(self.client.set, path, data, version=version)
        except BadVersionError as exc:
            try:
                now, stat = self._retry(self.client.get, path)
            except NoNodeError:
                raise UnknownTopicError(name) from exc
            if now == data and stat.version == version + 1:
                return stat
            raise ConcurrentChangeError(conflict) from exc
        except NoNodeError as exc:
            raise UnknownTopicError(name) from exc

    def _current(self, name: str) -> tuple[TopicRecord, tuple[int, int]]:
        """The topic as this store knows it, and the node versions it was read at."""
        with self._lock:
            record = self._topics.get(name)
            versions = self._versions.get(name)
        if record is None or versions is None:
            record = self._reload(name)
            if record is None:
                raise UnknownTopicError(name)
            with self._lock:
                versions = self._versions[name]
        return record, versions

    # -- broker configs ---------------------------------------------------------------------------
    def broker_configs(self, scope: str = CLUSTER_DEFAULT) -> dict[str, str]:
        return self._read_broker_configs(scope)[0]

    def _read_broker_configs(self, scope: str) -> tuple[dict[str, str], int]:
        """A scope's dynamic broker configs and their node's version (-1: no node yet)."""
        try:
            data, stat = self._retry(self.client.get, _broker_config_path(scope))
        except NoNodeError:
            return {}, -1
        return _broker_configs_from_node(data), stat.version

    def update_broker_configs(
        self,
        change: Callable[[dict[str, str]], dict[str, str]],
        scope: str = CLUSTER_DEFAULT,
    ) -> dict[str, str]:
        """A conditional write on the version the change was computed from: when another
        broker wrote meanwhile, the change is computed again on what it wrote (an
        IncrementalAlterConfigs through two brokers at once keeps both changes)."""
        path = _broker_config_path(scope)
        while True:
            current, version = self._read_broker_configs(scope)
            configs = {str(k): str(v) for k, v in change(current).items()}
            data = _config_node(configs)
            try:
                if version < 0:
                    self._retry(self.client.create, path, data)
                else:
                    self._retry(self.client.set, path, data, version=version)
            except (BadVersionError, NodeExistsError):
                try:
                    now, _ = self._retry(self.client.get, path)
                except NoNodeError:
                    continue
                if now == data:  # our own write, retried after a lost connection
                    return configs
                continue
            return configs

    def add_broker_config_listener(
        self, scope: str, listener: Callable[[dict[str, str]], None]
    ) -> None:
        """Be told of every change of a scope's dynamic broker configs, by any broker (a data
        watch; Kafka's brokers follow ``/config/changes`` for the same)."""

        def on_configs(data: bytes | None, stat: ZnodeStat | None) -> None:
            try:
                configs = _broker_configs_from_node(data) if data else {}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("unreadable broker configs in ZooKeeper, ignored: %s", exc)
                return
            try:
                listener(configs)
            except Exception:
                log.exception("broker config listener failed")

        self.client.DataWatch(_broker_config_path(scope), on_configs)

    # -- client quotas ----------------------------------------------------------------------------
    def client_quotas(self) -> dict[Entity, dict[str, float]]:
        return self._read_quotas()[0]

    def _read_quotas(self) -> tuple[dict[Entity, dict[str, float]], int]:
        """The quotas and the node's version (-1: no node yet)."""
        try:
            data, stat = self._retry(self.client.get, CLIENT_QUOTAS_PATH)
        except NoNodeError:
            return {}, -1
        return _quotas_from_node(data), stat.version

    def alter_client_quotas(
        self, changes: Mapping[Entity, Mapping[str, float | None]]
    ) -> dict[Entity, dict[str, float]]:
        """A conditional write of the quotas node on the version the change was computed
        from; when another broker wrote meanwhile, re-read and apply the change again (the
        change sets and removes keys, so it means the same on the newer quotas)."""
        while True:
            quotas, version = self._read_quotas()
            for entity, ops in changes.items():
                updated = apply_ops(quotas.get(entity, {}), ops)
                if updated:
                    quotas[entity] = updated
                else:
                    quotas.pop(entity, None)
            data = _quotas_node(quotas)
            try:
                if version < 0:
                    self._retry(self.client.create, CLIENT_QUOTAS_PATH, data)
                else:
                    self._retry(self.client.set, CLIENT_QUOTAS_PATH, data, version=version)
            except (BadVersionError, NodeExistsError):
                try:
                    now, _ = self._retry(self.client.get, CLIENT_QUOTAS_PATH)
                except NoNodeError:
                    continue
                if now == data:  # our own write, retried after a lost connection
                    return quotas
                continue
            return quotas

    def add_quota_listener(self, listener: QuotaListener) -> None:
        """Be told of every change of the client quotas, by any broker (a data watch)."""

        def on_quotas(data: bytes | None, stat: ZnodeStat | None) -> None:
            try:
                quotas = _quotas_from_node(data) if data else {}
            except (ValueError, KeyError, TypeError) as exc:
                log.error("unreadable client quotas in ZooKeeper, ignored: %s", exc)
                return
            try:
                listener(quotas)
            except Exception:
                log.exception("client quota listener failed")

        self.client.DataWatch(CLIENT_QUOTAS_PATH, on_quotas)

    # -- producer ids -----------------------------------------------------------------------------
    def allocate_producer_id(self) -> int:
        with self._pid_lock:
            if self._pid_next >= self._pid_end:
                self._pid_next, self._pid_end = self._reserve_block()
            pid = self._pid_next
            self._pid_next += 1
            return pid

    def _reserve_block(self) -> tuple[int, int]:
        """The next block of PRODUCER_ID_BLOCK ids, reserved by a conditional write on the
        latest block (two brokers reserving at once: one write fails and retries)."""
        while True:
            try:
                data, stat = self._retry(self.client.get, PRODUCER_ID_BLOCK_PATH)
            except NoNodeError:
                start = 0
                node = _json(self._block_node(start))
                try:
                    self._retry(self.client.create, PRODUCER_ID_BLOCK_PATH, node)
                    return start, start + PRODUCER_ID_BLOCK
                except NodeExistsError:
                    continue
            start = int(json.loads(data)["block_end"]) + 1
            try:
                self._retry(
                    self.client.set,
                    PRODUCER_ID_BLOCK_PATH,
                    _json(self._block_node(start)),
                    version=stat.version,
                )
            except BadVersionError:
                continue  # another broker took this block
            return start, start + PRODUCER_ID_BLOCK

    def _block_node(self, start: int) -> dict[str, int]:
        return {
            "version": 1,
            "broker": self._broker_id,
            "block_start": start,
            "block_end": start + PRODUCER_ID_BLOCK - 1,
        }

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def _topic_node(record: TopicRecord) -> bytes:
    return _json(
        {
            "version": 1,
            "topic_id": str(record.topic_id),
            "journal_partitions": encode_mapping(record.journal_partitions),
        }
    )


def _broker_config_path(scope: str) -> str:
    if scope == CLUSTER_DEFAULT:
        return BROKER_CONFIG_PATH
    if not scope.isdigit():
        raise ValueError(f"not a broker config scope: {scope!r}")
    return f"{BROKER_CONFIGS_PATH}/{int(scope)}"


def _broker_configs_from_node(data: bytes) -> dict[str, str]:
    return {str(k): str(v) for k, v in json.loads(data)["config"].items()}


def _config_node(configs: Mapping[str, str]) -> bytes:
    return _json({"version": 1, "config": dict(configs)})


def _topic_record(name: str, topic_data: bytes, config_data: bytes) -> TopicRecord:
    node = json.loads(topic_data)
    config = json.loads(config_data)["config"]
    return TopicRecord(
        name=name,
        topic_id=uuid.UUID(node["topic_id"]),
        journal_partitions=decode_mapping(node["journal_partitions"]),
        configs={str(k): str(v) for k, v in config.items()},
    )


def _quotas_node(quotas: Mapping[Entity, Mapping[str, float]]) -> bytes:
    entries = [
        {"entity": [list(pair) for pair in entity], "config": dict(values)}
        for entity, values in sorted(quotas.items(), key=lambda item: repr(item[0]))
    ]
    return _json({"version": 1, "quotas": entries})


def _quotas_from_node(data: bytes) -> dict[Entity, dict[str, float]]:
    out: dict[Entity, dict[str, float]] = {}
    for entry in json.loads(data)["quotas"]:
        entity = entity_of((str(t), None if n is None else str(n)) for t, n in entry["entity"])
        out[entity] = {str(k): float(v) for k, v in entry["config"].items()}
    return out


def _raise_first(results: list[Any]) -> None:
    for result in results:
        if isinstance(result, Exception):
            raise result


def _raise_conflict(results: list[Any], name: str) -> None:
    if any(isinstance(r, BadVersionError) for r in results):
        raise ConcurrentChangeError(f"topic {name} changed meanwhile (another broker changed it)")
    _raise_first(results)
