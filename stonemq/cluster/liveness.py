"""Which registered brokers are dead before ZooKeeper says so: one idle TCP connection from
this broker to every other registered broker's listener, watched in one thread.

A broker's ZooKeeper registration outlives its process by up to
``zookeeper.session.timeout.ms``: nothing in ZooKeeper changes until the session expires. A
SIGKILLed (or crashed) process's sockets, though, are closed by its kernel at once: the
connections to its listener end (FIN or RST) and a new connect to the listener's port is
refused. So a broker is judged **dead** here when

1. this broker had a connection to its listener under its current registration (the
   registration node's creation zxid: a restart, which registers anew, starts afresh; a
   broker still recovering, registered but not listening yet, is never judged), and
2. that connection closed, and
3. every connect since has been *refused* (ECONNREFUSED: the host answered, nothing listens).

A connect that times out or fails otherwise (a host down, a network partition) proves
nothing and leaves the broker live: its session's expiry decides, as before. A paused
process (SIGSTOP, a long GC-like stall) keeps its connections open and its listener's
backlog accepts connects, so it is never judged here either. A dead broker is probed again
every ``retry_s``; a connect that succeeds makes it live again (a misjudgement undone).

Nothing is sent on the connections (a broker that closes an idle connection,
``connections.max.idle.ms``, is simply connected to again). What a judgement is used for,
and why a wrong one is safe, is the controller's business (:mod:`stonemq.cluster.controller`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

RETRY_S = 0.25
"""How often a dead (or unreachable) broker's listener is connected to again."""
CONNECT_TIMEOUT_S = 5.0
"""A connect still pending after this long is abandoned (and proves nothing)."""
_PEEK_S = 0.005
"""How long :meth:`Reachability.unreachable`'s answer is reused (one request's many calls)."""
_FLAP_S = 0.05
"""The pause before reconnecting after a connection that closed right after it opened (a
listener going away while the process exits), so a flapping peer is not a busy loop."""


@dataclass(frozen=True, slots=True)
class Registration:
    """A registered broker's listener and the creation zxid of its registration node."""

    host: str
    port: int
    zxid: int


@dataclass(slots=True)
class _Peer:
    broker_id: int
    reg: Registration
    sock: socket.socket | None = None
    connecting_since: float = 0.0  # >0 while a connect is pending
    connected_at: float = 0.0  # >0 while connected
    ever_connected: bool = False  # under this registration
    closed: bool = False  # a connection ended since the last successful connect
    dead: bool = False
    next_attempt: float = 0.0


