"""The Metadata response cache (stonemq/handlers/metadata.py): a kept response is encoded once
and framed for each request exactly as a fresh encode would be; it is dropped when its
fingerprint changes, and the cache stays within its bound of partition entries."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from stonemq.handlers.context import build, response_module
from stonemq.handlers.metadata import ResponseCache
from stonemq.protocol.codec import EncodedOnce, RequestHeader, encode_response_chunks


def metadata_response(version: int, partitions: int) -> object:
    module = response_module(3, version)
    return build(
        module.MetadataResponse,
        throttle_time=0,
        error_code=ErrorCode.none,
        brokers=(build(module.MetadataResponseBroker, node_id=1, host="h", port=9092, rack=None),),
        cluster_id="c",
        controller_id=1,
        topics=(
            build(
                module.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name="t",
                topic_id=uuid.UUID(int=7),
                is_internal=False,
                partitions=tuple(
                    build(
                        module.MetadataResponsePartition,
                        error_code=ErrorCode.none,
                        partition_index=p,
                        leader_id=1,
                        leader_epoch=0,
                        replica_nodes=(1,),
                        isr_nodes=(1,),
                        offline_replicas=(),
                    )
                    for p in range(partitions)
                ),
                topic_authorized_operations=-2147483648,
            ),
        ),
        cluster_authorized_operations=-2147483648,
    )


@pytest.mark.parametrize("version", [1, 9, 12])  # v9+: flexible, a tagged-fields header byte
def test_a_kept_response_is_framed_as_a_fresh_encode_for_every_correlation_id(
    version: int,
) -> None:
    response = metadata_response(version, 5)
    once = EncodedOnce(response)
    for cid in (1, 77, 2**31 - 1, 5):
        header = RequestHeader(3, version, cid, "c")
        assert b"".join(once.chunks(header)) == b"".join(encode_response_chunks(header, response))


def test_a_changed_fingerprint_drops_the_response_and_the_bound_holds() -> None:
    cache = ResponseCache(max_partitions=10)
    fp_a = ("records-a", (1,) * 4)
    kept = cache.put(("a",), fp_a, "response-a")
    assert cache.get(("a",), fp_a) is kept and cache.hits == 1
    assert cache.get(("a",), ("records-a2", (1,) * 4)) is None  # a topic changed
    assert cache.get(("a",), fp_a) is None and len(cache) == 0  # and it is gone
    cache.put(("a",), fp_a, "response-a")
    cache.put(("b",), ("records-b", (1,) * 4), "response-b")
    cache.get(("a",), fp_a)  # a was used last: b goes first
    cache.put(("c",), ("records-c", (1,) * 4), "response-c")
    assert len(cache) == 2 and cache.partitions == 8
    assert cache.get(("b",), ("records-b", (1,) * 4)) is None
    assert cache.get(("a",), fp_a) is not None
    cache.put(("huge",), ("records-h", (1,) * 50), "response-h")  # alone over the bound: kept
    assert len(cache) == 1 and cache.partitions == 50
