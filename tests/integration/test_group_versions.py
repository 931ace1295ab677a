"""The newest versions of the offset and group APIs over raw sockets: OffsetCommit v2-10 and
OffsetFetch v1-10 (v10 of both name topics by id, KIP-848's clients; an unknown id is
UNKNOWN_TOPIC_ID), DescribeGroups v0-6 (v6: a missing group is GROUP_ID_NOT_FOUND, KIP-1043)
and InitProducerId v0-6 (v6: no ongoing transaction to report)."""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any

import pytest

from .helpers import admin, create_topic, unique_topic
from .rawclient import RawConnection, build, schema, topic_id_of

pytestmark = pytest.mark.timeout(60)

UNKNOWN_TOPIC_ID = 100
GROUP_ID_NOT_FOUND = 69
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25


def commit(
    conn: RawConnection,
    version: int,
    group: str,
    offsets: dict[tuple[Any, int], int],
    generation: int = -1,
    member_id: str = "",
    retention_ms: int = -1,
) -> dict[tuple[Any, int], int]:
    """OffsetCommit of ``{(topic name, or id from v10, partition): offset}``; returns each
    partition's error code under the same keys."""
    req = schema("offset_commit", version, "request")
    topics: dict[Any, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(
            build(
                req.OffsetCommitRequestPartition,
                partition_index=partition,
                committed_offset=offset,
                committed_leader_epoch=-1,
                committed_metadata=f"m{version}",
            )
        )
    key = "topic_id" if version >= 10 else "name"
    request = build(
        req.OffsetCommitRequest,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=None,
        retention_time=datetime.timedelta(milliseconds=retention_ms),
        topics=tuple(
            build(req.OffsetCommitRequestTopic, **{key: t}, partitions=tuple(parts))
            for t, parts in topics.items()
        ),
    )
    answer = conn.request(
        request, schema("offset_commit", version, "response").OffsetCommitResponse
    )
    return {
        (getattr(t, key), p.partition_index): p.error_code
        for t in answer.topics
        for p in t.partitions
    }


def fetch_offsets(
    conn: RawConnection, version: int, group: str, wanted: dict[Any, list[int]] | None
) -> dict[tuple[Any, int], tuple[int, int, str | None]]:
    """OffsetFetch; ``{(topic or id, partition): (offset, error, metadata)}``."""
    req = schema("offset_fetch", version, "request")
    resp = schema("offset_fetch", version, "response").OffsetFetchResponse
    key = "topic_id" if version >= 10 else "name"
    topic_type = req.OffsetFetchRequestTopics if version >= 8 else req.OffsetFetchRequestTopic
    topics = (
        None
        if wanted is None
        else tuple(
            build(topic_type, **{key: t}, partition_indexes=tuple(ps)) for t, ps in wanted.items()
        )
    )
    if version >= 8:
        request = build(
            req.OffsetFetchRequest,
            groups=(build(req.OffsetFetchRequestGroup, group_id=group, topics=topics),),
            require_stable=False,
        )
        answer = conn.request(request, resp)
        (g,) = answer.groups
        assert g.error_code == 0
        answer_topics = g.topics
    else:
        request = build(req.OffsetFetchRequest, group_id=group, topics=topics)
        answer = conn.request(request, resp)
        answer_topics = answer.topics
    return {
        (getattr(t, key), p.partition_index): (p.committed_offset, p.error_code, p.metadata)
        for t in answer_topics
        for p in t.partitions
    }


@pytest.fixture(scope="module")
def topic(module_broker) -> tuple[str, uuid.UUID]:
    name = create_topic(module_broker.bootstrap, unique_topic("grp-versions"), partitions=3)
    with RawConnection(module_broker.host, module_broker.port) as conn:
        return name, topic_id_of(conn, name)


@pytest.mark.parametrize("version", range(2, 11))
def test_every_offset_commit_version_is_fetched_by_every_version(
    module_broker, topic, version
) -> None:
    name, topic_id = topic
    group = unique_topic(f"commit-v{version}")
    ref = topic_id if version >= 10 else name
    with RawConnection(module_broker.host, module_broker.port) as conn:
        errors = commit(conn, version, group, {(ref, 0): 10 + version, (ref, 2): 20 + version})
        assert errors == {(ref, 0): 0, (ref, 2): 0}
        for fetch_version in range(1, 11):
            fref = topic_id if fetch_version >= 10 else name
            got = fetch_offsets(conn, fetch_version, group, {fref: [0, 1, 2]})
            assert {k: v[:2] for k, v in got.items()} == {
                (fref, 0): (10 + version, 0),
                (fref, 1): (-1, 0),
                (fref, 2): (20 + version, 0),
            }, fetch_version
            assert got[(fref, 0)][2] == f"m{version}"
            # every committed partition of the group (topics null, v2+)
            if fetch_version >= 2:
                everything = fetch_offsets(conn, fetch_version, group, None)
                assert {k: v[0] for k, v in everything.items()} == {
                    (fref, 0): 10 + version,
                    (fref, 2): 20 + version,
                }, fetch_version


def test_offset_commit_v10_unknown_topic_id(module_broker, topic) -> None:
    _, topic_id = topic
    unknown = uuid.uuid4()
    group = unique_topic("commit-unknown")
    with RawConnection(module_broker.host, module_broker.port) as conn:
        errors = commit(conn, 10, group, {(unknown, 0): 5, (topic_id, 1): 7})
        assert errors == {(unknown, 0): UNKNOWN_TOPIC_ID, (topic_id, 1): 0}
        # the unknown id is named before the member is checked, as Kafka
        errors = commit(conn, 10, group, {(unknown, 0): 5, (topic_id, 1): 8}, 3, "nobody")
        assert errors[(unknown, 0)] == UNKNOWN_TOPIC_ID
        assert errors[(topic_id, 1)] in (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID)
        got = fetch_offsets(conn, 10, group, {topic_id: [1], unknown: [0, 3]})
        assert got == {
            (topic_id, 1): (7, 0, "m10"),
            (unknown, 0): (-1, UNKNOWN_TOPIC_ID, ""),
            (unknown, 3): (-1, UNKNOWN_TOPIC_ID, ""),
        }
        # a zero id names nothing either (kio reads it back as None)
        zero = uuid.UUID(int=0)
        assert commit(conn, 10, group, {(zero, 0): 1}) == {(None, 0): UNKNOWN_TOPIC_ID}


UNKNOWN_TOPIC_OR_PARTITION = 3


def test_offset_commit_with_a_generation_to_a_missing_group(module_broker, topic) -> None:
    """A generation's commit to a group that does not exist: GROUP_ID_NOT_FOUND from v9,
    ILLEGAL_GENERATION before (Kafka's OffsetMetadataManager; it was ILLEGAL_GENERATION at
    every version). An unknown topic or partition keeps its own error beside the group's
    (Kafka's KafkaApis answers it before the coordinator; the group error hid it). Both from
    an independent audit."""
    name, _ = topic
    with RawConnection(module_broker.host, module_broker.port) as conn:
        for version, want in ((8, ILLEGAL_GENERATION), (9, GROUP_ID_NOT_FOUND)):
            group = unique_topic(f"missing-v{version}")
            errors = commit(
                conn, version, group, {(name, 0): 1, (name, 99): 1, ("no-such", 0): 1}, 4, "m"
            )
            assert errors == {
                (name, 0): want,
                (name, 99): UNKNOWN_TOPIC_OR_PARTITION,
                ("no-such", 0): UNKNOWN_TOPIC_OR_PARTITION,
            }, version


def test_offset_fetch_v10_leaves_out_deleted_topics(module_broker) -> None:
    bootstrap = module_broker.bootstrap
    kept = create_topic(bootstrap, unique_topic("kept"), partitions=1)
    gone = create_topic(bootstrap, unique_topic("gone"), partitions=1)
    group = unique_topic("fetch-deleted")
    with RawConnection(module_broker.host, module_broker.port) as conn:
        assert commit(conn, 9, group, {(kept, 0): 3, (gone, 0): 4}) == {(kept, 0): 0, (gone, 0): 0}
        kept_id = topic_id_of(conn, kept)
        gone_id = topic_id_of(conn, gone)
        assert {k for k in fetch_offsets(conn, 10, group, None)} == {(kept_id, 0), (gone_id, 0)}
        client = admin(bootstrap)
        client.delete_topics([gone])[gone].result(20)
        # the deleted topic's commits went with it, as in Kafka (v9 listed them by name before)
        assert {k for k in fetch_offsets(conn, 9, group, None)} == {(kept, 0)}
        assert fetch_offsets(conn, 10, group, None) == {(kept_id, 0): (3, 0, "m9")}
        assert fetch_offsets(conn, 10, group, {gone_id: [0]}) == {
            (gone_id, 0): (-1, UNKNOWN_TOPIC_ID, "")
        }


@pytest.mark.parametrize("version", range(0, 7))
def test_describe_groups_missing_and_existing(module_broker, topic, version) -> None:
    name, _ = topic
    existing = unique_topic("described")
    missing = unique_topic("missing")
    req = schema("describe_groups", version, "request")
    resp = schema("describe_groups", version, "response").DescribeGroupsResponse
    with RawConnection(module_broker.host, module_broker.port) as conn:
        assert commit(conn, 9, existing, {(name, 0): 1}) == {(name, 0): 0}
        answer = conn.request(
            build(
                req.DescribeGroupsRequest,
                groups=(existing, missing),
                include_authorized_operations=False,
            ),
            resp,
        )
    found, absent = answer.groups
    assert (found.group_id, found.error_code, found.group_state) == (existing, 0, "Empty")
    assert absent.group_id == missing
    if version < 6:
        assert (absent.error_code, absent.group_state, absent.members) == (0, "Dead", ())
        return
    assert found.error_message is None
    assert absent.error_code == GROUP_ID_NOT_FOUND
    assert absent.error_message == f"Group {missing} not found."
    assert (absent.group_state, absent.protocol_type, absent.members) == ("", "", ())


@pytest.mark.parametrize("version", range(0, 7))
def test_init_producer_id_every_version(module_broker, version) -> None:
    req = schema("init_producer_id", version, "request")
    resp = schema("init_producer_id", version, "response").InitProducerIdResponse
    ids = []
    with RawConnection(module_broker.host, module_broker.port) as conn:
        for _ in range(2):
            answer = conn.request(
                build(
                    req.InitProducerIdRequest,
                    transactional_id=None,
                    transaction_timeout=datetime.timedelta(seconds=60),
                    producer_id=-1,
                    producer_epoch=-1,
                ),
                resp,
            )
            assert answer.error_code == 0 and answer.producer_epoch == 0
            ids.append(answer.producer_id)
            if version >= 6:
                assert (answer.ongoing_txn_producer_id, answer.ongoing_txn_producer_epoch) == (
                    -1,
                    -1,
                )
        refused = conn.request(
            build(
                req.InitProducerIdRequest,
                transactional_id="txn",
                transaction_timeout=datetime.timedelta(seconds=60),
                producer_id=-1,
                producer_epoch=-1,
                enable2_pc=True,
            ),
            resp,
        )
    assert ids[0] >= 0 and ids[1] > ids[0]
    assert refused.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert refused.producer_id == -1


INCONSISTENT_GROUP_PROTOCOL = 23


def sync_v5(
    conn: RawConnection,
    group: str,
    generation: int,
    member_id: str,
    protocol_type: str | None,
    protocol_name: str | None,
) -> Any:
    """A SyncGroup v5 with no assignments; the response."""
    req = schema("sync_group", 5, "request")
    sync = build(
        req.SyncGroupRequest,
        group_id=group,
        generation_id=generation,
        member_id=member_id,
        group_instance_id="static-1" if group else None,
        protocol_type=protocol_type,
        protocol_name=protocol_name,
        assignments=(),
    )
    return conn.request(sync, schema("sync_group", 5, "response").SyncGroupResponse)


def test_sync_group_v5_without_its_protocol_is_refused(module_broker) -> None:
    """SyncGroup v5+ must name its protocol type and name: null is
    INCONSISTENT_GROUP_PROTOCOL, as Kafka (KafkaApis, SyncGroupRequest); it was answered
    NONE (an independent audit)."""
    group = unique_topic("sync-null")
    with RawConnection(module_broker.host, module_broker.port) as conn:
        join_req = schema("join_group", 5, "request")
        join = build(
            join_req.JoinGroupRequest,
            group_id=group,
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10),
            member_id="",
            group_instance_id="static-1",  # no MEMBER_ID_REQUIRED round
            protocol_type="consumer",
            protocols=(build(join_req.JoinGroupRequestProtocol, name="range", metadata=b""),),
        )
        joined = conn.request(join, schema("join_group", 5, "response").JoinGroupResponse)
        assert joined.error_code == 0, joined
        for protocol_type, protocol_name, want in (
            (None, "range", INCONSISTENT_GROUP_PROTOCOL),
            ("consumer", None, INCONSISTENT_GROUP_PROTOCOL),
            (None, None, INCONSISTENT_GROUP_PROTOCOL),
            ("consumer", "range", 0),
        ):
            answer = sync_v5(
                conn, group, joined.generation_id, joined.member_id, protocol_type, protocol_name
            )
            assert answer.error_code == want, (protocol_type, protocol_name)


