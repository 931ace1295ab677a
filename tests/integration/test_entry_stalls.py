"""One request naming 100,000 entries never stalls other clients (issue 17): while it is
decoded, handled and answered, another connection's ApiVersions sent every 20 ms are each
answered within ``PROBE_BOUND_S``, and the big request is answered completely and correctly.

Before handlers worked through entries in slices of loop time (``RequestContext.paced``) and
large requests were decoded and their responses encoded off the loop, each of these held the
event loop 1.4-3.4 s (``python -m bench.entry_stalls``): every probe sent meanwhile waited that
long. The APIs' answers here are over a topic of ``PARTITIONS`` partitions and no groups:
entries naming what does not exist get that entry's error, the others their real answer.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from bench import entry_stalls as probe

ENTRIES = 100_000
PROBE_BOUND_S = 0.5
PARTITIONS = probe.PARTITIONS
TOPIC = probe.TOPIC

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def stall_broker(module_broker: Any) -> Any:
    probe.create_topic(module_broker.port)
    return module_broker


def answered_beside_probes(broker: Any, request: Any) -> tuple[Any, list[float]]:
    """Send ``request`` on a connection of its own while a prober sends ApiVersions every 20
    ms; its decoded answer and the waits of the probes sent while it was in flight."""
    prober = probe.Prober(broker.port)
    prober.start()
    try:
        time.sleep(0.1)
        with socket.create_connection((broker.host, broker.port)) as sock:
            sock.settimeout(60)
            began = time.monotonic()
            sock.sendall(probe.frame_of(request, 7))
            answer = probe.recv_frame(sock)
            ended = time.monotonic()
        time.sleep(0.05)
    finally:
        prober.stop.set()
        prober.join(30)
    waits = [a - s for s, a in prober.probes if s < ended and a > began]
    assert len(waits) >= 2, f"only {len(waits)} probes while the request was in flight"
    assert int.from_bytes(answer[:4], "big") == 7
    return probe.decode_response(request, answer), waits


def _partitions_split(
    parts: list[tuple[int, int]], known_error: ErrorCode, unknown_error: ErrorCode
) -> None:
    """(index, error) of the answer to partitions 0..ENTRIES-1 of the topic: those it has
    answer ``known_error``, the others ``unknown_error``."""
    assert [index for index, _ in parts] == list(range(ENTRIES))
    assert [error for _, error in parts[:PARTITIONS]] == [known_error] * PARTITIONS
    assert {error for _, error in parts[PARTITIONS:]} == {unknown_error}


def check_offset_fetch(response: Any) -> None:
    (group,) = response.groups
    assert group.group_id == "g" and group.error_code == ErrorCode.none
    (topic,) = group.topics
    assert topic.name == TOPIC
    assert [p.partition_index for p in topic.partitions] == list(range(ENTRIES))
    assert {(p.committed_offset, p.error_code) for p in topic.partitions} == {(-1, ErrorCode.none)}


def check_describe_groups(response: Any) -> None:
    assert [g.group_id for g in response.groups] == [f"g{i}" for i in range(ENTRIES)]
    assert {(g.error_code, g.group_state) for g in response.groups} == {(ErrorCode.none, "Dead")}


def check_delete_groups(response: Any) -> None:
    assert [r.group_id for r in response.results] == [f"g{i}" for i in range(ENTRIES)]
    assert {r.error_code for r in response.results} == {ErrorCode.group_id_not_found}


def check_incremental_alter_configs(response: Any) -> None:
    assert [r.resource_name for r in response.responses] == [f"nt{i}" for i in range(ENTRIES)]
    assert {r.error_code for r in response.responses} == {ErrorCode.unknown_topic_or_partition}


def check_alter_client_quotas(response: Any) -> None:
    names = [tuple((e.entity_type, e.entity_name) for e in r.entity) for r in response.entries]
    assert names == [(("client-id", f"c{i}"),) for i in range(ENTRIES)]
    assert {r.error_code for r in response.entries} == {ErrorCode.none}


def check_metadata_by_id(response: Any) -> None:
    assert len(response.topics) == ENTRIES
    assert {(t.error_code, t.partitions) for t in response.topics} == {
        (ErrorCode.unknown_topic_id, ())
    }
    assert all(t.topic_id is not None for t in response.topics)  # echoed, as Kafka does


def check_list_offsets(response: Any) -> None:
    (topic,) = response.topics
    assert topic.name == TOPIC
    half = ENTRIES // 2
    indexes = [p.partition_index for p in topic.partitions]
    assert indexes == [i % PARTITIONS for i in range(half)] + list(range(half, ENTRIES))
    # the first half names the topic's partitions over and over: INVALID_REQUEST for each
    # entry of a partition named more than once, as Kafka answers
    known = {(p.error_code, p.offset) for p in topic.partitions[:half]}
    assert known == {(ErrorCode.invalid_request, -1)}
    unknown = {p.error_code for p in topic.partitions[half:]}
    assert unknown == {ErrorCode.unknown_topic_or_partition}


def check_describe_topic_partitions(response: Any) -> None:
    assert [t.name for t in response.topics] == sorted(f"nt{i}" for i in range(ENTRIES))
    assert {t.error_code for t in response.topics} == {ErrorCode.unknown_topic_or_partition}
    assert response.next_cursor is None


def check_describe_producers(response: Any) -> None:
    (topic,) = response.topics
    parts = [(p.partition_index, p.error_code) for p in topic.partitions]
    _partitions_split(parts, ErrorCode.none, ErrorCode.unknown_topic_or_partition)


def check_offset_for_leader_epoch(response: Any) -> None:
    (topic,) = response.topics
    parts = [(p.partition, p.error_code) for p in topic.partitions]
    _partitions_split(parts, ErrorCode.none, ErrorCode.unknown_topic_or_partition)
    assert {p.end_offset for p in topic.partitions[:PARTITIONS]} == {0}


def check_elect_leaders(response: Any) -> None:
    (topic,) = response.replica_election_results
    parts = [(p.partition_id, p.error_code) for p in topic.partition_result]
    _partitions_split(parts, ErrorCode.election_not_needed, ErrorCode.unknown_topic_or_partition)


def check_describe_configs(response: Any) -> None:
    assert len(response.results) == ENTRIES // 100
    first = response.results[0]
    assert first.error_code == ErrorCode.none and first.resource_name == TOPIC
    names = [c.name for c in first.configs]
    assert "retention.ms" in names and "cleanup.policy" in names
    assert all(r.configs == first.configs for r in response.results)


def check_fetch(response: Any) -> None:
    (topic,) = response.responses
    parts = [(p.partition_index, p.error_code) for p in topic.partitions]
    _partitions_split(parts, ErrorCode.none, ErrorCode.unknown_topic_or_partition)
    assert {(p.high_watermark, p.records) for p in topic.partitions[:PARTITIONS]} == {(0, b"")}


CHECKS = {
    "OffsetFetch": check_offset_fetch,
    "DescribeGroups": check_describe_groups,
    "DeleteGroups": check_delete_groups,
    "IncrementalAlterConfigs": check_incremental_alter_configs,
    "AlterClientQuotas": check_alter_client_quotas,
    "MetadataById": check_metadata_by_id,
    "ListOffsetsByTime": check_list_offsets,
    "DescribeTopicPartitions": check_describe_topic_partitions,
    "DescribeProducers": check_describe_producers,
    "OffsetForLeaderEpoch": check_offset_for_leader_epoch,
    "ElectLeaders": check_elect_leaders,
    "DescribeConfigsRepeated": check_describe_configs,
    "Fetch": check_fetch,
}
FAST = {"OffsetFetch"}  # in the fast set; the others run with the slow set


@pytest.mark.parametrize(
    "api",
    [name if name in FAST else pytest.param(name, marks=pytest.mark.slow) for name in CHECKS],
)
def test_a_request_of_many_entries_does_not_stall_other_clients(stall_broker, api) -> None:
    request = probe.REQUESTS[api](ENTRIES)
    response, waits = answered_beside_probes(stall_broker, request)
    longest = max(waits)
    assert longest < PROBE_BOUND_S, (
        f"{api}: an ApiVersions waited {longest:.3f} s ({len(waits)} probes)"
    )
    CHECKS[api](response)
