"""``stonemq cluster describe``: a cluster as ZooKeeper holds it (brokers, the controller and
its epoch, every journal partition's replicas, leader, leader epoch and ISR, and how many
topic partitions each journal partition carries). Reads ZooKeeper only; changes nothing."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from rich.console import Console
from rich.table import Table

from stonemq.cluster.controller import read_controller, read_journal_partitions
from stonemq.cluster.membership import read_brokers
from stonemq.metadata.zookeeper import TOPICS_PATH, decode_mapping

cluster_app = typer.Typer(
    name="cluster",
    help="A cluster's brokers, controller and journal partitions, read from ZooKeeper.",
    no_args_is_help=True,
    add_completion=False,
)

ConnectOpt = Annotated[
    str,
    typer.Option(
        "--zookeeper-connect",
        envvar="STONEMQ_ZOOKEEPER_CONNECT",
        help="Kafka's zookeeper.connect: host:port[,host:port...]\\[/chroot]",
    ),
]


def describe_cluster(client: KazooClient) -> dict[str, Any]:
    """The cluster's brokers, controller and journal partitions (JSON-ready)."""
    brokers = {
        b: {"endpoints": node.get("endpoints"), "rack": node.get("rack")}
        for b, node in read_brokers(client).items()
    }
    carried: dict[int, int] = {}
    try:
        topics = client.retry(client.get_children, TOPICS_PATH)
    except NoNodeError:
        topics = []
    for topic in topics:
        try:
            data, _ = client.retry(client.get, f"{TOPICS_PATH}/{topic}")
        except NoNodeError:
            continue
        for j in decode_mapping(json.loads(data)["journal_partitions"]):
            carried[j] = carried.get(j, 0) + 1
    controller, epoch = read_controller(client)
    return {
        "brokers": brokers,
        "controller": controller,
        "controller_epoch": epoch,
        "journal_partitions": [
            {
                "id": j,
                "replicas": list(p.assignment.replicas),
                "leader": p.state.leader,
                "leader_epoch": p.state.leader_epoch,
                "isr": list(p.state.isr),
                "topic_partitions": carried.get(j, 0),
            }
            for j, p in read_journal_partitions(client).items()
        ],
    }


@cluster_app.command()
def describe(
    zookeeper_connect: ConnectOpt,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print the brokers, the controller and every journal partition."""
    client = KazooClient(zookeeper_connect, read_only=True)
    try:
        client.start(10)
    except Exception as exc:
        typer.echo(f"cannot reach ZooKeeper at {zookeeper_connect}: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        view = describe_cluster(client)
    finally:
        client.stop()
        client.close()
    if as_json:
        typer.echo(json.dumps(view, indent=2))
        return
    console = Console()
    brokers = Table(title="brokers")
    for column in ("id", "endpoints", "rack", "controller"):
        brokers.add_column(column)
    for broker, node in view["brokers"].items():
        brokers.add_row(
            str(broker),
            ", ".join(node["endpoints"] or []),
            node["rack"] or "-",
            f"yes (epoch {view['controller_epoch']})" if broker == view["controller"] else "",
        )
    console.print(brokers)
    journals = Table(title="journal partitions")
    for column in ("id", "replicas", "leader", "leader epoch", "isr", "topic partitions"):
        journals.add_column(column, justify="right")
    for p in view["journal_partitions"]:
        journals.add_row(
            str(p["id"]),
            ",".join(map(str, p["replicas"])),
            "none" if p["leader"] < 0 else str(p["leader"]),
            str(p["leader_epoch"]),
            ",".join(map(str, p["isr"])),
            str(p["topic_partitions"]),
        )
    console.print(journals)
