"""Zero-copy fetch responses (issue 17): records of 16 KiB or more read past the page cache are
sent from the segment files with ``sendfile`` (``storage/file_range.py``), never read into the
broker's memory, and every client still gets exactly what was produced.

What is checked against a real broker: the broker's own counter of bytes sent with
``sendfile`` moves with what a consumer catches up (and stays at zero with
``fetch.zero.copy`` false); a client that goes away in the middle of a response leaves no
segment descriptor open and the broker serving; a segment deleted while its bytes are being
sent still arrives whole through the descriptor the response holds; a ``sendfile`` that
fails (an injected EIO, through the storage's fault layer in the broker process) closes that
connection with a log line and nothing else, and one the socket cannot take (EINVAL) is
copied instead.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from kio.schema.types import i32, i64
from ports import free_port as _free_port  # tests/ (on sys.path: root conftest)

from stonemq.protocol.record_batch import iter_batches, iter_records

from .helpers import (
    Msg,
    assert_broker_healthy,
    broker_counters,
    consume,
    create_topic,
    produce,
    wait_high_watermark,
)
from .rawclient import (
    RawConnection,
    decode,
    encode,
    fetch_request,
    frame,
    request_header,
    response_header_type,
    schema,
)

RECORD = 1000
FAULTY_SERVE = Path(__file__).with_name("faulty_serve.py")


def _messages(n: int, tag: bytes = b"") -> list[Msg]:
    return [Msg(b"k%d" % i, tag + b"%08d-" % i + b"v" * RECORD) for i in range(n)]


def _fill(bootstrap: str, topic: str, sent: list[Msg]) -> None:
    produce(
        bootstrap,
        topic,
        sent,
        **{"linger.ms": 20, "batch.size": 256 * 1024, "compression.type": "none"},
    )
    # records are visible once split, a moment after the ack: a reader that stops at the
    # end it sees (kcat -e) must not start before all of them are; asked by ListOffsets,
    # which reads no record (the fault tests' injected sendfile failures stay for the reader)
    _, high = wait_high_watermark(bootstrap, topic, len(sent), timeout=30)
    assert high >= len(sent), high


@pytest.mark.parametrize("zero_copy", [True, False])
def test_a_catch_up_is_sent_from_the_segment_files(broker_factory, zero_copy: bool) -> None:
    """confluent-kafka catches up 12 MB from offset 0 and gets every record exactly; the
    broker counts at least nine tenths of those bytes as sent with sendfile (the rest: reads
    the page cache answered on the loop, 64 KiB at most each), none copied; with
    ``fetch.zero.copy`` false it sends none that way."""
    port = _free_port()
    broker = broker_factory(
        **{"metrics.listen": f"127.0.0.1:{port}", "fetch.zero.copy": str(zero_copy).lower()}
    )
    topic = create_topic(broker.bootstrap, partitions=1)
    sent = _messages(12_000)
    _fill(broker.bootstrap, topic, sent)
    before = broker_counters(port)
    got = consume(broker.bootstrap, topic, len(sent))
    assert [(m.key, m.value) for m in got] == [(m.key, m.value) for m in sent]
    moved = {k: v - before.get(k, 0.0) for k, v in broker_counters(port).items()}
    values = sum(len(m.value) for m in sent)
    if zero_copy:
        assert moved["fetch_bytes_sent_zero_copy"] >= 0.9 * values
    else:
        assert moved["fetch_bytes_sent_zero_copy"] == 0
    assert moved["fetch_bytes_sent_copied"] == 0
    after = broker_counters(port)
    assert after["file_ranges_opened"] == after["file_ranges_closed"]


def _consume_with(client: str, bootstrap: str, topic: str, count: int) -> list[tuple]:
    """(key, value) of the first ``count`` records read by ``client`` from offset 0."""
    if client == "kafka-python":
        from .test_kafka_python import kp_consume

        return [(m.key, m.value) for m in kp_consume(bootstrap, topic, count)]
    if client == "aiokafka":
        import asyncio

        from .test_aiokafka import aio_consume

        got = asyncio.run(aio_consume(bootstrap, topic, count))
        return [(m.key, m.value) for m in got]
    from .test_kcat import kcat

    out = kcat(
        "-b",
        bootstrap,
        "-C",
        "-t",
        topic,
        "-p",
        "0",
        "-e",
        "-o",
        "beginning",
        "-f",
        "%k\\t%s\\n",
        "-c",
        str(count),
        timeout=120,
    )
    return [tuple(line.split(b"\t")) for line in out.splitlines()]


@pytest.mark.parametrize(
    "client",
    [
        # each a few seconds: the fast set keeps kcat's, the whole suite runs all three
        pytest.param("kafka-python", marks=pytest.mark.slow),
        pytest.param("aiokafka", marks=pytest.mark.slow),
        "kcat",
    ],
)
def test_other_clients_catch_up_through_sendfile(broker_factory, client: str) -> None:
    """kafka-python, aiokafka and kcat (librdkafka 2.0, Fetch v11) each read 6 MB from
    offset 0 exactly as produced, most of it sent with sendfile by the broker's count."""
    port = _free_port()
    broker = broker_factory(**{"metrics.listen": f"127.0.0.1:{port}"})
    topic = create_topic(broker.bootstrap, partitions=1)
    sent = _messages(6_000)
    _fill(broker.bootstrap, topic, sent)
    before = broker_counters(port)["fetch_bytes_sent_zero_copy"]
    got = _consume_with(client, broker.bootstrap, topic, len(sent))
    assert got == [(m.key, m.value) for m in sent]
    moved = broker_counters(port)["fetch_bytes_sent_zero_copy"] - before
    assert moved >= 0.5 * sum(len(m.value) for m in sent)