class Reachability:
    """Watches the listeners of the brokers given to :meth:`set_brokers` (not this one's);
    calls ``on_change(broker_id, dead)`` (in its own thread) each time a broker is judged
    dead or live again."""

    def __init__(
        self,
        own_id: int,
        on_change: Callable[[int, bool], None],
        retry_s: float = RETRY_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.own_id = own_id
        self._on_change = on_change
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s
        self._peers: dict[int, _Peer] = {}
        self._wanted: dict[int, Registration] | None = None
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._dead: frozenset[int] = frozenset()
        self._unreachable: tuple[float, frozenset[int]] | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"stonemq-reachability-{own_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def set_brokers(self, brokers: dict[int, Registration]) -> None:
        """The registered brokers now (this broker's own id is ignored)."""
        with self._lock:
            self._wanted = {b: r for b, r in brokers.items() if b != self.own_id}
        self._wake()

    def dead(self) -> frozenset[int]:
        """The registered brokers judged dead now."""
        return self._dead

    def unreachable(self) -> frozenset[int]:
        """The brokers judged dead, and those whose connection has just closed and whose
        listener has not been tried again yet: what clients are told has no live leader
        (LEADER_NOT_AVAILABLE), never what an election decides on. A client sees a killed
        leader's connection reset at the moment this broker's connection to it is closed,
        and its metadata request can reach this broker before the watch has tried the
        listener again; the closed connection is already in this kernel then, so it is
        looked at here (a non-consuming peek, at most once per ``_PEEK_S``)."""
        now = time.monotonic()
        cached = self._unreachable
        if cached is not None and now - cached[0] < _PEEK_S:
            return cached[1]
        out = set(self._dead)
        with self._lock:
            for b, peer in list(self._peers.items()):
                if b in out:
                    continue
                if peer.closed:  # closed since it last accepted; tried again right now
                    out.add(b)
                    continue
                sock = peer.sock
                if sock is None or peer.connecting_since or not peer.connected_at:
                    continue
                try:
                    if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        out.add(b)
                except BlockingIOError:
                    pass
                except OSError:
                    out.add(b)
        result = frozenset(out)
        self._unreachable = (now, result)
        return result

    def close(self) -> None:
        self._closed = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(5)

    # -- the thread -------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        try:
            while not self._closed:
                self._apply_wanted()
                now = time.monotonic()
                for peer in list(self._peers.values()):
                    if peer.sock is None and peer.next_attempt <= now:
                        self._connect(peer, now)
                    elif peer.connecting_since and now - peer.connecting_since > (
                        self.connect_timeout_s
                    ):
                        self._drop_socket(peer)  # proves nothing: tried again
                        peer.next_attempt = now + self.retry_s
                for key, events in self._sel.select(self._timeout()):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                        continue
                    peer = key.data
                    if peer.connecting_since:
                        self._connect_done(peer)
                    elif events & selectors.EVENT_READ:
                        self._readable(peer)
        except Exception:  # never silently: without it deaths wait for the session expiry
            log.exception("broker reachability watch failed; deaths wait for session expiry")
        finally:
            for peer in self._peers.values():
                self._drop_socket(peer)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _timeout(self) -> float:
        now = time.monotonic()
        wait = 1.0
        for peer in self._peers.values():
            if peer.sock is None:
                wait = min(wait, max(peer.next_attempt - now, 0.0))
            elif peer.connecting_since:
                wait = min(wait, max(peer.connecting_since + self.connect_timeout_s - now, 0.0))
        return wait

    def _apply_wanted(self) -> None:
        with self._lock:
            wanted, self._wanted = self._wanted, None
        if wanted is None:
            return
        changed = False
        for b in list(self._peers):
            peer = self._peers[b]
            if wanted.get(b) != peer.reg:  # deregistered, or registered anew (a restart)
                self._drop_socket(peer)
                del self._peers[b]
                changed |= peer.dead
        for b, reg in wanted.items():
            if b not in self._peers:
                self._peers[b] = _Peer(b, reg)
        if changed:
            self._publish()

    def _connect(self, peer: _Peer, now: float) -> None:
        try:
            infos = socket.getaddrinfo(peer.reg.host, peer.reg.port, type=socket.SOCK_STREAM)
            family, _, _, _, address = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            log.debug("broker %d: no address for %s: %s", peer.broker_id, peer.reg, exc)
            peer.next_attempt = now + self.retry_s
            return
        sock.setblocking(False)
        code = sock.connect_ex(address)
        peer.sock = sock
        peer.connecting_since = now
        if code in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
            self._sel.register(sock, selectors.EVENT_WRITE, peer)
            return
        self._connect_failed(peer, code)

    def _connect_done(self, peer: _Peer) -> None:
        assert peer.sock is not None
        code = peer.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code != 0:
            self._connect_failed(peer, code)
            return
        self._sel.modify(peer.sock, selectors.EVENT_READ, peer)
        peer.connecting_since = 0.0
        peer.connected_at = time.monotonic()
        peer.ever_connected = True
        peer.closed = False
        if peer.dead:
            peer.dead = False
            log.warning(
                "broker %d's listener %s:%d accepts connections again: live",
                peer.broker_id,
                peer.reg.host,
                peer.reg.port,
            )
            self._publish(peer.broker_id, False)

    def _connect_failed(self, peer: _Peer, code: int) -> None:
        self._drop_socket(peer)
        peer.next_attempt = time.monotonic() + self.retry_s
        if code == errno.ECONNREFUSED and peer.ever_connected and peer.closed and not peer.dead:
            peer.dead = True
            log.warning(
                "broker %d judged dead: its connection closed and its listener %s:%d refuses "
                "connections (its ZooKeeper session has not ended yet)",
                peer.broker_id,
                peer.reg.host,
                peer.reg.port,
            )
            self._publish(peer.broker_id, True)

    def _readable(self, peer: _Peer) -> None:
        assert peer.sock is not None
        try:
            data = peer.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return  # nothing is asked, so nothing is expected; ignored
        lived = time.monotonic() - peer.connected_at
        self._drop_socket(peer)
        peer.closed = True
        peer.next_attempt = time.monotonic() + (_FLAP_S if lived < 1.0 else 0.0)

    def _drop_socket(self, peer: _Peer) -> None:
        if peer.sock is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(peer.sock)
            with self._lock:  # :meth:`unreachable` peeks at it from another thread
                peer.sock.close()
                peer.sock = None
        peer.connecting_since = 0.0
        peer.connected_at = 0.0

    def _publish(self, broker_id: int | None = None, dead: bool | None = None) -> None:
        self._dead = frozenset(b for b, p in self._peers.items() if p.dead)
        if broker_id is not None and dead is not None:
            try:
                self._on_change(broker_id, dead)
            except Exception:
                log.exception("reachability listener failed")
