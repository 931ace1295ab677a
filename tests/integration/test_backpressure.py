"""Back-pressure on requests in flight: with ``queued.max.request.bytes`` down to one request
at a time over all connections, pipelining producers still get every record stored once, in
order; the serving process keeps out what it does not need (memory is a benchmark figure)."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from ports import free_port as _free_port  # tests/ (on sys.path: root conftest)

from .helpers import Msg, broker_counters, consume, create_topic, produce
from .rawclient import RawConnection, build_batch, produce_request, schema

pytestmark = pytest.mark.timeout(120)


def test_pipelined_producers_under_a_one_request_budget(broker_factory) -> None:
    broker = broker_factory(**{"queued.max.request.bytes": 1})
    topic = create_topic(broker.bootstrap, partitions=2)
    sent = {
        p: [Msg(b"k%d" % i, b"%d-%d-" % (p, i) + b"x" * 1500) for i in range(3000)] for p in (0, 1)
    }
    errors: list[BaseException] = []

    def run(p: int) -> None:
        try:
            # tiny batches, no linger: hundreds of produce requests in flight per connection
            produce(
                broker.bootstrap,
                topic,
                sent[p],
                partition=p,
                **{"linger.ms": 0, "batch.num.messages": 8, "max.in.flight": 1000},
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    for p in (0, 1):
        got = consume(broker.bootstrap, topic, len(sent[p]), partition=p)
        assert [m.offset for m in got] == list(range(len(sent[p])))
        assert [(m.key, m.value) for m in got] == [(m.key, m.value) for m in sent[p]]
    with open(f"/proc/{broker.proc.pid}/maps") as f:
        maps = f.read()
    assert "librdkafka" not in maps  # the admin CLI's Kafka client is not loaded to serve


def test_producers_at_the_splitters_pace_with_a_zero_lag_limit(broker_factory) -> None:
    """``splitter.max.lag.bytes=0``: after every write the broker stops reading until the
    splitter has caught up; pipelining producers still get every record stored once, in
    order, and nothing stalls."""
    broker = broker_factory(**{"splitter.max.lag.bytes": 0, "splitter.batch.bytes": 65536})
    topic = create_topic(broker.bootstrap, partitions=3)
    sent = {
        p: [Msg(b"k%d" % i, b"%d-%d-" % (p, i) + b"y" * 900) for i in range(4000)] for p in range(3)
    }
    errors: list[BaseException] = []

    def run(p: int) -> None:
        try:
            produce(broker.bootstrap, topic, sent[p], partition=p, **{"linger.ms": 1})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    for p in range(3):
        got = consume(broker.bootstrap, topic, len(sent[p]), partition=p)
        assert [(m.offset, m.key, m.value) for m in got] == [
            (i, m.key, m.value) for i, m in enumerate(sent[p])
        ]


@pytest.mark.parametrize("max_lag", [0, 64 << 20])
def test_the_broker_accounts_where_produce_time_goes(broker_factory, max_lag: int) -> None:
    """The Prometheus counters of produce time (queued, handled), split-lag holds and the
    splitter's time (its thread, the loop, waiting for the loop, idle) move with the work:
    with a zero lag limit every produce is held until the splitter caught up, and the time
    held is part of the time produces waited queued; under the default 64 MiB limit 10 MB of
    produces are never held."""
    port = _free_port()
    broker = broker_factory(
        **{
            "splitter.max.lag.bytes": max_lag,
            "splitter.batch.bytes": 65536,
            "metrics.listen": f"127.0.0.1:{port}",
        }
    )
    topic = create_topic(broker.bootstrap, partitions=1)
    before = broker_counters(port)
    sent = [Msg(None, b"%d-" % i + b"z" * 1000) for i in range(8000)]
    produce(broker.bootstrap, topic, sent, **{"linger.ms": 1})
    # and 24 Produce requests pipelined on one connection: each next one is already read
    # when the one before it is answered, however slowly a loaded machine runs the producer
    # above (whose requests could each arrive after the splitter had caught up: no hold)
    batch = bytes(build_batch([(None, b"p" * 1000)] * 64))
    answer_type = schema("produce", 7, "response").ProduceResponse
    with RawConnection(broker.host, broker.port) as conn:
        ids = [conn.send_request(produce_request(topic, 0, batch, acks=1)) for _ in range(24)]
        for correlation_id in ids:
            answer = conn.recv_response(answer_type, correlation_id)
            assert answer.responses[0].partition_responses[0].error_code == 0
    moved = {k: v - before.get(k, 0.0) for k, v in broker_counters(port).items()}
    assert moved["produce_requests_started"] >= 1
    assert moved["produce_handled_seconds"] > 0
    assert moved["splitter_steps"] >= 1
    assert moved["splitter_thread_seconds"] > 0 and moved["splitter_loop_seconds"] > 0
    assert moved["splitter_loop_wait_seconds"] > 0 and moved["splitter_idle_seconds"] > 0
    if max_lag == 0:
        assert moved["split_lag_holds"] >= 1
        assert 0 < moved["split_lag_held_seconds"] <= moved["produce_queued_seconds"]
    else:
        assert moved["split_lag_holds"] == 0 and moved["split_lag_held_seconds"] == 0
    got = consume(broker.bootstrap, topic, len(sent) + 24 * 64)
    assert [m.value for m in got] == [m.value for m in sent] + [b"p" * 1000] * (24 * 64)


def _labelled(port: int, family: str) -> dict[int, float]:
    """The ``api_key``-labelled samples of ``stonemq_<family>_total``, by api key."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    prefix = f'stonemq_{family}_total{{api_key="'
    out: dict[int, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, value = line[len(prefix) :].partition('"} ')
            out[int(key)] = float(value)
    return out


def _request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


def test_the_broker_accounts_loop_time_per_api_and_the_loops_lag(broker_factory) -> None:
    """Time on the event loop per api key (handler steps, encoding, sending) and requests
    answered per api key, counted exactly for requests sent on a raw socket; a produce's
    time split into its steps on the loop and its wait to start, both within its handling
    time; the loop-lag probe runs."""
    port = _free_port()
    broker = broker_factory(**{"metrics.listen": f"127.0.0.1:{port}"})
    topic = create_topic(broker.bootstrap, partitions=1)
    produce(broker.bootstrap, topic, [Msg(None, b"x" * 1000) for _ in range(2000)])
    before, loop_before = broker_counters(port), _labelled(port, "request_loop_seconds")
    count_before = _labelled(port, "request_count")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        burst = [_request(18, 0, i) for i in range(5)]  # ApiVersions v0
        burst += [_request(3, 1, 5 + i, struct.pack(">i", -1)) for i in range(7)]  # Metadata
        sock.sendall(b"".join(burst))
        for _ in burst:
            size = struct.unpack(">i", _read_exact(sock, 4))[0]
            _read_exact(sock, size)
    time.sleep(0.3)  # the lag probe runs every 10 ms
    after, loop_after = broker_counters(port), _labelled(port, "request_loop_seconds")
    count_after = _labelled(port, "request_count")
    assert count_after[18] - count_before.get(18, 0) == 5
    assert count_after[3] - count_before.get(3, 0) == 7
    assert loop_after[18] > loop_before.get(18, 0) and loop_after[3] > loop_before.get(3, 0)
    assert after["loop_lag_probes"] - before["loop_lag_probes"] >= 5
    assert after["loop_lag_seconds"] >= before["loop_lag_seconds"]
    produces = after["produce_requests_started"]
    assert produces >= 1 and count_after[0] == produces  # one broker, this test's produces
    assert after["produce_steps"] >= produces
    assert 0 < after["produce_loop_seconds"] <= after["produce_handled_seconds"]
    assert after["produce_start_wait_seconds"] <= after["produce_handled_seconds"]
    assert loop_after[0] >= after["produce_loop_seconds"]


def _read_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "broker closed the connection"
        out += chunk
    return bytes(out)