def _fetch_unread(broker_port: int, topic: str, partition_max_bytes: int) -> socket.socket:
    """A raw Fetch (v12) from offset 0 sent on a socket with a 16 KiB receive buffer; its
    answer is not read yet (it stalls on the full socket)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect(("127.0.0.1", broker_port))
    sock.settimeout(30)
    request = fetch_request(topic, 0, 0, version=12, partition_max_bytes=partition_max_bytes)
    header = request_header(1, 12, 7, "zero-copy-test", flexible=True)
    sock.sendall(frame(header + encode(request)))
    return sock


def _read_response(sock: socket.socket) -> bytes:
    """One whole response frame (without its length)."""

    def exact(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = sock.recv(min(n - len(out), 1 << 20))
            if not chunk:
                raise ConnectionError(f"closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    return exact(int.from_bytes(exact(4), "big", signed=True))


def _records_of(body: bytes) -> bytes:
    """The one partition's record bytes of a Fetch v12 response (header v1 + body)."""
    _, pos = decode(response_header_type(True), body)
    response, _ = decode(schema("fetch", 12, "response").FetchResponse, body, pos)
    (topic,) = response.responses
    (part,) = topic.partitions
    assert part.error_code == 0, part.error_code
    return bytes(part.records)


def _values(records: bytes) -> list[bytes | None]:
    return [
        record.value
        for pos, header in iter_batches(records)
        for record in iter_records(records[pos : pos + header.size])
    ]


def _wait_range_open(metrics_port: int, timeout: float = 20.0) -> None:
    """Until the broker holds a segment range open (a fetch's answer is being sent)."""
    deadline = time.monotonic() + timeout
    while True:
        counters = broker_counters(metrics_port)
        if counters["file_ranges_opened"] > counters["file_ranges_closed"]:
            return
        assert time.monotonic() < deadline, "the fetch opened no segment range"
        time.sleep(0.02)


