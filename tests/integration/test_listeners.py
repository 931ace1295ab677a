"""Kafka's listener configs on a real broker: several listeners given as ``--listeners`` (and
as ``STONEMQ_LISTENERS``), each answering its clients with its own advertised address, and
DescribeConfigs(BROKER) reporting listeners, advertised.listeners and the other broker configs
under Kafka's names with their sources and synonyms."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType
from conftest import Broker, free_port
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from . import rawclient
from .helpers import Msg, consume, create_topic, produce

pytestmark = pytest.mark.timeout(120)


class ListenersBroker(Broker):
    """A broker started with ``--listeners`` / ``--advertised-listeners`` instead of
    ``--listen`` (``port`` is the PLAINTEXT listener's, which readiness checks)."""

    def __init__(self, data_dir: Path, log_path: Path, args: tuple[str, ...], **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(data_dir, log_path, **kw)
        self.listener_args = args

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--listen")
        return command[:at] + list(self.listener_args) + command[at + 2 :]


@pytest.fixture(scope="module")
def two_listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, int]]:
    base = tmp_path_factory.mktemp("listeners")
    port, internal = free_port(), free_port()
    broker = ListenersBroker(
        base / "data",
        base / "broker.log",
        (
            "--listeners",
            f"PLAINTEXT://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}",
            "--advertised-listeners",
            f"PLAINTEXT://127.0.0.1:{port},INTERNAL://localhost:{internal}",
        ),
        port=port,
        settings={"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"},
    )
    broker.start()
    yield broker, internal
    broker.stop()


def _metadata_brokers(host: str, port: int) -> list[tuple[int, str, int]]:
    req = rawclient.schema("metadata", 12, "request")
    resp = rawclient.schema("metadata", 12, "response")
    with rawclient.RawConnection(host, port) as conn:
        answer = conn.request(
            req.MetadataRequest(
                topics=(),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            resp.MetadataResponse,
        )
    return [(b.node_id, b.host, b.port) for b in answer.brokers]


def test_each_listener_advertises_its_own_address(two_listeners):
    broker, internal = two_listeners
    assert _metadata_brokers("127.0.0.1", broker.port) == [(1, "127.0.0.1", broker.port)]
    assert _metadata_brokers("127.0.0.1", internal) == [(1, "localhost", internal)]
    # a client that bootstraps on the internal listener stays on it (localhost:internal)
    bootstrap = f"localhost:{internal}"
    topic = create_topic(bootstrap)
    produce(bootstrap, topic, [Msg(b"k", b"via internal")])
    got = consume(broker.bootstrap, topic, 1)
    assert [(m.key, m.value) for m in got] == [(b"k", b"via internal")]


def _broker_configs(bootstrap: str) -> dict[str, object]:
    client = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "1")
    return client.describe_configs([resource], request_timeout=15)[resource].result(timeout=20)


def test_describe_configs_reports_kafka_listener_names(two_listeners):
    broker, internal = two_listeners
    configs = _broker_configs(broker.bootstrap)
    listeners = configs["listeners"]
    assert listeners.value == f"PLAINTEXT://127.0.0.1:{broker.port},INTERNAL://127.0.0.1:{internal}"
    assert listeners.source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert listeners.is_read_only
    advertised = configs["advertised.listeners"]
    assert (
        advertised.value == f"PLAINTEXT://127.0.0.1:{broker.port},INTERNAL://localhost:{internal}"
    )
    assert advertised.source == ConfigSource.STATIC_BROKER_CONFIG.value
    protocol_map = configs["listener.security.protocol.map"]
    assert protocol_map.value == "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT"
    assert protocol_map.source == ConfigSource.STATIC_BROKER_CONFIG.value
    # the aliases are not configs of their own
    assert "listen" not in configs and "advertise" not in configs


def _describe_broker(broker: Broker) -> dict[str, object]:
    """DescribeConfigs v4 (raw) of broker 1 with synonyms: entries by name."""
    req = rawclient.schema("describe_configs", 4, "request")
    resp = rawclient.schema("describe_configs", 4, "response")
    with rawclient.RawConnection(broker.host, broker.port) as conn:
        answer = conn.request(
            req.DescribeConfigsRequest(
                resources=(
                    req.DescribeConfigsResource(
                        resource_type=4, resource_name="1", configuration_keys=None
                    ),
                ),
                include_synonyms=True,
                include_documentation=False,
            ),
            resp.DescribeConfigsResponse,
        )
    (result,) = answer.results
    assert result.error_code == 0
    return {c.name: c for c in result.configs}


def test_broker_config_sources_and_synonyms(module_broker):
    """A config left alone is DEFAULT_CONFIG; one given to the process STATIC_BROKER_CONFIG
    (the --listen alias gives listeners); one altered DYNAMIC_BROKER_CONFIG (kafka-python's
    AlterConfigs), with the lower levels as its synonyms, highest first."""
    client = KafkaAdminClient(bootstrap_servers=module_broker.bootstrap, request_timeout_ms=15000)
    try:
        resource = KPConfigResource(ConfigResourceType.BROKER, "1", {"log.retention.ms": "3600000"})
        client.alter_configs([resource])
        entries = _describe_broker(module_broker)
        listeners = entries["listeners"]
        assert listeners.value == f"PLAINTEXT://127.0.0.1:{module_broker.port}"
        assert listeners.config_source == ConfigSource.STATIC_BROKER_CONFIG.value
        assert [(s.name, s.value, s.source) for s in listeners.synonyms] == [
            ("listeners", listeners.value, ConfigSource.STATIC_BROKER_CONFIG.value),
            ("listeners", "PLAINTEXT://127.0.0.1:9092", ConfigSource.DEFAULT_CONFIG.value),
        ]
        retention = entries["log.retention.ms"]
        assert retention.value == "3600000"
        assert retention.config_source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert [(s.value, s.source) for s in retention.synonyms] == [
            ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value),
            (str(7 * 24 * 3600 * 1000), ConfigSource.DEFAULT_CONFIG.value),
        ]
        assert entries["advertised.listeners"].config_source == ConfigSource.DEFAULT_CONFIG.value
        assert entries["advertised.listeners"].value is None
        assert entries["num.partitions"].config_source == ConfigSource.DEFAULT_CONFIG.value
    finally:
        client.alter_configs([KPConfigResource(ConfigResourceType.BROKER, "1", {})])
        client.close()


def test_listeners_from_the_environment(broker_factory):
    """STONEMQ_LISTENERS names the listeners when no flag does (the broker fixture passes
    --listen, which as a flag would win, so this broker is started without it)."""
    port = free_port()
    broker = ListenersBroker(
        broker_factory.base / "env-data",
        broker_factory.base / "env-broker.log",
        (),
        port=port,
        settings={"listeners": f"PLAINTEXT://127.0.0.1:{port}"},
    )
    broker.start()
    try:
        assert _metadata_brokers("127.0.0.1", port) == [(1, "127.0.0.1", port)]
        assert (
            _broker_configs(broker.bootstrap)["listeners"].value == f"PLAINTEXT://127.0.0.1:{port}"
        )
    finally:
        broker.stop()
