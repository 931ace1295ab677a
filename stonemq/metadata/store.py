"""The metadata store interface: what every backend (SQLite, ZooKeeper) must provide."""

from __future__ import annotations

import base64
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stonemq.quotas.entity import Entity

CLUSTER_DEFAULT = ""
"""The scope of the cluster-wide dynamic broker configs (AlterConfigs on broker resource
``""``); a broker's own scope is its id as a string."""


def random_uuid() -> uuid.UUID:
    """A random id as Kafka's ``Uuid.randomUuid`` draws one: never the reserved zero and
    one ids, and never one whose URL-safe base64 form starts with ``-`` (Kafka's tools would
    read such a topic or cluster id as an option; about 1 id in 64 did, audit35 p5)."""
    while True:
        value = uuid.uuid4()
        if value.int > 1 and not uuid_text(value).startswith("-"):
            return value


def uuid_text(value: uuid.UUID) -> str:
    """Kafka's string form of a Uuid: URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


class TopicExistsError(Exception):
    """A topic with that name already exists."""


class UnknownTopicError(Exception):
    """No topic with that name exists."""


class ConcurrentChangeError(Exception):
    """Another broker changed the topic between this broker's read and its conditional write
    (a cluster's store only): re-read, re-validate, and try again or answer the client."""


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One topic as the metadata store keeps it.

    ``journal_partitions[p]`` is the journal partition that topic partition ``p`` is routed
    to; it is chosen once, when the partition is created, and never changes.
    ``configs`` holds only the topic-level overrides the user set (Kafka names and string
    values, as DescribeConfigs reports them); defaults come from the broker settings.
    """

    name: str
    topic_id: uuid.UUID
    journal_partitions: tuple[int, ...]
    configs: Mapping[str, str] = field(default_factory=dict)

    @property
    def partitions(self) -> int:
        return len(self.journal_partitions)


class TopicTable(dict[str, TopicRecord]):
    """A store's topics by name, with the sum of their partitions kept as they change
    (``partitions``): the max.partitions check reads it for every topic created, and summing
    every topic's each time made creating many topics quadratic (auto-creating 20,000 topics
    beside 40,000 held the event loop for minutes)."""

    def __init__(self, records: Mapping[str, TopicRecord] | None = None) -> None:
        super().__init__()
        self.partitions = 0
        for name, record in (records or {}).items():
            self[name] = record

    def __setitem__(self, name: str, record: TopicRecord) -> None:
        old = self.get(name)
        if old is not None:
            self.partitions -= old.partitions
        self.partitions += record.partitions
        super().__setitem__(name, record)

    def __delitem__(self, name: str) -> None:
        self.partitions -= self[name].partitions
        super().__delitem__(name)

    def pop(self, name: str, *default: TopicRecord | None) -> TopicRecord | None:  # type: ignore[override]
        if name in self:
            self.partitions -= self[name].partitions
        return super().pop(name, *default)


class MetadataStore(ABC):
    """Durable metadata. Every mutating call is atomic and durable when it returns."""

    def partition_total(self) -> int:
        """Partitions of every topic (kept up to date by the store's :class:`TopicTable`)."""
        return sum(record.partitions for record in self.list_topics())

    @abstractmethod
    def cluster_id(self) -> str:
        """The cluster id, generated on first use and kept forever."""

    @abstractmethod
    def list_topics(self) -> list[TopicRecord]: ...

    @abstractmethod
    def get_topic(self, name: str) -> TopicRecord | None: ...

    @abstractmethod
    def create_topic(
        self, name: str, journal_partitions: list[int], configs: Mapping[str, str]
    ) -> TopicRecord:
        """Create a topic with a fresh random topic id. Raises :class:`TopicExistsError`."""

    @abstractmethod
    def delete_topic(self, name: str) -> TopicRecord:
        """Remove a topic. Raises :class:`UnknownTopicError`."""

    @abstractmethod
    def add_partitions(self, name: str, journal_partitions: list[int]) -> TopicRecord:
        """Append partitions routed to the given journal partitions."""

    @abstractmethod
    def set_topic_configs(self, name: str, configs: Mapping[str, str]) -> TopicRecord:
        """Replace the topic's whole set of overrides."""

    @abstractmethod
    def broker_configs(self, scope: str = CLUSTER_DEFAULT) -> dict[str, str]:
        """Dynamic broker-level overrides (set through AlterConfigs) of one scope: the
        cluster-wide default (``""``) or one broker's own (its id as a string)."""

    @abstractmethod
    def update_broker_configs(
        self,
        change: Callable[[dict[str, str]], dict[str, str]],
        scope: str = CLUSTER_DEFAULT,
    ) -> dict[str, str]:
        """Replace a scope's dynamic broker-level overrides by ``change(current)``, atomically
        against other brokers' changes (``change`` may run more than once, on newer overrides
        each time; whatever it raises is raised). Returns the overrides written."""

    def set_broker_configs(
        self, configs: Mapping[str, str], scope: str = CLUSTER_DEFAULT
    ) -> dict[str, str]:
        """Replace the whole set of a scope's dynamic broker-level overrides."""
        return self.update_broker_configs(lambda _current: dict(configs), scope)

    @abstractmethod
    def client_quotas(self) -> dict[Entity, dict[str, float]]:
        """Every configured client quota: entity -> {key: value}."""

    @abstractmethod
    def alter_client_quotas(
        self, changes: Mapping[Entity, Mapping[str, float | None]]
    ) -> dict[Entity, dict[str, float]]:
        """Set (a value) or remove (None) quota keys of entities, all at once; an entity left
        without keys is removed. Returns every configured quota after the change."""

    @abstractmethod
    def allocate_producer_id(self) -> int:
        """A producer id never handed out before, surviving restarts."""

    @abstractmethod
    def close(self) -> None: ...
