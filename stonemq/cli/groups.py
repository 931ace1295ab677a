"""``stonemq groups``: list, describe, reset the offsets of, and delete consumer groups.

Kafka's ``kafka-consumer-groups.sh`` habits over the Kafka protocol (confluent-kafka's
AdminClient): ``describe`` shows each partition's committed offset, log end offset and lag next
to the member that owns it; ``reset-offsets`` prints the plan and changes nothing unless
``--execute``, and only for a group with no active members (Empty or Dead), as Kafka requires;
``--to-offset`` is clamped to the partition's [earliest, latest] range, also as Kafka does.
"""

from __future__ import annotations

import datetime
import re
import time
from typing import Annotated, Any

import typer
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from stonemq.cli.topics import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    JsonOption,
    admin_client,
    emit_json,
    fail,
    print_table,
    result,
    topic_metadata,
)

INACTIVE_STATES = {"EMPTY", "DEAD"}

groups_app = typer.Typer(
    name="groups",
    help="List, describe, reset offsets of and delete consumer groups on a running broker.",
    no_args_is_help=True,
    add_completion=False,
)


def _state_name(state: Any) -> str:
    return str(getattr(state, "name", state)).upper()


def _state_key(name: str) -> str:
    """A state as ``--state`` compares it: Kafka's spelling (``PreparingRebalance``, any
    case) and confluent-kafka's (``PREPARING_REBALANCING``) alike."""
    return name.upper().replace("_", "").replace("-", "").replace("REBALANCING", "REBALANCE")


def _describe(client: AdminClient, group: str) -> Any:
    return result(client.describe_consumer_groups([group])[group], f"describe {group}")


def _committed(client: AdminClient, group: str) -> dict[tuple[str, int], int]:
    request = [ConsumerGroupTopicPartitions(group)]
    answer = result(client.list_consumer_group_offsets(request)[group], f"offsets of {group}")
    return {
        (tp.topic, tp.partition): tp.offset
        for tp in answer.topic_partitions or []
        if tp.offset >= 0
    }


def _offsets(
    client: AdminClient, partitions: list[tuple[str, int]], spec: OffsetSpec
) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    futures = client.list_offsets({TopicPartition(t, p): spec for t, p in partitions})
    return {
        (tp.topic, tp.partition): result(f, f"offsets of {tp.topic}-{tp.partition}").offset
        for tp, f in futures.items()
    }


