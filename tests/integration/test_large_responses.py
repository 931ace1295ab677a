"""Large responses are written off the event loop (server/connection.py): a sender thread
writes a fetch response of several MiB straight to the socket while the loop serves others,
hands what the socket does not take back to the transport, and responses still go out whole
and in request order. Checked with real clients and by the broker's own accounting
(``response_bytes_sent_off_loop`` / ``_on_loop`` on ``metrics.listen``)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from .helpers import Msg, broker_counters, consume, create_topic, produce
from .rawclient import (
    ApiVersionsRequestV0,
    ApiVersionsResponseV0,
    RawConnection,
    fetch_request,
    schema,
    split_batches,
    wait_visible,
)

pytestmark = pytest.mark.timeout(120)

RECORDS = 12_000
VALUE = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _broker_with_records(broker_factory):  # type: ignore[no-untyped-def]
    port = _free_port()
    broker = broker_factory(**{"metrics.listen": f"127.0.0.1:{port}"})
    topic = create_topic(broker.bootstrap, partitions=1)
    sent = [Msg(None, b"%08d" % i + bytes([97 + i % 26]) * (VALUE - 8)) for i in range(RECORDS)]
    produce(broker.bootstrap, topic, sent)
    return broker, port, topic, sent


def test_a_catching_up_consumer_gets_its_records_through_the_sender_threads(
    broker_factory,
) -> None:
    broker, port, topic, sent = _broker_with_records(broker_factory)
    before = broker_counters(port)
    got = consume(broker.bootstrap, topic, RECORDS, **{"max.partition.fetch.bytes": 2 << 20})
    assert [(m.offset, m.value) for m in got] == [(i, m.value) for i, m in enumerate(sent)]
    moved = {k: v - before.get(k, 0.0) for k, v in broker_counters(port).items()}
    # ~12 MB of records in responses of about 2 MiB: most of it written by sender threads
    # (before, every byte was written by the event loop)
    assert moved["response_bytes_sent_off_loop"] >= RECORDS * VALUE // 2, moved


def test_pipelined_responses_stay_whole_and_in_order_when_the_socket_is_full(
    broker_factory,
) -> None:
    """A client with a small receive buffer that pipelines two 4 MiB fetches and two
    ApiVersions and reads nothing for a while: the sender thread fills the socket, the rest
    goes through the transport, the small responses wait their turn."""
    broker, port, topic, _sent = _broker_with_records(broker_factory)
    with RawConnection(broker.host, broker.port, timeout=30) as conn:
        hw = wait_visible(conn, topic, 0, RECORDS).high_watermark
        assert hw == RECORDS
        before = broker_counters(port)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        fetch_type = schema("fetch", 12, "response").FetchResponse
        order = []
        for offset in (0, RECORDS // 2):
            order.append(
                ("fetch", conn.send_request(fetch_request(topic, 0, offset, 12, 0, 4 << 20)))
            )
            order.append(("api", conn.send_request(ApiVersionsRequestV0())))
        time.sleep(0.5)  # nothing read: the socket's buffers fill up
        fetched = []
        for kind, cid in order:
            if kind == "api":
                assert conn.recv_response(ApiVersionsResponseV0, cid).error_code == 0
                continue
            resp = conn.recv_response(fetch_type, cid)
            (part,) = resp.responses[0].partitions
            assert part.error_code == 0
            batches = split_batches(part.records)
            assert b"".join(batches) == bytes(part.records)  # whole batches only
            fetched.append(batches)
    for batches, start in zip(fetched, (0, RECORDS // 2), strict=True):
        (base,) = struct.unpack_from(">q", batches[0], 0)
        assert base <= start
        total = sum(len(b) for b in batches)
        assert total >= 3 << 20  # about 4 MiB each
    moved = {k: v - before.get(k, 0.0) for k, v in broker_counters(port).items()}
    assert moved["response_bytes_sent_off_loop"] > 0, moved
    assert moved["response_bytes_sent_on_loop"] >= 1 << 20, moved  # what the socket refused