def test_a_connection_holds_one_descriptor_once_its_records_are_sent(broker_factory) -> None:
    """The socket's duplicate a range is sent through (sendfile, and the writability
    callbacks) stayed open for the connection's life: two descriptors per consumer
    connection, so the open-file limit came at half the connections (helper-74's audit,
    p9). It is closed once nothing waits to be sent."""
    port = _free_port()
    broker = broker_factory(**{"metrics.listen": f"127.0.0.1:{port}"})
    topic = create_topic(broker.bootstrap, partitions=1)
    _fill(broker.bootstrap, topic, _messages(1000))

    def fds() -> int:
        return len(os.listdir(f"/proc/{broker.proc.pid}/fd"))

    conns = [RawConnection(broker.host, broker.port) for _ in range(30)]
    try:
        for conn in conns:
            conn.api_versions()
        before = fds()
        request = fetch_request(topic, 0, 0, 12, 0, 1 << 20)
        reply = schema("fetch", 12, "response").FetchResponse
        for conn in conns:
            (answer,) = conn.request(request, reply).responses
            assert len(answer.partitions[0].records) > 500_000
        assert broker_counters(port)["fetch_bytes_sent_zero_copy"] > 0
        time.sleep(0.2)
        assert fds() - before < 10, f"{fds() - before} descriptors more for 30 connections"
    finally:
        for conn in conns:
            conn.close()


@pytest.mark.slow  # 2-4.5 s each: kept out of the fast set
def test_a_client_gone_mid_send_leaves_nothing_open(broker_factory) -> None:
    """A consumer asks for 24 MB, reads a few bytes of the answer and resets its
    connection while the broker is still sending it: the broker logs no error, every
    segment range it opened is closed, and another client is served at once."""
    port = _free_port()
    broker = broker_factory(**{"metrics.listen": f"127.0.0.1:{port}"})
    topic = create_topic(broker.bootstrap, partitions=1)
    _fill(broker.bootstrap, topic, _messages(24_000))
    for _ in range(3):
        sock = _fetch_unread(broker.port, topic, 24 << 20)
        _wait_range_open(port)
        assert sock.recv(100)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # RST with the response half sent
    deadline = time.monotonic() + 10
    while True:
        counters = broker_counters(port)
        if counters["file_ranges_opened"] == counters["file_ranges_closed"]:
            break
        assert time.monotonic() < deadline, counters
        time.sleep(0.05)
    assert counters["fetch_bytes_sent_zero_copy"] > 0
    assert_broker_healthy(broker, "after-reset")
    log = broker.log(since_start=True)
    assert "Traceback" not in log and " ERROR " not in log


@pytest.mark.slow  # 2-4.5 s each: kept out of the fast set
def test_a_segment_deleted_while_sent_arrives_whole(broker_factory) -> None:
    """A 16 MiB answer from the first segment is held half sent by a client that does not
    read; DeleteRecords then moves the log start past that segment and the broker deletes
    its file; the client then reads the whole answer, byte for byte the produced records."""
    port = _free_port()
    broker = broker_factory(
        **{
            "log.segment.bytes": 16 << 20,
            "log.retention.check.interval.ms": 200,
            "metrics.listen": f"127.0.0.1:{port}",
        }
    )
    topic = create_topic(broker.bootstrap, partitions=1)
    sent = _messages(40_000)
    _fill(broker.bootstrap, topic, sent)
    part_dir = broker.data_dir / "queues" / f"{topic}-0"  # helpers.local_log_start's layout
    first = sorted(p for p in os.listdir(part_dir) if p.endswith(".log"))[0]
    sock = _fetch_unread(broker.port, topic, 64 << 20)
    _wait_range_open(port)  # the answer is in flight, stuck on the full socket
    with RawConnection(broker.host, broker.port) as conn:
        req_mod = schema("delete_records", 2, "request")
        resp_mod = schema("delete_records", 2, "response")
        request = req_mod.DeleteRecordsRequest(
            topics=(
                req_mod.DeleteRecordsTopic(
                    name=topic,
                    partitions=(
                        req_mod.DeleteRecordsPartition(partition_index=i32(0), offset=i64(30_000)),
                    ),
                ),
            ),
            timeout=datetime.timedelta(seconds=10),
        )
        answer = conn.request(request, resp_mod.DeleteRecordsResponse)
        assert answer.topics[0].partitions[0].error_code == 0
    deadline = time.monotonic() + 20
    while (part_dir / first).exists():
        assert time.monotonic() < deadline, "the first segment was not deleted"
        time.sleep(0.05)
    records = _records_of(_read_response(sock))
    sock.close()
    values = _values(records)
    assert len(values) > 1000
    assert values == [m.value for m in sent[: len(values)]]


