"""The pool of idle clients kept between a Spark Python worker's tasks: one task at a time
per client, a bounded number kept per configuration, idle ones closed after the timeout."""

from __future__ import annotations

import time

from stonemq.spark import pool
from stonemq.spark.pool import ClientPool, config_key


class Client:
    """Stands in for a confluent-kafka client: only closing is observed."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_take_gives_back_the_last_returned_client_of_that_configuration() -> None:
    closed: list[Client] = []
    p = ClientPool(closed.append)
    a, b = Client(), Client()
    assert p.take("k") is None
    p.give("k", a)
    p.give("k", b)
    assert p.take("other") is None
    assert p.take("k") is b and p.take("k") is a and p.take("k") is None
    assert closed == []


def test_no_more_than_the_limit_is_kept_per_configuration() -> None:
    closed: list[Client] = []
    p = ClientPool(closed.append)
    clients = [Client() for _ in range(pool.IDLE_PER_KEY + 2)]
    for c in clients:
        p.give("k", c)
    assert p.idle() == pool.IDLE_PER_KEY
    assert closed == clients[pool.IDLE_PER_KEY :]


def test_sweep_closes_only_clients_idle_past_the_timeout() -> None:
    closed: list[Client] = []
    p = ClientPool(closed.append)
    old, new = Client(), Client()
    p.give("a", old)
    now = time.monotonic()
    p.give("b", new)
    assert p.sweep(now + 1) == 0
    p._idle["a"] = [(now - pool.IDLE_TIMEOUT_S - 1, old)]  # returned long ago
    assert p.sweep(now) == 1
    assert closed == [old] and p.take("a") is None and p.take("b") is new


def test_configuration_keys_ignore_the_named_settings_and_value_types() -> None:
    a = config_key({"bootstrap.servers": "h:1", "group.id": "x", "linger.ms": 5}, ("group.id",))
    b = config_key({"linger.ms": "5", "group.id": "y", "bootstrap.servers": "h:1"}, ("group.id",))
    assert a == b
    assert config_key({"bootstrap.servers": "h:1"}) != config_key({"bootstrap.servers": "h:2"})
