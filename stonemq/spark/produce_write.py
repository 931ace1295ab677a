"""The Spark sink's producer: record batches built from Arrow columns and sent by an idempotent
acks=all producer of our own, without a Python call per record.

librdkafka takes one ``produce`` call per record, and with the ``to_pylist`` that feeds it that
was 43% of a streaming query's worker CPU (docs/benchmarks/analysis.md, "Spark data source,
fourth pass"). Here each Arrow batch Spark hands the writer is:

1. partitioned as Kafka's Java producer partitions (what Spark's Kafka sink uses): the
   ``partition`` column where it is set, else the murmur2 hash of the key, else runs of
   null-keyed rows sticking to one partition (:mod:`stonemq.spark.partitioner`);
2. cut per partition into batches of at most ``batch.size`` bytes of records (default
   :data:`DEFAULT_BATCH_BYTES`; a larger record goes alone), its records written by the
   record codec's columnar encoder (:mod:`stonemq.protocol.arrow_records`) and wrapped with
   the producer id, epoch and base sequence (:func:`stonemq.protocol.record_batch.batch_parts`);
3. sent in Produce requests (v8, acks=all, one batch per partition a request, as Kafka
   requires) to each partition's leader, up to ``max.in.flight.requests.per.connection`` (5)
   pipelined on one connection a broker.

Delivery is Kafka's idempotent producer's: a batch keeps its sequence numbers across retries,
so a broker that already appended it answers it as a duplicate. A retriable error (a moved
leader, NOT_ENOUGH_REPLICAS, a timeout, a lost connection) stops the partition: once none of
its batches is in flight, the ones not acknowledged are sent again in sequence order to the
leader new metadata names, after ``retry.backoff.ms``. A batch not acknowledged within
``delivery.timeout.ms`` (120 s), an error no retry mends (a record too large, an unknown
producer id, a sequence the broker refuses while nothing before it failed) fail the task, and
Spark retries it: at least once, as Spark's Kafka sink.

Only what this producer does is asked of it: :func:`usable` sends a sink whose ``kafka.``
options name anything else (TLS, SASL, transactions, settings this producer does not have)
through confluent-kafka instead.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import selectors
import socket
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kio.schema.errors import ErrorCode

from stonemq.protocol import produce_client as pcodec
from stonemq.protocol.arrow_records import encode_columns, header_sections, record_sizes
from stonemq.protocol.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    DEFAULT_LEVEL,
    HEADER_SIZE,
    batch_parts,
)
from stonemq.spark import options as so
from stonemq.spark import wire
from stonemq.spark.partitioner import partitions_for

CLIENT_ID = "stonemq-spark"
DEFAULT_BATCH_BYTES = (
    512 * 1024
)  # records a batch (Kafka's batch.size is 16 KiB, librdkafka's 1 MB)
REQUEST_BYTES = 8 * 1024 * 1024  # a request's batches, at most (one batch always goes)
BUFFER_BYTES = 32 * 1024 * 1024  # batches not yet acknowledged (Kafka's buffer.memory)
METADATA_MAX_AGE_S = 300.0  # a topic's partitions read again (Kafka's metadata.max.age.ms)
MAX_IN_FLIGHT = 5  # requests a connection, at most: what a broker dedups (Kafka's limit)
MIN_RUN_ROWS = 16  # rows a run of one partition holds on average, or the rows are sorted
_IOV_MAX = 1024  # buffers a sendmsg takes (Linux's IOV_MAX)

_CODECS = {
    "none": COMPRESSION_NONE,
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
}
# the settings this producer has (Kafka's names, and librdkafka's where they differ); a sink
# naming any other goes through confluent-kafka
_NATIVE = frozenset(
    {
        "acks",
        "request.required.acks",
        "enable.idempotence",
        "linger.ms",
        "batch.size",
        "compression.type",
        "compression.codec",
        "compression.level",
        "client.id",
        "request.timeout.ms",
        "delivery.timeout.ms",
        "message.timeout.ms",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
        "retry.backoff.ms",
        "buffer.memory",
        "security.protocol",
    }
)
# Produce errors retried after new metadata (Kafka's retriable errors of a produce)
_RETRIABLE = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
        ErrorCode.kafka_storage_error,
        ErrorCode.network_exception,
        ErrorCode.corrupt_message,  # Kafka's producer retries a batch the broker saw damaged
    }
)


class ProduceFailed(Exception):
    """Records that cannot be delivered (the task fails; Spark retries it)."""


def usable(sink: so.SinkOptions) -> bool:
    """True when every ``kafka.`` option of the sink is one this producer has and means
    plaintext (no TLS or SASL)."""
    conf = {k.lower(): v for k, v in sink.producer_config.items()}
    if any(k not in _NATIVE for k in conf):
        return False
    if str(conf.get("security.protocol", "plaintext")).lower() != "plaintext":
        return False
    codec = conf.get("compression.type", conf.get("compression.codec", "none")).lower()
    return codec in _CODECS


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap: list[tuple[str, int]]
    client_id: str = CLIENT_ID
    batch_bytes: int = DEFAULT_BATCH_BYTES
    codec: int = COMPRESSION_NONE
    level: int = DEFAULT_LEVEL
    request_timeout_s: float = 30.0
    delivery_timeout_s: float = 120.0
    in_flight: int = 5
    retry_backoff_s: float = 0.1
    buffer_bytes: int = BUFFER_BYTES

    @classmethod
    def of(cls, sink: so.SinkOptions) -> Settings:
        conf = {k.lower(): str(v) for k, v in sink.producer_config.items()}
        acks = conf.get("acks", conf.get("request.required.acks", "all")).lower()
        if acks not in ("all", "-1"):
            raise so.OptionError(
                f"the sink's producers are idempotent, which needs kafka.acks=all, not {acks}"
            )
        codec = conf.get("compression.type", conf.get("compression.codec", "none")).lower()
        in_flight = int(
            conf.get("max.in.flight.requests.per.connection", conf.get("max.in.flight", 5))
        )
        if not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise so.OptionError(  # the broker keeps the last 5 batches of a producer
                "an idempotent producer needs kafka.max.in.flight.requests.per.connection "
                f"between 1 and {MAX_IN_FLIGHT}, not {in_flight}"
            )
        servers = []
        for entry in sink.bootstrap.split(","):
            host, _, port = entry.strip().rpartition(":")
            servers.append((host.strip("[]") or "localhost", int(port)))
        timeout = conf.get("delivery.timeout.ms", conf.get("message.timeout.ms", "120000"))
        return cls(
            bootstrap=servers,
            client_id=conf.get("client.id", CLIENT_ID),
            batch_bytes=max(1, int(conf.get("batch.size", DEFAULT_BATCH_BYTES))),
            codec=_CODECS[codec],
            level=int(conf.get("compression.level", DEFAULT_LEVEL)),
            request_timeout_s=max(1, int(conf.get("request.timeout.ms", 30000))) / 1000,
            delivery_timeout_s=int(timeout) / 1000,
            in_flight=in_flight,
            retry_backoff_s=int(conf.get("retry.backoff.ms", 100)) / 1000,
            buffer_bytes=max(1, int(conf.get("buffer.memory", BUFFER_BYTES))),
        )


@dataclass(slots=True, eq=False)
class _Batch:
    topic: str
    partition: int
    sequence: int
    count: int
    pieces: tuple[bytes, bytes | bytearray | memoryview]  # header, records (not copied)
    size: int
    created: float
    acked: bool = False
    in_flight: bool = False


@dataclass(slots=True)
class _Partition:
    next_sequence: int = 0
    unacked: deque[_Batch] = field(default_factory=deque)  # in sequence order
    in_flight: int = 0
    node: int = -1  # the broker its batches in flight were sent to
    stalled: bool = False  # a batch failed: wait for the rest in flight, then resend
    ready_at: float = 0.0
    last_error: str = ""


class _Connection:
    """A blocking socket to one broker with requests pipelined on it."""

    def __init__(self, node: int, address: tuple[str, int], timeout_s: float) -> None:
        self.node = node
        self.sock = wire.connect(address, timeout_s)
        self.ids = itertools.count(1)
        self.requests: deque[tuple[int, list[_Batch], float]] = deque()

    def read_frame(self) -> bytearray:
        return wire.read_frame(self.sock)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _send_pieces(sock: socket.socket, pieces: list[bytes | bytearray | memoryview]) -> None:
    """Write ``pieces`` back to back (``sendmsg``, at most :data:`_IOV_MAX` a call)."""
    views = [memoryview(p).cast("B") for p in pieces if len(p)]
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first : first + _IOV_MAX])
        while sent:
            size = views[first].nbytes
            if sent >= size:
                sent -= size
                first += 1
            else:
                views[first] = views[first][sent:]
                sent = 0


def _increment(sequence: int, count: int) -> int:
    """Kafka's sequence after ``count`` records: int32, wrapping to 0."""
    if sequence > 0x7FFFFFFF - count:
        return count - (0x7FFFFFFF - sequence) - 1
    return sequence + count


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"