@groups_app.command("list")
def list_groups(
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
    state: Annotated[
        list[str] | None, typer.Option(help="only groups in this state (repeatable)")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Every group the broker knows, with its state."""
    client = admin_client(bootstrap_server)
    listed = result(client.list_consumer_groups(), "list groups")
    if listed.errors:  # no broker answered (an empty table would say "no groups")
        fail("list groups: " + "; ".join(f"{e.name()}: {e.str()}" for e in listed.errors))
    wanted = {_state_key(s) for s in state or []}
    known = {_state_key(s.name) for s in ConsumerGroupState}
    if wanted - known:  # as kafka-consumer-groups.sh --state refuses one it does not know
        fail(
            f"invalid state {', '.join(state or [])}; the states are "
            "PreparingRebalance, CompletingRebalance, Stable, Empty, Dead, Unknown",
            2,
        )
    rows = sorted(
        (g.group_id, _state_name(g.state), "simple" if g.is_simple_consumer_group else "consumer")
        for g in listed.valid
        if not wanted or _state_key(_state_name(g.state)) in wanted
    )
    if as_json:
        emit_json([{"group": g, "state": s, "kind": k} for g, s, k in rows])
    else:
        print_table("consumer groups", ("group", "state", "kind"), rows)


@groups_app.command()
def describe(
    group: Annotated[str, typer.Argument(help="group id")],
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Members, their assignments, and committed offset, log end offset and lag per partition."""
    client = admin_client(bootstrap_server)
    desc = _describe(client, group)
    committed = _committed(client, group)
    owner: dict[tuple[str, int], Any] = {}
    members = []
    for m in desc.members:
        assigned = [(tp.topic, tp.partition) for tp in m.assignment.topic_partitions]
        for tp in assigned:
            owner[tp] = m
        members.append(
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "host": m.host,
                "assignment": [f"{t}-{p}" for t, p in sorted(assigned)],
            }
        )
    partitions = sorted(set(committed) | set(owner))
    ends = _offsets(client, partitions, OffsetSpec.latest())
    rows = []
    for tp in partitions:
        m = owner.get(tp)
        offset, end = committed.get(tp), ends.get(tp)
        lag = end - offset if offset is not None and end is not None else None
        rows.append(
            {
                "topic": tp[0],
                "partition": tp[1],
                "committed_offset": offset,
                "log_end_offset": end,
                "lag": lag,
                "member_id": m.member_id if m else None,
                "client_id": m.client_id if m else None,
                "host": m.host if m else None,
            }
        )
    document = {
        "group": group,
        "state": _state_name(desc.state),
        "assignor": desc.partition_assignor,
        "members": members,
        "partitions": rows,
    }
    if as_json:
        emit_json(document)
        return
    if document["state"] == "DEAD" and not members and not rows:
        # what kafka-consumer-groups.sh --describe says (exit 0) instead of empty tables
        typer.echo(f"Error: Consumer group '{group}' does not exist.", err=True)
        return
    typer.echo(f"Group {group}: {document['state']}, assignor {desc.partition_assignor or '-'}")
    columns = ("topic", "partition", "committed_offset", "log_end_offset", "lag")
    print_table(
        "offsets",
        (*columns, "member_id", "client_id", "host"),
        ([r[c] for c in (*columns, "member_id", "client_id", "host")] for r in rows),
    )
    print_table(
        "members",
        ("member_id", "group_instance_id", "client_id", "host", "assignment"),
        (
            (
                m["member_id"],
                m["group_instance_id"],
                m["client_id"],
                m["host"],
                ", ".join(m["assignment"]),
            )
            for m in members
        ),
    )


_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?"
    r"(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration_ms(text: str) -> int:
    """Milliseconds of an ISO-8601 duration as Java's ``Duration.parse`` reads it (what
    kafka-consumer-groups.sh --by-duration takes): ``PnDTnHnMn.nS``, e.g. ``PT1H30M``,
    ``P1D``, ``-PT10S``. Raises ValueError for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or text.strip().upper().endswith("T") or not any(match.groups()[1:]):
        raise ValueError(f"not an ISO-8601 duration (PnDTnHnMn.nS): {text!r}")
    sign, days, hours, minutes, seconds, fraction = match.groups()
    ms = (
        int(days or 0) * 86_400_000
        + int(hours or 0) * 3_600_000
        + int(minutes or 0) * 60_000
        + int(seconds or 0) * 1000
    )
    if fraction:
        part = int(fraction.ljust(3, "0")[:3])
        ms += -part if (seconds or "").startswith("-") else part
    return -ms if sign == "-" else ms


def _target_spec(
    to_earliest: bool,
    to_latest: bool,
    to_current: bool,
    to_datetime: str | None,
    by_duration: str | None,
    to_offset: int | None,
    shift_by: int | None,
) -> tuple[str, OffsetSpec | int | None]:
    """The reset scenario: (kind, spec), spec an OffsetSpec to ask the log, an offset or a
    shift, or None (``current``)."""
    chosen = [
        name
        for name, given in (
            ("earliest", to_earliest),
            ("latest", to_latest),
            ("current", to_current),
            ("datetime", to_datetime is not None),
            ("duration", by_duration is not None),
            ("offset", to_offset is not None),
            ("shift", shift_by is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        fail(
            "give exactly one of --to-earliest, --to-latest, --to-current, --to-datetime, "
            "--by-duration, --to-offset, --shift-by",
            2,
        )
    if to_earliest:
        return "earliest", OffsetSpec.earliest()
    if to_latest:
        return "latest", OffsetSpec.latest()
    if to_current:
        return "current", None
    if to_offset is not None:
        return "offset", to_offset
    if shift_by is not None:
        return "shift", shift_by
    if by_duration is not None:
        try:
            back_ms = parse_duration_ms(by_duration)
        except ValueError as exc:
            fail(f"--by-duration: {exc}", 2)
        now_ms = int(time.time() * 1000)
        return "datetime", OffsetSpec.for_timestamp(now_ms - back_ms)
    try:
        when = datetime.datetime.fromisoformat(to_datetime or "")
    except ValueError:
        fail(f"--to-datetime: not an ISO-8601 date-time: {to_datetime!r}", 2)
    if when.tzinfo is None:  # UTC, as Kafka's tool reads it (Utils.getDateTime appends Z)
        when = when.replace(tzinfo=datetime.UTC)
    return "datetime", OffsetSpec.for_timestamp(int(when.timestamp() * 1000))


def _scope(
    client: AdminClient, group: str, topics: list[str] | None, all_topics: bool
) -> list[tuple[str, int]]:
    """The partitions to reset: every partition the group committed (``--all-topics``), or
    those of each ``--topic TOPIC[:P,P,...]`` (all of the topic's without a list)."""
    if all_topics == bool(topics):
        fail("give one reset scope: --all-topics, or --topic (repeatable)", 2)
    if all_topics:
        return sorted(_committed(client, group))
    wanted: list[tuple[str, list[int] | None]] = []
    for spec in topics or []:
        name, _, listed = spec.partition(":")
        try:  # TOPIC:P,P,... as kafka-consumer-groups.sh --topic takes it
            wanted.append((name, [int(p) for p in listed.split(",")] if listed else None))
        except ValueError:
            fail(f"--topic {spec}: expected TOPIC or TOPIC:PARTITION,PARTITION,...", 2)
    tps: list[tuple[str, int]] = []
    for name, partitions in wanted:
        tmd = topic_metadata(client, name)[name]
        tps += [(name, p) for p in (partitions if partitions is not None else tmd.partitions)]
    return sorted(set(tps))


@groups_app.command("reset-offsets")
def reset_offsets(
    group: Annotated[str, typer.Argument(help="group id")],
    topic: Annotated[
        list[str] | None,
        typer.Option(help="TOPIC or TOPIC:P1,P2 (partitions to reset; repeatable)"),
    ] = None,
    all_topics: Annotated[
        bool, typer.Option("--all-topics", help="every partition the group committed")
    ] = False,
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_current: Annotated[
        bool, typer.Option("--to-current", help="the committed offset (else the log end)")
    ] = False,
    to_datetime: Annotated[
        str | None, typer.Option("--to-datetime", help="ISO-8601, e.g. 2024-05-01T12:00:00")
    ] = None,
    by_duration: Annotated[
        str | None, typer.Option("--by-duration", help="back from now, e.g. PT1H30M, P1D")
    ] = None,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    shift_by: Annotated[
        int | None, typer.Option("--shift-by", help="from the committed offset, +/-N")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan (default)")] = False,
    execute: Annotated[bool, typer.Option("--execute", help="apply (default: dry run)")] = False,
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
    as_json: JsonOption = False,
) -> None:
    """Move an inactive group's committed offsets; prints the plan, applies it with --execute.
    Kafka's scenarios (one of --to-earliest, --to-latest, --to-current, --to-datetime,
    --by-duration, --to-offset, --shift-by) and scopes (--all-topics, or --topic)."""
    if dry_run and execute:
        fail("--dry-run and --execute exclude each other", 2)
    kind, spec = _target_spec(
        to_earliest, to_latest, to_current, to_datetime, by_duration, to_offset, shift_by
    )
    client = admin_client(bootstrap_server)
    tps = _scope(client, group, topic, all_topics)
    state = _state_name(_describe(client, group).state)
    if state not in INACTIVE_STATES:
        fail(
            f"group {group} is {state}: offsets can be reset only when the group is inactive "
            "(stop its consumers first)"
        )
    committed = _committed(client, group)
    targets = _targets(client, tps, kind, spec, committed)
    plan = [
        {"topic": t, "partition": p, "current_offset": committed.get((t, p)), "new_offset": o}
        for (t, p), o in sorted(targets.items())
    ]
    if execute and targets:
        request = [
            ConsumerGroupTopicPartitions(
                group, [TopicPartition(t, p, o) for (t, p), o in targets.items()]
            )
        ]
        answer = result(client.alter_consumer_group_offsets(request)[group], "reset offsets")
        errors = [tp for tp in answer.topic_partitions if tp.error is not None]
        if errors:
            fail(f"some partitions were not reset: {errors}")
    if as_json:
        emit_json({"group": group, "executed": execute, "offsets": plan})
        return
    print_table(
        f"{'new' if execute else 'planned (dry run; --execute applies)'} offsets of {group}",
        ("topic", "partition", "current_offset", "new_offset"),
        ((r["topic"], r["partition"], r["current_offset"], r["new_offset"]) for r in plan),
    )


def _targets(
    client: AdminClient,
    tps: list[tuple[str, int]],
    kind: str,
    spec: OffsetSpec | int | None,
    committed: dict[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """The new offset of each partition, as kafka-consumer-groups.sh computes it: an offset
    or a shift is kept within the log (checkOffsetsRange); a time with no record at or after
    it is the log end; --to-current takes the log end where nothing is committed."""
    if isinstance(spec, OffsetSpec):
        targets = _offsets(client, tps, spec)
        if kind == "datetime":  # no record at or after the time: the log end, like Kafka
            latest = _offsets(client, tps, OffsetSpec.latest())
            targets = {tp: o if o >= 0 else latest[tp] for tp, o in targets.items()}
        return targets
    if kind == "current":
        latest = _offsets(client, [tp for tp in tps if tp not in committed], OffsetSpec.latest())
        return {tp: committed[tp] if tp in committed else latest[tp] for tp in tps}
    assert isinstance(spec, int)
    if kind == "shift":
        missing = [tp for tp in tps if tp not in committed]
        if missing:
            t, p = missing[0]
            fail(f"Cannot shift offset for partition {t}-{p}: the group committed none there")
        wanted = {tp: committed[tp] + spec for tp in tps}
    else:
        wanted = dict.fromkeys(tps, spec)
    earliest = _offsets(client, tps, OffsetSpec.earliest())
    latest = _offsets(client, tps, OffsetSpec.latest())
    return {tp: min(max(o, earliest[tp]), latest[tp]) for tp, o in wanted.items()}


@groups_app.command()
def delete(
    group: Annotated[str, typer.Argument(help="group id")],
    bootstrap_server: BootstrapOption = DEFAULT_BOOTSTRAP,
) -> None:
    """Delete an inactive group and its committed offsets."""
    client = admin_client(bootstrap_server)
    result(client.delete_consumer_groups([group], request_timeout=15)[group], f"delete {group}")
    typer.echo(f"Deleted group {group}.")