def _faulty_broker(broker_factory, rules: list[dict[str, object]], **settings: object):
    """A broker process whose storage system calls go through ``faults.FaultyFileOps`` with
    ``rules`` (tests/integration/faulty_serve.py)."""
    broker = broker_factory(start=False, **settings)
    command = broker.command()
    broker.command = (
        lambda: [  # type: ignore[method-assign]
            sys.executable,
            str(FAULTY_SERVE),
            json.dumps(rules),
            *command[4:],
        ]
    )
    return broker.start()


@pytest.mark.slow  # 5 s: a raw client's reconnects
def test_a_failing_sendfile_closes_only_that_connection(broker_factory) -> None:
    """The first ``sendfile`` of a segment range fails with EIO (injected): that fetch's
    connection is closed before a whole answer went out, with an error line in the log and
    the range closed; the same fetch on a new connection gets every record exactly."""
    port = _free_port()
    broker = _faulty_broker(
        broker_factory,
        [{"op": "sendfile", "match": ".log", "error": errno.EIO, "times": 1}],
        **{"metrics.listen": f"127.0.0.1:{port}"},
    )
    topic = create_topic(broker.bootstrap, partitions=1)
    sent = _messages(6_000)
    _fill(broker.bootstrap, topic, sent)
    sock = _fetch_unread(broker.port, topic, 1 << 20)
    with pytest.raises(ConnectionError):
        _read_response(sock)  # closed before a whole answer
    sock.close()
    sock = _fetch_unread(broker.port, topic, 1 << 20)
    values = _values(_records_of(_read_response(sock)))
    sock.close()
    assert len(values) > 500
    assert values == [m.value for m in sent[: len(values)]]
    assert "ERROR stonemq.server: sending fetched records" in broker.log(since_start=True)
    counters = broker_counters(port)
    assert counters["file_ranges_opened"] == counters["file_ranges_closed"] >= 2
    assert counters["fetch_bytes_sent_zero_copy"] >= sum(map(len, values))
    assert_broker_healthy(broker, "after-failed-sendfile")


@pytest.mark.slow  # 2-4.5 s each: kept out of the fast set
def test_a_socket_that_cannot_take_sendfile_gets_the_bytes_copied(broker_factory) -> None:
    """``sendfile`` refused with EINVAL (injected, as a socket type without it answers) on
    a connection's first range: the connection copies that range and every later one
    instead, and the consumer gets every record exactly."""
    port = _free_port()
    broker = _faulty_broker(
        broker_factory,
        [{"op": "sendfile", "match": ".log", "error": errno.EINVAL, "times": 1}],
        **{"metrics.listen": f"127.0.0.1:{port}"},
    )
    topic = create_topic(broker.bootstrap, partitions=1)
    sent = _messages(6_000)
    _fill(broker.bootstrap, topic, sent)
    got = consume(broker.bootstrap, topic, len(sent))
    assert [(m.key, m.value) for m in got] == [(m.key, m.value) for m in sent]
    counters = broker_counters(port)
    assert counters["fetch_bytes_sent_copied"] > 0
    assert counters["file_ranges_opened"] == counters["file_ranges_closed"]
