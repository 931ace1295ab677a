"""Back-pressure on requests in flight: with ``queued.max.request.bytes`` down to one request
at a time over all connections, pipelining producers still get every record stored once, in
order; the serving process keeps out what it does not need (memory is a benchmark figure)."""

from __future__ import annotations

import threading

import pytest

from stonemq.server.connection import RequestBudget

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


class _Reader:
    def __init__(self) -> None:
        self.woken = 0

    def update_reading(self) -> None:
        self.woken += 1


def test_request_budget_lets_one_in_and_wakes_waiters_below_the_limit() -> None:
    budget = RequestBudget(100)
    assert not budget.exhausted
    budget.take(5000)  # one request larger than the limit is always let in
    assert budget.exhausted
    a, b = _Reader(), _Reader()
    budget.waiting |= {a, b}  # type: ignore[arg-type]
    budget.give_back(4900)  # 100 left: at the limit
    assert budget.exhausted and (a.woken, b.woken) == (0, 0)
    budget.give_back(1)
    assert not budget.exhausted and (a.woken, b.woken) == (1, 1)
    assert not budget.waiting
    unlimited = RequestBudget(-1)
    unlimited.take(1 << 40)
    assert not unlimited.exhausted
