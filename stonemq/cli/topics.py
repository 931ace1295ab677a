"""``stonemq topics``: list, describe, create, delete and alter topics of a running broker.

Talks to the broker over the Kafka protocol with confluent-kafka's AdminClient, like Kafka's
``kafka-topics.sh`` (same ``--bootstrap-server`` flag). Tables for people; ``--json`` prints
one JSON document for scripts. Also holds the helpers ``stonemq groups`` shares.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Annotated, Any, NoReturn

import typer
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from rich.console import Console
from rich.table import Table

from stonemq.coordinator.group_log import OFFSETS_TOPIC

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
TIMEOUT_S = 15.0
KAFKA_INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, "__transaction_state"})
"""Kafka's ``Topic.isInternal`` names: what ``--exclude-internal`` leaves out (a user topic
named ``__audit`` is listed, as Kafka's tool lists it)."""


def _bootstrap_servers(value: str) -> str:
    """``--bootstrap-server`` as Kafka's tools check it (ClientUtils.parseAndValidateAddresses):
    HOST:PORT[,...] with a port of 0-65535; librdkafka took 99999 modulo 65536."""
    for entry in value.split(","):
        host, colon, port = entry.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or int(port) > 65535:
            raise typer.BadParameter(f"Invalid url in bootstrap.servers: {entry.strip()}")
    return value


BootstrapOption = Annotated[
    str,
    typer.Option("--bootstrap-server", help="HOST:PORT of a broker", callback=_bootstrap_servers),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]

topics_app = typer.Typer(
    name="topics",
    help="List, describe, create, delete and alter topics on a running broker.",
    no_args_is_help=True,
    add_completion=False,
)


# -- helpers shared with stonemq groups ----------------------------------------------------
def admin_client(bootstrap: str) -> AdminClient:
    """An admin client that never creates a topic by asking for it: librdkafka's Metadata
    requests of a producer-type handle (the AdminClient's) allow auto-creation by default,
    so ``topics describe nosuch`` created ``nosuch`` (Kafka's tools never do)."""
    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": 10000,
            "log_level": 3,
            "allow.auto.create.topics": False,
        }
    )


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"stonemq: {message}", err=True)
    raise typer.Exit(code)


def result(future: Future[Any], what: str) -> Any:
    """The future's result, or a clean exit with Kafka's error."""
    try:
        return future.result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if error is None or not hasattr(error, "name"):
            fail(f"{what}: {exc}")
        fail(f"{what}: {error.name()}: {error.str()}")
    except TimeoutError:
        fail(f"{what}: no answer within {TIMEOUT_S:.0f} s (is the broker running?)")


