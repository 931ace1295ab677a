"""A load generator that measures the broker, not the client: every ProduceRequest carries a
batch for many partitions, as Kafka's Java client sends every ready partition's batch for a
broker in one request (librdkafka sends one partition per request, so at 10,000 partitions
its own per-request cost caps the rate; issue "flat cost", item 2).

It is a load generator, not a compatibility claim: batches are built once with the project's
record codec (``stonemq.protocol.record_batch``) and requests are packed by hand (Produce v7,
the non-flexible layout); up to ``IN_FLIGHT`` requests are pipelined on one connection and
every partition response's error code is checked. Partitions are visited round-robin, so
at ``n`` partitions each request carries ``min(n, REQUEST_BYTES // batch size)`` of them.
"""

from __future__ import annotations

import collections
import os
import socket
import struct
import threading
import time
import traceback
from multiprocessing.queues import Queue
from typing import Any

REQUEST_BYTES = 1 << 20  # a request's record bytes, as Kafka's max.request.size
BATCH_BYTES = 16 * 1024  # a partition's batch, at most (Kafka's batch.size)
IN_FLIGHT = 5  # as max.in.flight.requests.per.connection
PRODUCE = 0
VERSION = 7
ACKS = 1
TIMEOUT_MS = 30_000


def entry(q: Queue[Any], name: str, *args: Any) -> None:
    try:
        q.put(("done", globals()[name](q, *args)))
    except BaseException:
        q.put(("error", traceback.format_exc()))


def _batch(size: int, records: int) -> bytes:
    from stonemq.protocol.record_batch import encode_batch

    payload = os.urandom(size)
    now = int(time.time() * 1000)
    return bytes(encode_batch(0, [(now, None, payload, ())] * records))


def _request(correlation_id: int, topic: bytes, entries: list[bytes], acks: int = ACKS) -> bytes:
    """Produce v7 of one topic; ``entries`` are its partitions' (index, records) encodings."""
    head = struct.pack(">hhih", PRODUCE, VERSION, correlation_id, 5) + b"bench"
    head += struct.pack(">hhi", -1, acks, TIMEOUT_MS)  # transactional id null, acks, timeout
    head += struct.pack(">ih", 1, len(topic)) + topic + struct.pack(">i", len(entries))
    body = b"".join(entries)
    return struct.pack(">i", len(head) + len(body)) + head + body


def _errors(frame: bytes) -> tuple[int, int]:
    """(partitions answered, partitions with an error) of a Produce v7 response."""
    pos = 4  # correlation id
    (topics,) = struct.unpack_from(">i", frame, pos)
    pos += 4
    answered = failed = 0
    for _ in range(topics):
        (name_len,) = struct.unpack_from(">h", frame, pos)
        pos += 2 + name_len
        (count,) = struct.unpack_from(">i", frame, pos)
        pos += 4
        for _ in range(count):
            _, error = struct.unpack_from(">ih", frame, pos)
            pos += 4 + 2 + 8 + 8 + 8
            answered += 1
            failed += error != 0
    return answered, failed


def _read_frame(sock: socket.socket) -> bytes:
    head = _read(sock, 4)
    return _read(sock, struct.unpack(">i", head)[0])


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def multi_produce(
    q: Queue[Any],
    port: int,
    topic: str,
    partitions: int,
    size: int,
    duration: float,
    max_bytes: int,
    acks: int = ACKS,
    per_request: int = 0,
    batch_bytes: int = BATCH_BYTES,
) -> dict[str, Any]:
    """Produce ``size``-byte records to every partition of ``topic`` for ``duration`` s or
    ``max_bytes`` of payload; the records, batches, requests and errors. ``per_request`` (0:
    as many as fit in ``REQUEST_BYTES``) and ``batch_bytes`` fix the request's shape: one
    partition of a 96 KiB batch is what librdkafka sends at 10,000 partitions, and the same
    shape at one partition tells the broker's cost per partition from its cost per request."""
    plan = _Plan(partitions, size, per_request, batch_bytes)
    q.put(("start", os.getpid()))
    started = time.monotonic()
    out = _drive(port, topic, list(range(partitions)), plan, started, duration, max_bytes, acks)
    out["seconds"] = time.monotonic() - started
    return plan.result(out)


