"""The connection limits (Kafka's max.connections, max.connections.per.ip and its overrides):
parsing, and the counts under any order of admissions and releases."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stonemq.config import Settings
from stonemq.server.connection_limits import (
    ConnectionLimits,
    parse_overrides,
    resolve_overrides,
)


def test_overrides_parse_as_kafkas_host_count_list() -> None:
    assert parse_overrides("") == {}
    assert parse_overrides("10.0.0.1:5, host-a:0,::1:7,[fe80::1]:2") == {
        "10.0.0.1": 5,
        "host-a": 0,
        "::1": 7,
        "fe80::1": 2,
    }
    for bad in ("10.0.0.1", "10.0.0.1:x", ":3", "h:-1"):
        with pytest.raises(ValueError, match="is not host:count"):
            parse_overrides(bad)


def test_a_name_stands_for_its_addresses_and_mapped_addresses_are_ipv4() -> None:
    resolved = resolve_overrides({"localhost": 3, "::ffff:10.1.2.3": 1})
    assert resolved["127.0.0.1"] == 3 and resolved["10.1.2.3"] == 1


def test_settings_refuse_a_zero_limit_without_overrides_and_bad_overrides() -> None:
    with pytest.raises(ValueError, match="can be set to zero only if"):
        Settings(max_connections_per_ip=0)
    with pytest.raises(ValueError, match="is not host:count"):
        Settings(max_connections_per_ip_overrides="10.0.0.1")
    assert Settings(max_connections_per_ip=0, max_connections_per_ip_overrides="a:1")


def test_the_total_limit_comes_first_and_an_override_raises_one_address() -> None:
    limits = ConnectionLimits(max_connections=5, per_ip=2, overrides={"10.0.0.9": 4})
    assert [limits.admit("10.0.0.1") for _ in range(3)] == [True, True, False]
    assert [limits.admit("10.0.0.9") for _ in range(3)] == [True, True, True]
    assert not limits.admit("10.0.0.2")  # five open: max.connections
    limits.release("10.0.0.9")
    assert limits.admit("::ffff:10.0.0.2")  # the same address as 10.0.0.2
    assert limits.held_by("10.0.0.2") == 1 and limits.open == 5


@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(["10.0.0.1", "10.0.0.2", "::1", "?"])),
        max_size=80,
    )
)
def test_counts_follow_admissions_and_releases(ops: list[tuple[bool, str]]) -> None:
    """Whatever the order, the counts are those of the connections admitted and not yet
    released, and neither limit is ever passed."""
    limits = ConnectionLimits(max_connections=6, per_ip=3, overrides={"::1": 5})
    held: dict[str, int] = {}
    for opening, host in ops:
        if opening:
            if limits.admit(host):
                held[host] = held.get(host, 0) + 1
        elif held.get(host):
            limits.release(host)
            held[host] -= 1
        assert limits.open == sum(held.values()) <= 6
        for host_, count in held.items():
            assert limits.held_by(host_) == count <= (5 if host_ == "::1" else 3)