class ArrowProducer:
    """One producer id; batches built from Arrow columns; see the module."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.brokers: dict[int, tuple[str, int]] = {}  # from the last metadata answer
        self.answered: tuple[str, int] | None = None  # the last broker a control request reached
        self.leaders: dict[tuple[str, int], int] = {}
        self.partition_counts: dict[str, int] = {}
        self.partitions: dict[tuple[str, int], _Partition] = {}
        self.connections: dict[int, _Connection] = {}
        self.sticky: dict[str, Any] = {}  # each topic's sticky position (null keys)
        self.buffered = 0
        self.failed_sends = 0  # batches that failed and went again (retries)
        self.stale_metadata: set[str] = set()  # topics whose leaders are asked again
        self.metadata_at = 0.0  # no Metadata before this (monotonic): retry.backoff.ms apart
        self.selector = selectors.DefaultSelector()
        self.batch_limits: dict[str, int] = {}  # below batch.size for a topic that needs it
        self.topic_checked: dict[str, float] = {}  # when each topic's metadata was read
        self.producer_id, self.epoch = self._init_producer_id()

    # -- control requests (metadata, producer id): one request, one answer -----------------
    def _control(self, frame_of: Any, decode: Any, once: bool = False) -> Any:
        """Send a control request to the brokers known (then the bootstrap servers) until
        one answers; ProduceFailed after ``delivery.timeout.ms`` without an answer, or
        after one round of the brokers when ``once``."""
        deadline = time.monotonic() + self.settings.delivery_timeout_s
        backoff = self.settings.retry_backoff_s
        problem = "no broker tried"
        while True:
            candidates = [self.answered] if self.answered else []
            candidates += [*self.brokers.values(), *self.settings.bootstrap]
            for address in dict.fromkeys(candidates):  # the last broker that answered first
                try:
                    conn = _Connection(-1, address, self.settings.request_timeout_s)
                except OSError as exc:
                    problem = f"{address[0]}:{address[1]}: {exc}"
                    continue
                try:
                    cid = next(conn.ids)
                    conn.sock.sendall(frame_of(cid))
                    frame = conn.read_frame()
                    got_cid, *answer = decode(frame)
                    if got_cid != cid:
                        raise OSError(f"correlation id {got_cid}, expected {cid}")
                    self.answered = address
                    return answer
                except (OSError, pcodec.MalformedResponse) as exc:
                    problem = f"{address[0]}:{address[1]}: {exc}"
                finally:
                    conn.close()
            if once:
                raise ProduceFailed(f"no broker answered: {problem}")
            if time.monotonic() + backoff > deadline:
                raise ProduceFailed(
                    f"no broker of {self._servers()} answered within "
                    f"{self.settings.delivery_timeout_s * 1000:.0f} ms (delivery.timeout.ms): "
                    f"{problem}"
                )
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _servers(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.settings.bootstrap)

    def _init_producer_id(self) -> tuple[int, int]:
        deadline = time.monotonic() + self.settings.delivery_timeout_s
        while True:
            error, pid, epoch = self._control(
                lambda cid: pcodec.encode_init_producer_id(cid, self.settings.client_id),
                pcodec.decode_init_producer_id,
            )
            if error == ErrorCode.none:
                return pid, epoch
            if time.monotonic() > deadline:
                raise ProduceFailed(f"InitProducerId answers {_code_name(error)}")
            time.sleep(self.settings.retry_backoff_s)

    def _refresh(self, topics: list[str], once: bool = False) -> None:
        """New leaders for ``topics`` (raises ProduceFailed when no broker answers: at once
        with ``once``, else after ``delivery.timeout.ms``)."""
        (layout,) = self._control(
            lambda cid: pcodec.encode_metadata(cid, self.settings.client_id, topics),
            pcodec.decode_metadata,
            once,
        )
        if layout.brokers:  # the live ones: a broker gone from the cluster is not tried
            self.brokers = dict(layout.brokers)
        for name, topic in layout.topics.items():
            if topic.error_code != ErrorCode.none or not topic.partitions:
                continue
            self.partition_counts[name] = len(topic.partitions)
            for index, (_, leader) in topic.partitions.items():
                if leader >= 0:
                    self.leaders[(name, index)] = leader
                else:
                    self.leaders.pop((name, index), None)
            self.stale_metadata.discard(name)

    def _partition_count(self, topic: str) -> int:
        """The topic's partitions, from metadata (auto-creating it where the broker does)
        at most ``METADATA_MAX_AGE_S`` old; ProduceFailed when it is not there within
        ``delivery.timeout.ms``. Learns the topic's batch limit with it."""
        known = self.topic_checked.get(topic)
        if known is not None and time.monotonic() - known > METADATA_MAX_AGE_S:
            with contextlib.suppress(ProduceFailed):  # partitions added since: new counts
                self._refresh([topic], once=True)
                self._learn_batch_limit(topic)
            self.topic_checked[topic] = time.monotonic()
        deadline = time.monotonic() + self.settings.delivery_timeout_s
        while topic not in self.partition_counts:
            self._refresh([topic])
            if topic in self.partition_counts:
                break
            if time.monotonic() > deadline:
                raise ProduceFailed(
                    f"topic {topic} not present in metadata after "
                    f"{self.settings.delivery_timeout_s * 1000:.0f} ms (UNKNOWN_TOPIC_OR_PARTITION)"
                )
            time.sleep(self.settings.retry_backoff_s)
        if known is None:
            self._learn_batch_limit(topic)
            self.topic_checked[topic] = time.monotonic()
        return self.partition_counts[topic]

    def _learn_batch_limit(self, topic: str) -> None:
        """Records a batch of ``topic`` may hold: ``batch.size``, or less when the topic's
        ``max.message.bytes`` (the largest batch it takes) is smaller. Unknown (the broker
        does not answer DescribeConfigs): ``batch.size``."""
        try:
            error, configs = self._control(
                lambda cid: pcodec.encode_describe_topic_configs(
                    cid, self.settings.client_id, topic, ["max.message.bytes"]
                ),
                pcodec.decode_describe_configs,
                once=True,
            )
        except ProduceFailed:
            return
        value = configs.get("max.message.bytes")
        if error != ErrorCode.none or value is None or not value.isdigit():
            return
        limit = max(1, min(self.settings.batch_bytes, int(value) - HEADER_SIZE))
        if self.batch_limits.get(topic, self.settings.batch_bytes) != limit:
            position = self.sticky.pop(topic, None)  # runs restart at the new size
            if position is not None:
                self.sticky[topic] = getattr(position, "partition", position)
        self.batch_limits[topic] = limit

    # -- building batches -----------------------------------------------------------------
    def add(
        self,
        topic: str,
        keys: pa.Array | None,
        values: pa.Array,
        headers: pa.Array | None,
        explicit: pa.Array | None,
    ) -> int:
        """Queue the rows (one topic's) as batches; returns the rows queued."""
        n = len(values)
        if n == 0:
            return 0
        count = self._partition_count(topic)
        # the header sections are written once, for the sizes and for the records
        sections = header_sections(headers, n)[0] if headers is not None else None
        sizes = record_sizes(keys, values, None, sections)
        limit = self.batch_limits.get(topic, self.settings.batch_bytes)
        # a run of null-keyed rows ends at the row that takes it to 15/16 of a batch, so a
        # run of records up to a 16th of it fills one batch, not two
        sticky_bytes = max(1, limit * 15 // 16)
        first = self.sticky.get(topic)
        if first is None:  # the first run starts at a random partition, as with Kafka's
            first = random.randrange(count)  # producer (every producer starting at 0 put
            # the null-keyed rows of small writes all in partition 0)
        chosen, self.sticky[topic] = partitions_for(
            keys, explicit, count, sizes, sticky_bytes, first
        )
        chosen = np.asarray(chosen, dtype=np.int64)
        bad = (chosen < 0) | (chosen >= count)
        if bad.any():
            p = int(chosen[np.flatnonzero(bad)[0]])
            raise ProduceFailed(
                f"partition {p} of topic {topic} with {count} partitions is not in the range "
                f"[0...{count - 1}]"
            )
        runs = int(np.count_nonzero(np.diff(chosen))) + 1
        if runs > n // MIN_RUN_ROWS:  # rows of a partition scattered: gather them (a copy)
            order = np.argsort(chosen, kind="stable")
            take = pa.array(order)
            keys = keys.take(take) if keys is not None else None
            values = values.take(take)
            sections = sections.take(take) if sections is not None else None
            chosen, sizes = chosen[order], sizes[order]
        cuts = [0, *(np.flatnonzero(np.diff(chosen)) + 1).tolist(), n]
        bounds: list[tuple[int, int, int]] = []  # (partition, first row, end row)
        deltas = np.empty(n, dtype=np.int64)
        for first, end in itertools.pairwise(cuts):
            cum = np.cumsum(sizes[first:end])
            i = first
            while i < end:
                base = int(cum[i - first - 1]) if i > first else 0
                j = first + int(np.searchsorted(cum, base + limit, side="right"))
                j = max(j, i + 1)
                bounds.append((int(chosen[first]), i, j))
                deltas[i:j] = np.arange(j - i)
                i = j
        encoded = encode_columns(keys, values, None, deltas, sections)
        now_ms = int(time.time() * 1000)
        now = time.monotonic()
        for partition, i, j in bounds:
            state = self.partitions.get((topic, partition))
            if state is None:
                state = self.partitions[(topic, partition)] = _Partition()
            head, body = batch_parts(
                encoded.section(i, j),
                j - i,
                base_timestamp=now_ms,
                max_timestamp=now_ms,
                producer_id=self.producer_id,
                producer_epoch=self.epoch,
                base_sequence=state.next_sequence,
                codec=self.settings.codec,
                level=self.settings.level,
            )
            size = len(head) + len(body)
            batch = _Batch(topic, partition, state.next_sequence, j - i, (head, body), size, now)
            state.unacked.append(batch)
            state.next_sequence = _increment(state.next_sequence, j - i)
            self.buffered += size
        return n

    # -- sending and answers ----------------------------------------------------------------
    def pump(self, wait_s: float) -> None:
        """Send what can go, then read the answers that come within ``wait_s``."""
        self._send_ready()
        if not any(c.requests for c in self.connections.values()):
            waiting = [
                s.ready_at for s in self.partitions.values() if s.unacked and not s.in_flight
            ]
            if waiting and wait_s > 0:
                time.sleep(max(0.0, min(min(waiting) - time.monotonic(), wait_s)))
            self._check_delivery()
            return
        for key, _ in self.selector.select(wait_s):
            conn = key.data
            try:
                frame = conn.read_frame()
            except OSError as exc:
                self._drop(conn, f"connection to broker {conn.node}: {exc}")
                continue
            self._answer(conn, frame)
        now = time.monotonic()
        for conn in list(self.connections.values()):
            if conn.requests and now - conn.requests[0][2] > self.settings.request_timeout_s:
                self._drop(conn, f"no answer from broker {conn.node} within request.timeout.ms")
        self._check_delivery()

    def _check_delivery(self) -> None:
        now = time.monotonic()
        for (topic, partition), state in self.partitions.items():
            if state.unacked and now - state.unacked[0].created > self.settings.delivery_timeout_s:
                raise ProduceFailed(
                    f"{topic}-{partition}: {len(state.unacked)} batches not delivered within "
                    f"{self.settings.delivery_timeout_s * 1000:.0f} ms (delivery.timeout.ms)"
                    + (f"; last error {state.last_error}" if state.last_error else "")
                )

    def _send_ready(self) -> None:
        now = time.monotonic()
        stale = sorted(
            {t for (t, p), s in self.partitions.items() if s.unacked and (t, p) not in self.leaders}
            | self.stale_metadata
        )
        if stale and now >= self.metadata_at:
            self.metadata_at = now + self.settings.retry_backoff_s
            problem = None
            try:  # one round: the answers in flight and delivery.timeout.ms keep running
                self._refresh(stale, once=True)
            except ProduceFailed as exc:
                problem = str(exc)
            for key, state in self.partitions.items():
                if state.unacked and key not in self.leaders:  # no leader yet: back off
                    state.ready_at = self.metadata_at
                    state.last_error = problem or f"{key[0]}-{key[1]} has no leader"
        by_node: dict[int, list[_Batch]] = {}
        for key, state in self.partitions.items():
            if state.stalled or state.ready_at > now or state.in_flight >= self.settings.in_flight:
                continue
            node = self.leaders.get(key)
            if node is None or node not in self.brokers:  # asked again, after the back-off
                self.stale_metadata.add(key[0])
                state.ready_at = now + self.settings.retry_backoff_s
                continue
            if state.in_flight and state.node != node:
                continue  # the leader moved: the batches on the old one are answered first
            sent = 0
            for batch in state.unacked:
                if batch.in_flight or batch.acked:
                    continue
                by_node.setdefault(node, []).append(batch)
                sent += 1
                if state.in_flight + sent >= self.settings.in_flight:
                    break
        for node, batches in by_node.items():
            self._send(node, batches)

    def _connection(self, node: int) -> _Connection | None:
        conn = self.connections.get(node)
        if conn is None:
            try:
                conn = _Connection(node, self.brokers[node], self.settings.request_timeout_s)
            except OSError as exc:
                for key, state in self.partitions.items():
                    if self.leaders.get(key) == node:
                        state.ready_at = time.monotonic() + self.settings.retry_backoff_s
                        state.last_error = f"connecting to broker {node}: {exc}"
                        self.stale_metadata.add(key[0])
                return None
            self.connections[node] = conn
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)
        return conn

    def _send(self, node: int, batches: list[_Batch]) -> None:
        """Requests of one batch a partition each (a partition's next batches go in the
        following requests, in sequence order), at most ``in_flight`` on the connection."""
        conn = self._connection(node)
        if conn is None:
            return
        waves: list[list[_Batch]] = []
        seen: dict[tuple[str, int], int] = {}
        for batch in batches:  # batches of one partition are in sequence order
            k = seen.get((batch.topic, batch.partition), 0)
            seen[(batch.topic, batch.partition)] = k + 1
            while len(waves) <= k:
                waves.append([])
            waves[k].append(batch)
        for wave in waves:
            start = 0
            while start < len(wave) and len(conn.requests) < self.settings.in_flight:
                size, end = 0, start
                while end < len(wave) and (end == start or size + wave[end].size <= REQUEST_BYTES):
                    size += wave[end].size
                    end += 1
                request = wave[start:end]
                cid = next(conn.ids)
                frame = pcodec.encode_produce(
                    cid,
                    self.settings.client_id,
                    -1,
                    int(self.settings.request_timeout_s * 1000),
                    {(b.topic, b.partition): b.pieces for b in request},
                )
                try:
                    _send_pieces(conn.sock, frame)
                except OSError as exc:
                    self._drop(conn, f"sending to broker {node}: {exc}")
                    return
                for b in request:
                    b.in_flight = True
                    state = self.partitions[(b.topic, b.partition)]
                    state.in_flight += 1
                    state.node = node
                conn.requests.append((cid, request, time.monotonic()))
                start = end
            if start < len(wave):
                return  # the connection is full: the rest waits for answers

    def _answer(self, conn: _Connection, frame: bytearray) -> None:
        if not conn.requests:
            self._drop(conn, f"an answer from broker {conn.node} to nothing asked")
            return
        cid, request, _ = conn.requests[0]
        try:
            got_cid, answers = pcodec.decode_produce(frame)
        except pcodec.MalformedResponse as exc:
            self._drop(conn, f"broker {conn.node}: {exc}")
            return
        if got_cid != cid:
            self._drop(conn, f"broker {conn.node}: correlation id {got_cid}, expected {cid}")
            return
        conn.requests.popleft()
        by_key = {(a.topic, a.partition): a for a in answers}
        for batch in request:
            answer = by_key.get((batch.topic, batch.partition))
            if answer is None:
                self._failed(batch, f"broker {conn.node} did not answer for the partition")
                continue
            self._settle(batch, answer)

    def _settle(self, batch: _Batch, answer: pcodec.Produced) -> None:
        key = (batch.topic, batch.partition)
        state = self.partitions[key]
        code = answer.error_code
        if code in (ErrorCode.none, ErrorCode.duplicate_sequence_number):
            batch.in_flight = False
            batch.acked = True
            state.in_flight -= 1
            while state.unacked and state.unacked[0].acked:
                self.buffered -= state.unacked.popleft().size
            if not state.in_flight and state.stalled:
                self._resume(state)
            return
        why = _code_name(code) + (f" ({answer.error_message})" if answer.error_message else "")
        if code in _RETRIABLE or (
            code == ErrorCode.out_of_order_sequence_number and self._earlier_unacked(state, batch)
        ):
            if code in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition):
                self.leaders.pop(key, None)
            self.stale_metadata.add(batch.topic)
            self._failed(batch, why)
            return
        if code == ErrorCode.message_too_large and batch.count > 1:
            why += " (kafka.batch.size is above the topic's max.message.bytes)"
        raise ProduceFailed(f"{batch.topic}-{batch.partition}: the broker answers {why}")

    @staticmethod
    def _earlier_unacked(state: _Partition, batch: _Batch) -> bool:
        """Whether a batch before ``batch`` is not acknowledged (failed and to be sent again,
        or still in flight): the broker then refuses the ones after it as out of order, and
        they go again after it. Out of order with everything before acknowledged is fatal:
        the broker lost this producer's sequence."""
        return state.unacked[0] is not batch

    def _failed(self, batch: _Batch, why: str) -> None:
        state = self.partitions[(batch.topic, batch.partition)]
        self.failed_sends += 1
        batch.in_flight = False
        state.in_flight -= 1
        state.stalled = True
        state.last_error = why
        if not state.in_flight:
            self._resume(state)

    def _resume(self, state: _Partition) -> None:
        """Nothing of the partition is in flight: its unacknowledged batches go again, in
        sequence order, after the back-off."""
        state.stalled = False
        state.ready_at = time.monotonic() + self.settings.retry_backoff_s

    def _drop(self, conn: _Connection, why: str) -> None:
        """A connection that failed: what was in flight on it is failed (the broker may have
        appended it; the retry's sequence numbers make that a duplicate)."""
        self.connections.pop(conn.node, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn.sock)
        conn.close()
        requests, conn.requests = conn.requests, deque()
        for _, request, _ in requests:
            for batch in request:
                self.stale_metadata.add(batch.topic)
                self._failed(batch, why)

    # -- the task's API -------------------------------------------------------------------
    def write(self, sink: so.SinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
        """Queue and send every row of ``batches``, then wait until all are acknowledged."""
        rows = 0
        for rb in batches:
            rows += self._add_batch(sink, rb)
            self.pump(0)
            while self.buffered > self.settings.buffer_bytes:
                self.pump(0.05)
        self.flush()
        return rows

    def flush(self) -> None:
        while any(s.unacked for s in self.partitions.values()):
            self.pump(0.05)

    def _add_batch(self, sink: so.SinkOptions, rb: pa.RecordBatch) -> int:
        cols = {name.lower(): rb.column(i) for i, name in enumerate(rb.schema.names)}
        values = cols["value"]
        keys = cols.get("key")
        headers = cols.get("headers")
        explicit = cols.get("partition")
        if keys is not None and pa.types.is_null(keys.type):
            keys = None  # a column of nulls only (Spark's NullType)
        if headers is not None and pa.types.is_null(headers.type):
            headers = None
        if pa.types.is_null(values.type):
            values = pa.nulls(len(values), pa.binary())
        if explicit is not None and explicit.type != pa.int32():
            try:  # Spark's sink takes an int column; anything else must fit one exactly
                explicit = explicit.cast(pa.int32())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise so.OptionError(f"partition attribute must be an int: {exc}") from None
        if sink.topic:
            return self.add(sink.topic, keys, values, headers, explicit)
        topics = cols.get("topic")
        if topics is None or topics.null_count:
            raise so.OptionError(
                "topic option required when no 'topic' attribute is present, and a "
                "row's topic must not be null"
            )
        rows = 0
        for topic in pc.unique(topics).to_pylist():
            mask = pc.equal(topics, topic)
            rows += self.add(
                topic,
                keys.filter(mask) if keys is not None else None,
                values.filter(mask),
                headers.filter(mask) if headers is not None else None,
                explicit.filter(mask) if explicit is not None else None,
            )
        return rows

    def close(self) -> None:
        for conn in list(self.connections.values()):
            conn.close()
        self.connections.clear()
        self.selector.close()
