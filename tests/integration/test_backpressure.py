"""Back-pressure on requests in flight: with ``queued.max.request.bytes`` down to one request
at a time over all connections, pipelining producers still get every record stored once, in
order; the serving process keeps out what it does not need (memory is a benchmark figure)."""

from __future__ import annotations

import socket
import threading

import pytest

from .helpers import Msg, broker_counters, consume, create_topic, produce

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("max_lag", [0, 64 << 20])
def test_the_broker_accounts_where_produce_time_goes(broker_factory, max_lag: int) -> None:
    """The Prometheus counters of produce time (queued, handled), split-lag holds and the
    splitter's time (its thread, the loop, waiting for the loop, idle) move with the work:
    with a zero lag limit every produce is held until the splitter caught up, and the time
    held is part of the time produces waited queued; under the default 64 MiB limit 8 MB of
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
    got = consume(broker.bootstrap, topic, len(sent))
    assert [m.value for m in got] == [m.value for m in sent]
