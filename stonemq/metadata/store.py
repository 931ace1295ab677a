"""The metadata store interface: what every backend (SQLite, ZooKeeper) must provide."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stonemq.quotas.entity import Entity

CLUSTER_DEFAULT = ""
"""The scope of the cluster-wide dynamic broker configs (AlterConfigs on broker resource
``""``); a broker's own scope is its id as a string."""


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


class MetadataStore(ABC):
    """Durable metadata. Every mutating call is atomic and durable when it returns."""

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
