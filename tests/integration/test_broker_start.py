"""The suite's broker start: ports handed out once, a broker that cannot listen never taken
for ready (a CI run's ISR wait failed on a broker that had exited on "address already in use"
while its port accepted connections for another broker's listener)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from conftest import BrokerStartError
from ports import free_port


def test_free_port_hands_a_port_out_once_in_any_4096_calls() -> None:
    handed = [free_port() for _ in range(40_000)]
    for start in range(0, len(handed) - 4096, 1024):
        window = handed[start : start + 4096]
        assert len(set(window)) == len(window), f"a port handed out twice after call {start}"


def test_a_broker_whose_port_is_taken_is_not_ready(broker_factory: Any) -> None:
    """Another listener on the broker's port accepts connections: the broker exits on
    "address already in use", which holds the letters "ready", and is never reported ready."""
    broker = broker_factory(start=False)
    with socket.socket() as taken:
        taken.bind((broker.host, broker.port))
        taken.listen(8)
        broker.spawn()
        with pytest.raises(BrokerStartError, match="address already in use"):
            broker.wait_ready(30)
