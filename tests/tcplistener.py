"""A TCP listener for tests of the brokers' reachability watch (stonemq/cluster/liveness.py):
it stands in for a broker's listener, and can die and come back on the same port."""

from __future__ import annotations

import socket
import threading


class Listener:
    """A listener in this process that accepts and holds connections; :meth:`kill` closes it
    and every accepted connection (what a dying process's kernel does), :meth:`revive` listens
    on the same port again, :meth:`drop_connections` closes the connections only."""

    def __init__(self) -> None:
        self.port = 0
        self.accepted: list[socket.socket] = []
        self._server: socket.socket | None = None
        self.revive()

    def revive(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self.port = server.getsockname()[1]
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def drop_connections(self) -> None:
        for conn in self.accepted:
            conn.close()

    @property
    def listening(self) -> bool:
        return self._server is not None

    def kill(self) -> None:
        assert self._server is not None
        # shutdown first: a close alone leaves the socket listening while the accept thread
        # is blocked in it
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._server = None
        self.drop_connections()
