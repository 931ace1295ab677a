"""How many connections the broker accepts at once, in all and per client address: Kafka's
``max.connections``, ``max.connections.per.ip`` and ``max.connections.per.ip.overrides``
(its ``ConnectionQuotas``). A connection past a limit is closed as it arrives, with a log
line (one a second at most), as Kafka's acceptor closes it.

Without a per-address limit one client opening connections in a loop takes every slot of
``max.connections`` (lowered to what the open-file limit leaves) and every other client is
refused; ``max.connections.per.ip`` bounds what one address can hold."""

from __future__ import annotations

import ipaddress
import logging
import socket
import time

log = logging.getLogger("stonemq.server")

UNLIMITED = 2_147_483_647
"""Kafka's default for both limits (Int.MaxValue)."""


def parse_overrides(text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``host:count`` entries separated by commas (a
    host is an IP address or a name; an IPv6 address as is, the count after its last
    colon). ValueError naming the entry that is not one."""
    out: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        host, sep, count = entry.rpartition(":")
        host = host.strip().strip("[]")
        if not sep or not host or not count.strip().isdigit():
            raise ValueError(
                f"max.connections.per.ip.overrides: {entry!r} is not host:count "
                "(a count of 0 or more)"
            )
        out[host] = int(count)
    return out


def _address(host: str) -> str:
    """The canonical text of an IP address (an IPv4 address mapped into IPv6 as IPv4)."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def _key(host: str) -> str:
    """The count's key of a peer: its canonical address (a peer that is not an IP address,
    a Unix socket's, is counted under its own text: the total limit and the default apply)."""
    try:
        return _address(host)
    except ValueError:
        return host


def resolve_overrides(overrides: dict[str, int]) -> dict[str, int]:
    """The overrides by IP address: a host name stands for every address it resolves to
    (Kafka resolves each once, at start). OSError when a name does not resolve."""
    out: dict[str, int] = {}
    for host, count in overrides.items():
        try:
            out[_address(host)] = count
            continue
        except ValueError:
            pass  # a name
        for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP):
            out[_address(str(info[4][0]))] = count
    return out


class ConnectionLimits:
    """The open connections' count, in all and by client address, against the limits."""

    def __init__(
        self,
        max_connections: int = UNLIMITED,
        per_ip: int = UNLIMITED,
        overrides: dict[str, int] | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.per_ip = per_ip
        self.overrides = overrides or {}
        self.open = 0
        self._by_address: dict[str, int] = {}
        self._refused = 0  # since the last log line
        self._logged_at = 0.0

    def admit(self, host: str) -> bool:
        """Count a connection from ``host`` in if both limits allow it (then
        :meth:`release` it when it closes); else log it and answer False."""
        address = _key(host)
        held = self._by_address.get(address, 0)
        if self.open >= self.max_connections:
            self._log_refusal(host, f"{self.open} are open, max.connections")
            return False
        limit = self.overrides.get(address, self.per_ip)
        if held >= limit:
            self._log_refusal(
                host, f"{held} are open from {address}, max.connections.per.ip {limit}"
            )
            return False
        self.open += 1
        self._by_address[address] = held + 1
        return True

    def release(self, host: str) -> None:
        address = _key(host)
        held = self._by_address.get(address, 0)
        if held <= 0:
            return
        self.open -= 1
        if held == 1:
            del self._by_address[address]
        else:
            self._by_address[address] = held - 1

    def held_by(self, host: str) -> int:
        """Connections open from ``host`` now."""
        return self._by_address.get(_key(host), 0)

    def _log_refusal(self, host: str, why: str) -> None:
        """The first refusal at once, then one line a second at most."""
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:
            log.warning("refused %d connection(s) (the last from %s): %s", self._refused, host, why)
            self._refused, self._logged_at = 0, now
