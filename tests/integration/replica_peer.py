"""A peer speaking StoneMQ's internal replica-fetch API to a leader, for tests that inject a
follower's faults (a stalled splitter, a fetch of a damaged journal) into the leader's view."""

from __future__ import annotations

import itertools
import socket
import struct
from typing import Any

from kazoo.client import KazooClient

from stonemq.cluster.controller import read_journal_partitions
from stonemq.protocol.replica_fetch import (
    FetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    decode_response,
    encode_request,
)


def journal_states(chroot: str) -> dict[int, Any]:
    """Every journal partition's state (leader, epoch, ISR) from ZooKeeper."""
    zk = KazooClient(chroot)
    zk.start(10)
    try:
        return {j: p.state for j, p in read_journal_partitions(zk).items()}
    finally:
        zk.stop()
        zk.close()


class ReplicaPeer:
    """One connection to a leader, one replica fetch at a time, as replica ``replica_id``."""

    def __init__(self, host: str, port: int, replica_id: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.replica_id = replica_id
        self._ids = itertools.count(1)

    def fetch(
        self, parts: list[FetchPartition], max_wait_ms: int = 200, min_bytes: int = 1
    ) -> ReplicaFetchResponse:
        correlation = next(self._ids)
        request = ReplicaFetchRequest(
            self.replica_id, max_wait_ms, min_bytes, 4 << 20, tuple(parts)
        )
        self.sock.sendall(encode_request(request, correlation))
        (size,) = struct.unpack(">i", self._read(4))
        got, response = decode_response(self._read(size))
        assert got == correlation, (got, correlation)
        return response

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("the leader closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()
