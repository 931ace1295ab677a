"""Back-pressure on requests in flight: with ``queued.max.request.bytes`` down to one request
at a time over all connections, pipelining producers still get every record stored once, in
order; the serving process keeps out what it does not need (memory is a benchmark figure)."""

from __future__ import annotations

import threading

import pytest

from .helpers import Msg, consume, create_topic, produce

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
