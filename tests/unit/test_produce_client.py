"""The producing side's codec (stonemq/protocol/produce_client.py): the Produce request written
with ``struct`` around the batches' pieces is byte for byte what kio writes for the same
request, and kio's own answers decode back to what was encoded."""

from __future__ import annotations

import datetime
import io
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.produce.v8 import request as req
from kio.serial import entity_writer
from kio.static.primitive import i16, i32, i32Timedelta

from stonemq.protocol import produce_client as pc

_topic = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=20)
_pieces = st.lists(st.binary(max_size=80), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    batches=st.dictionaries(st.tuples(_topic, st.integers(0, 2**31 - 1)), _pieces, max_size=6),
    correlation_id=st.integers(0, 2**31 - 1),
    client_id=st.text(st.characters(codec="ascii"), max_size=10),
    acks=st.sampled_from([-1, 0, 1]),
    timeout_ms=st.integers(0, 2**31 - 1),
)
def test_the_produce_request_is_kios(
    batches: dict[tuple[str, int], list[bytes]],
    correlation_id: int,
    client_id: str,
    acks: int,
    timeout_ms: int,
) -> None:
    frame = b"".join(
        bytes(p) for p in pc.encode_produce(correlation_id, client_id, acks, timeout_ms, batches)
    )
    topics: dict[str, list[req.PartitionProduceData]] = {}
    for (topic, partition), pieces in batches.items():
        topics.setdefault(topic, []).append(
            req.PartitionProduceData(index=i32(partition), records=b"".join(pieces))
        )
    entity = req.ProduceRequest(
        transactional_id=None,
        acks=i16(acks),
        timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=timeout_ms)),
        topic_data=tuple(
            req.TopicProduceData(name=t, partition_data=tuple(parts))  # type: ignore[arg-type]
            for t, parts in topics.items()
        ),
    )
    buf = io.BytesIO()
    entity_writer(req.ProduceRequest)(buf, entity)
    cid = client_id.encode()
    body = struct.pack(">hhih", 0, 8, correlation_id, len(cid)) + cid + buf.getvalue()
    assert frame == struct.pack(">i", len(body)) + body


def test_metadata_and_init_producer_id_frames_decode_as_requests() -> None:
    """The control requests carry their header and a body kio reads back."""
    from kio.schema.metadata.v8 import request as mreq
    from kio.serial import entity_reader

    frame = pc.encode_metadata(7, "c", ["a", "b"])
    assert struct.unpack_from(">ihhi", frame) == (len(frame) - 4, 3, 8, 7)
    body, _ = entity_reader(mreq.MetadataRequest)(memoryview(frame).toreadonly(), 4 + 10 + 1)
    assert [t.name for t in body.topics] == ["a", "b"]
    assert body.allow_auto_topic_creation
    frame = pc.encode_init_producer_id(9, "c")
    assert struct.unpack_from(">ihhi", frame) == (len(frame) - 4, 22, 1, 9)