def emit_json(document: Any) -> None:
    json.dump(document, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def parse_configs(pairs: Sequence[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(f"expected NAME=VALUE, got {pair!r}", 2)
        configs[name] = value
    return configs


def topic_metadata(client: AdminClient, topic: str | None = None) -> dict[str, Any]:
    try:
        md = client.list_topics(topic, timeout=TIMEOUT_S)
    except KafkaException as exc:
        fail(f"metadata: {exc}")
    topics = {}
    for name, tmd in md.topics.items():
        if tmd.error is not None:
            if topic is not None:
                fail(f"topic {name}: {tmd.error.str()}")
            continue
        topics[name] = tmd
    return topics


# -- commands --------------------------------------------------------------------------------
@topics_app.command("list")
def list_topics(
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
    exclude_internal: Annotated[
        bool, typer.Option("--exclude-internal", help="leave out the internal topics")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Topic names, one per line (or a JSON list)."""
    topics = topic_metadata(admin_client(bootstrap_server))
    # Kafka's TopicCommand leaves out Topic.isInternal's names only, not every "__" name
    names = sorted(n for n in topics if not (exclude_internal and n in KAFKA_INTERNAL_TOPICS))
    if as_json:
        emit_json(names)
    else:
        for name in names:
            typer.echo(name)


@topics_app.command()
def describe(
    topic: Annotated[str | None, typer.Argument(help="one topic (default: all)")] = None,
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Partitions, leaders, replicas and non-default configs of each topic."""
    client = admin_client(bootstrap_server)
    topics = topic_metadata(client, topic)
    out = []
    for name in sorted(topics):
        tmd = topics[name]
        resource = ConfigResource(ResourceType.TOPIC, name)
        entries = result(client.describe_configs([resource])[resource], f"configs of {name}")
        configs = {
            e.name: e.value for e in entries.values() if not e.is_default and e.value is not None
        }
        partitions = [
            {
                "partition": p.id,
                "leader": p.leader,
                "replicas": list(p.replicas),
                "isr": list(p.isrs),
            }
            for p in sorted(tmd.partitions.values(), key=lambda p: p.id)
        ]
        out.append({"topic": name, "partitions": partitions, "configs": configs})
    if as_json:
        emit_json(out)
        return
    for t in out:
        configs = ", ".join(f"{k}={v}" for k, v in sorted(t["configs"].items())) or "(defaults)"
        print_table(
            f"{t['topic']}: {len(t['partitions'])} partitions; {configs}",
            ("partition", "leader", "replicas", "isr"),
            ((p["partition"], p["leader"], p["replicas"], p["isr"]) for p in t["partitions"]),
        )


@topics_app.command()
def create(
    topic: Annotated[str, typer.Argument(help="topic name")],
    partitions: Annotated[int, typer.Option(help="-1: the broker's num.partitions")] = -1,
    replication_factor: Annotated[int, typer.Option(help="1 on a single broker")] = -1,
    config: Annotated[
        list[str] | None, typer.Option(help="NAME=VALUE topic config (repeatable)")
    ] = None,
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
) -> None:
    """Create a topic."""
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=parse_configs(config or []),
    )
    client = admin_client(bootstrap_server)
    try:  # confluent-kafka checks the counts' ranges as it sends
        futures = client.create_topics([new], request_timeout=TIMEOUT_S)
    except ValueError as exc:
        fail(f"create {topic}: {exc}", 2)
    result(futures[topic], f"create {topic}")
    typer.echo(f"Created topic {topic}.")


@topics_app.command()
def delete(
    topic: Annotated[str, typer.Argument(help="topic name")],
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
) -> None:
    """Delete a topic and its data (never an internal topic, as with kafka-topics)."""
    if topic == OFFSETS_TOPIC:
        fail(f"Topic {topic} is a kafka internal topic and is not allowed to be deleted.")
    client = admin_client(bootstrap_server)
    result(client.delete_topics([topic], request_timeout=TIMEOUT_S)[topic], f"delete {topic}")
    typer.echo(f"Deleted topic {topic}.")


@topics_app.command()
def alter(
    topic: Annotated[str, typer.Argument(help="topic name")],
    partitions: Annotated[
        int | None, typer.Option(help="grow the topic to this many partitions")
    ] = None,
    config: Annotated[
        list[str] | None, typer.Option(help="NAME=VALUE config to set (repeatable)")
    ] = None,
    delete_config: Annotated[
        list[str] | None, typer.Option(help="config to reset to its default (repeatable)")
    ] = None,
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
) -> None:
    """Add partitions and/or set or delete topic configs (incrementally)."""
    if partitions is None and not config and not delete_config:
        fail("nothing to alter: give --partitions, --config or --delete-config", 2)
    client = admin_client(bootstrap_server)
    if partitions is not None:
        try:  # confluent-kafka checks the count's range as it sends
            futures = client.create_partitions([NewPartitions(topic, partitions)])
        except ValueError as exc:
            fail(f"partitions of {topic}: {exc}", 2)
        result(futures[topic], f"partitions of {topic}")
        typer.echo(f"Topic {topic} now has {partitions} partitions.")
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in parse_configs(config or []).items()
    ] + [
        ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)
        for name in delete_config or []
    ]
    if entries:
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        result(client.incremental_alter_configs([resource])[resource], f"configs of {topic}")
        typer.echo(f"Altered configs of {topic}.")
