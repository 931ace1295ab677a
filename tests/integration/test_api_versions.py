"""ApiVersions over raw sockets: every version clients send, and Kafka's step-down rule.

kafka-python sends v4 first, kafkajs v2, aiokafka v0 and librdkafka v3. A version the broker
does not know is answered in the v0 body with UNSUPPORTED_VERSION and the full API list.
"""

from __future__ import annotations

import struct

import pytest
from kio.index import UnknownEntity, api_key_map, load_request_schema, load_response_schema
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.static.primitive import i16, i32

from .rawclient import RawConnection, decode, encode, schema

pytestmark = pytest.mark.timeout(60)

UNSUPPORTED_VERSION = 35
TRANSACTION_APIS = {24, 25, 26, 28}  # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
REQUIRED_APIS = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    18: "ApiVersions",
    19: "CreateTopics",
    20: "DeleteTopics",
    22: "InitProducerId",
    32: "DescribeConfigs",
    33: "AlterConfigs",
    37: "CreatePartitions",
    44: "IncrementalAlterConfigs",
    60: "DescribeCluster",
}


def api_versions_request(version: int):
    mod = schema("api_versions", version, "request")
    if version >= 3:
        return mod.ApiVersionsRequest(
            client_software_name="stonemq-tests", client_software_version="1.0"
        )
    return mod.ApiVersionsRequest()


def ask(conn: RawConnection, version: int):
    return conn.request(
        api_versions_request(version),
        schema("api_versions", version, "response").ApiVersionsResponse,
    )


def as_map(resp) -> dict[int, tuple[int, int]]:
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


@pytest.fixture(scope="module")
def advertised(module_broker) -> dict[int, tuple[int, int]]:
    with RawConnection(module_broker.host, module_broker.port) as conn:
        return as_map(ask(conn, 0))


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_every_client_version_is_answered(module_broker, advertised, version):
    with RawConnection(module_broker.host, module_broker.port) as conn:
        resp = ask(conn, version)
        assert resp.error_code == 0
        assert as_map(resp) == advertised
        # the connection stays usable after it
        assert as_map(ask(conn, 0)) == advertised


def test_advertised_ranges(advertised):
    missing = {name for key, name in REQUIRED_APIS.items() if key not in advertised}
    assert not missing, f"not advertised: {sorted(missing)}"
    for key, (lo, hi) in advertised.items():
        assert 0 <= lo <= hi, (key, lo, hi)
    assert not TRANSACTION_APIS & advertised.keys(), "transactions must not be advertised yet"
    assert advertised[18][0] == 0 and advertised[18][1] >= 3  # aiokafka v0 .. librdkafka v3
    fetch_lo, fetch_hi = advertised[1]
    assert fetch_lo <= 4 and fetch_hi >= 12
    produce_lo, produce_hi = advertised[0]
    assert produce_lo <= 3 and produce_hi >= 7  # magic-2 produce from v3; kafkajs uses v7
    assert advertised[2][0] <= 1 and advertised[2][1] >= 7  # ListOffsets by max timestamp
    assert advertised[3][0] <= 1  # Metadata: kafka-python and aiokafka start low


def kio_range(api_key: int) -> tuple[int, int]:
    """The versions kio's schemas define for ``api_key``: Kafka 4's baseline to the newest."""
    versions = []
    for version in range(64):
        try:
            load_request_schema(api_key, version)
            load_response_schema(api_key, version)
        except UnknownEntity:
            continue
        versions.append(version)
    assert versions, f"kio has no schema for api key {api_key}"
    assert versions == list(range(versions[0], versions[-1] + 1)), (api_key, versions)
    return versions[0], versions[-1]


def test_every_api_advertises_every_version_kio_defines(advertised):
    """Each implemented API is served from Kafka 4's baseline (kio starts there) to the newest
    version kio's schemas define: when kio moves, this names the APIs left behind."""
    behind = {
        (key, api_key_map[key]): (advertised[key], kio_range(key))
        for key in sorted(advertised)
        if advertised[key] != kio_range(key)
    }
    assert not behind, f"advertised vs kio: {behind}"


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_features_as_a_kafka_4_broker(module_broker, version):
    """v3+ report metadata.version as a Kafka 4.0 broker does: supported from 3.3-IV3 (7) to
    4.0-IV3 (25), finalized at 25, epoch known; no transaction.version or group.version, so
    clients keep to the protocols StoneMQ serves."""
    with RawConnection(module_broker.host, module_broker.port) as conn:
        resp = ask(conn, version)
    assert resp.error_code == 0
    if version < 3:
        assert not hasattr(resp, "supported_features")
        return
    supported = {f.name: (f.min_version, f.max_version) for f in resp.supported_features}
    finalized = {
        f.name: (f.min_version_level, f.max_version_level) for f in resp.finalized_features
    }
    assert supported == {"metadata.version": (7, 25)}
    assert finalized == {"metadata.version": (25, 25)}
    assert resp.finalized_features_epoch == 0
    assert resp.zk_migration_ready is False


def send_unknown_version(conn: RawConnection, version: int, correlation_id: int) -> None:
    header = encode(
        RequestHeaderV2(
            request_api_key=i16(18),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id="future-client",
        )
    )
    # a body of the newest shape kio knows (compact strings + tagged fields)
    conn.send_frame(header + encode(api_versions_request(4)))


@pytest.mark.parametrize("version", [5, 99, 32767])
def test_unknown_version_steps_down_to_v0(module_broker, advertised, version):
    with RawConnection(module_broker.host, module_broker.port) as conn:
        send_unknown_version(conn, version, correlation_id=4242)
        data = conn.recv_frame()
        (correlation_id,) = struct.unpack_from(">i", data, 0)
        assert correlation_id == 4242
        body, used = decode(ApiVersionsResponseV0, data, 4)
        assert 4 + used == len(data), "the step-down answer must be a v0 body"
        assert body.error_code == UNSUPPORTED_VERSION
        assert as_map(body) == advertised
        # the client may now retry with a version it found in the list
        assert ask(conn, 3).error_code == 0


def test_pipelined_requests_answered_in_order(module_broker, advertised):
    with RawConnection(module_broker.host, module_broker.port) as conn:
        versions = [0, 3, 1, 4, 2, 0, 3]
        ids = [conn.send_request(api_versions_request(v)) for v in versions]
        for v, cid in zip(versions, ids, strict=True):
            resp = conn.recv_response(
                schema("api_versions", v, "response").ApiVersionsResponse, cid
            )
            assert resp.error_code == 0 and as_map(resp) == advertised