INVALID_GROUP_ID = 24


def test_an_empty_group_id_is_invalid_for_sync_heartbeat_and_leave(module_broker) -> None:
    """SyncGroup, Heartbeat and LeaveGroup naming the group "" answer INVALID_GROUP_ID, as
    Kafka's GroupCoordinatorService (they answered UNKNOWN_MEMBER_ID: an independent audit)."""
    with RawConnection(module_broker.host, module_broker.port) as conn:
        assert sync_v5(conn, "", 1, "m", "consumer", "range").error_code == INVALID_GROUP_ID
        beat_req = schema("heartbeat", 4, "request")
        beat = build(
            beat_req.HeartbeatRequest,
            group_id="",
            generation_id=1,
            member_id="m",
            group_instance_id=None,
        )
        answer = conn.request(beat, schema("heartbeat", 4, "response").HeartbeatResponse)
        assert answer.error_code == INVALID_GROUP_ID
        leave_req = schema("leave_group", 5, "request")
        leave = build(
            leave_req.LeaveGroupRequest,
            group_id="",
            members=(
                build(leave_req.MemberIdentity, member_id="m", group_instance_id=None, reason=None),
            ),
        )
        answer = conn.request(leave, schema("leave_group", 5, "response").LeaveGroupResponse)
        assert answer.error_code == INVALID_GROUP_ID


@pytest.mark.broker_settings(**{"offsets.retention.check.interval.ms": 300})
@pytest.mark.parametrize("version", [2, 4])
def test_a_commits_retention_time_expires_it(broker, version: int) -> None:
    """OffsetCommit v2-v4's retention time: Kafka expires the offset that long after the
    commit (it was kept for offsets.retention.minutes); one without it stays."""
    name = create_topic(broker.bootstrap, unique_topic("retention-time"), partitions=2)
    group = unique_topic("retention-time")
    with RawConnection(broker.host, broker.port) as conn:
        assert commit(conn, version, group, {(name, 0): 7}, retention_ms=1_000) == {(name, 0): 0}
        assert commit(conn, version, group, {(name, 1): 8}) == {(name, 1): 0}
        assert fetch_offsets(conn, 5, group, {name: [0, 1]})[(name, 0)][0] == 7
        deadline = time.monotonic() + 20
        while fetch_offsets(conn, 5, group, {name: [0]})[(name, 0)][0] != -1:
            assert time.monotonic() < deadline, "the offset never expired"
            time.sleep(0.2)
        assert fetch_offsets(conn, 5, group, {name: [1]})[(name, 1)][0] == 8
