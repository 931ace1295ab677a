"""Free TCP ports for the processes a test starts (brokers, ZooKeeper, proxies, moto)."""

from __future__ import annotations

import socket

_HANDED_OUT: dict[int, None] = {}  # the ports free_port() gave, oldest first
_HANDED_OUT_KEPT = 4096


def free_port() -> int:
    """A loopback port free now and not handed out recently by this process. Once a bind(0)
    socket is closed the kernel may give the same port to the next one (26 triples of calls
    in 100,000 here), and two brokers of one test given one port leave one that cannot
    listen: in a CI run brokers 1 and 2 both got one port, and the test waited 30 s for an
    ISR naming broker 2, which had exited on "address already in use"."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT[port] = None
            if len(_HANDED_OUT) > _HANDED_OUT_KEPT:
                del _HANDED_OUT[next(iter(_HANDED_OUT))]
            return port