def multi_produce_leaders(
    q: Queue[Any],
    bootstrap: str,
    topic: str,
    partitions: int,
    size: int,
    duration: float,
    max_bytes: int,
    acks: int = ACKS,
) -> dict[str, Any]:
    """:func:`multi_produce` against a cluster: each partition's batches go to its leader
    (from Metadata, read once), one connection and one sending thread per leader broker, so
    every request carries the ready partitions of one broker as Kafka's Java client does.
    The batch size is the single-broker one (a request's partitions as if one broker led all),
    so the load per batch is the same with one leader or three."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    ports = {b.id: b.port for b in meta.brokers.values()}
    by_leader: dict[int, list[int]] = collections.defaultdict(list)
    for p, pm in sorted(meta.topics[topic].partitions.items()):
        if pm.leader < 0:
            raise RuntimeError(f"{topic}-{p} has no leader")
        by_leader[pm.leader].append(p)
    plan = _Plan(partitions, size)
    share = max_bytes // len(by_leader)  # each leader's part of the byte cap
    q.put(("start", os.getpid()))
    started = time.monotonic()
    outs: list[dict[str, int]] = []
    errors: list[BaseException] = []

    def run(leader: int, mine: list[int]) -> None:
        try:
            outs.append(_drive(ports[leader], topic, mine, plan, started, duration, share, acks))
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(leader, mine), daemon=True)
        for leader, mine in sorted(by_leader.items())
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    total = {k: sum(o[k] for o in outs) for k in ("batches", "failed", "answered", "requests")}
    total["seconds"] = time.monotonic() - started
    result = plan.result(total)
    result["leaders"] = len(by_leader)
    return result


class _Plan:
    """Batch and request sizes for ``partitions`` partitions of ``size``-byte records."""

    def __init__(
        self, partitions: int, size: int, per_request: int = 0, batch_bytes: int = BATCH_BYTES
    ) -> None:
        self.size = size
        fit = REQUEST_BYTES // max(size, 1)
        self.per_request = max(1, min(partitions, per_request or fit))
        self.records_per_batch = max(1, min(batch_bytes, REQUEST_BYTES // self.per_request) // size)
        batch = _batch(size, self.records_per_batch)
        self.record = struct.pack(">i", len(batch)) + batch

    def result(self, total: dict[str, Any]) -> dict[str, Any]:
        ok = total["batches"] - total["failed"]
        return {
            "msgs": ok * self.records_per_batch,
            "bytes": ok * self.records_per_batch * self.size,
            "batches": ok,
            "requests": total["requests"],
            "records_per_batch": self.records_per_batch,
            "partitions_per_request": self.per_request,
            "seconds": total["seconds"],
            "errors": total["failed"] + (total["batches"] - total["answered"]),
        }


def _drive(
    port: int,
    topic: str,
    mine: list[int],
    plan: _Plan,
    started: float,
    duration: float,
    max_bytes: int,
    acks: int,
) -> dict[str, int]:
    """One connection producing to the partitions ``mine`` round-robin, up to ``IN_FLIGHT``
    requests pipelined, until ``duration`` from ``started`` or ``max_bytes``."""
    per_request = min(plan.per_request, len(mine))
    # each partition's entry encoded once: the generator's own cost per batch is a slice
    entries = [struct.pack(">i", p) + plan.record for p in mine]
    name = topic.encode()
    batch_bytes = plan.records_per_batch * plan.size
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pending: collections.deque[int] = collections.deque()
    next_partition = 0
    cid = 0
    batches = failed = answered = 0
    try:
        while True:
            done = time.monotonic() - started >= duration or batches * batch_bytes >= max_bytes
            if not done and len(pending) < IN_FLIGHT:
                chosen = entries[next_partition : next_partition + per_request]
                if len(chosen) < per_request:  # wrap around
                    chosen += entries[: per_request - len(chosen)]
                next_partition = (next_partition + per_request) % len(entries)
                cid += 1
                sock.sendall(_request(cid, name, chosen, acks))
                pending.append(len(chosen))
                batches += len(chosen)
                continue
            if not pending:
                break
            got, bad = _errors(_read_frame(sock))
            pending.popleft()
            answered += got
            failed += bad
    finally:
        sock.close()
    return {"batches": batches, "failed": failed, "answered": answered, "requests": cid}
