"""The Kafka half of a range read without a Python object per record: Fetch over a socket of
the executor's own, the fetched batches decoded into Arrow columns by the archive's decoder.

A range ``[start, end)`` of one topic partition is read from its leader with Kafka's Fetch
(:mod:`stonemq.protocol.fetch_client`: v11, a consumer's replica id, read uncommitted) and
each answer's records go through :func:`stonemq.tiering.rows.decode_segment`, the record
codec's validator and the archive's vectorized decoder (no Python object or slice per
record; keys and values gathered by Arrow). librdkafka hands Python one ``Message`` per
record, and building the rows from those was most of a Spark worker's CPU in a read
(docs/benchmarks/analysis.md, "Spark data source"). While one answer is decoded the next
fetch is already on its way.

It reads what a read_uncommitted consumer reads: data records of every batch in offset
order (control records left out), aborted transactions included. A read that needs what
librdkafka adds (read_committed's aborted-transaction filter, TLS, SASL) is not done here:
:func:`usable` says so and the caller reads with confluent-kafka instead.

Errors: offsets below the log start or a partition that is gone are data loss
(``failOnDataLoss``); a leader that moved, a connection that failed or a fetch that answers
nothing are retried (new metadata, a new connection) until ``kafkaConsumer.pollTimeoutMs``
passes without progress. A log whose high watermark stays below the range's end for that
long is data loss too (truncated by an unclean election or a crash), not before: a new
leader's high watermark can trail the old one's for a moment after a failover. Any other
error code or a batch the validator refuses fails the task.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from kio.schema.errors import ErrorCode

from stonemq.protocol.fetch_client import (
    CONSUMER_REPLICA_ID,
    Fetched,
    FetchWant,
    MalformedFetch,
    decode_fetch,
    encode_fetch,
)
from stonemq.protocol.record_batch import HEADER_SIZE, RecordBatchError, parse_header
from stonemq.spark import wire
from stonemq.spark.kafka_io import RANGE_FETCH_BYTES, pooled_consumer
from stonemq.spark.options import OffsetRange, SourceOptions
from stonemq.spark.pool import ClientPool, close_quietly

CLIENT_ID = "stonemq-spark"
FETCH_WAIT_MS = 100  # fetch.wait.max.ms unless the options set it (as range_reader_config)
RETRY_BACKOFF_S = 0.1  # after a moved leader or a failed connection (Kafka's retry.backoff.ms)
RETRY_BACKOFF_MAX_S = 1.0
MAX_FETCH_BYTES = 1 << 30  # a batch larger than a partition's fetch size is fetched whole
# the errors a fetch is retried after, with the leader looked up again (Kafka's retriable
# errors of a Fetch partition)
_RETRIABLE = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.replica_not_available,
        ErrorCode.fenced_leader_epoch,
        ErrorCode.unknown_leader_epoch,
        ErrorCode.kafka_storage_error,
        ErrorCode.request_timed_out,
    }
)
_GONE = frozenset({ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id})


class FetchFailed(Exception):
    """This connection or leader cannot serve the fetch now (retried)."""


class ReadFailed(Exception):
    """The range cannot be read (an error code no retry mends, a refused batch, no
    progress within the poll timeout)."""


class DataGone(Exception):
    """The range's offsets are not in the log (the caller decides: data loss).
    ``log_start``: the partition's log start when the broker named it (an offset below it
    was asked), else None."""

    def __init__(self, why: str, log_start: int | None = None) -> None:
        super().__init__(why)
        self.log_start = log_start


def usable(opts: SourceOptions) -> bool:
    """True when a range can be read here: nothing librdkafka would add is asked for
    (read_committed, TLS, SASL)."""
    conf = opts.consumer_config
    if opts.read_committed:
        return False
    protocol = str(conf.get("security.protocol", "plaintext")).lower()
    return protocol == "plaintext" and not any(k.startswith(("sasl.", "ssl.")) for k in conf)


class Connection:
    """A blocking connection to one broker: one Fetch may be in flight."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = wire.connect((host, port), timeout_s)
        self.ids = itertools.count(1)
        self.in_flight: int | None = None  # the correlation id of the fetch sent

    def send(self, frame: bytes, correlation_id: int) -> None:
        self.sock.sendall(frame)
        self.in_flight = correlation_id

    def receive(self) -> Fetched:
        """The answer to the fetch in flight (its one partition)."""
        try:
            frame = wire.read_frame(self.sock)
        except OSError as exc:
            raise FetchFailed(str(exc)) from exc
        try:
            cid, error, parts = decode_fetch(frame)
        except MalformedFetch as exc:
            raise FetchFailed(str(exc)) from exc
        if cid != self.in_flight:
            raise FetchFailed(f"correlation id {cid}, expected {self.in_flight}")
        self.in_flight = None
        if error != ErrorCode.none or len(parts) != 1:
            raise FetchFailed(f"the Fetch answers {_name(error)} with {len(parts)} partitions")
        return parts[0]

    def close(self) -> None:
        self.sock.close()


CONNECTIONS = ClientPool(close_quietly)  # idle connections by (host, port), between tasks
_leaders: dict[tuple[str, str, int], tuple[str, int]] = {}
_leaders_lock = threading.Lock()


def read_fetch(opts: SourceOptions, r: OffsetRange) -> Iterator[pa.Table]:
    """Tables (the archive's row format, :data:`stonemq.tiering.rows.ARROW_SCHEMA`) of the
    data records with offsets in ``[r.start, r.end)``, in offset order. Raises DataGone
    when the log does not hold them (below its start, ended before ``r.end``, partition
    gone) and ReadFailed when it cannot be read."""
    from stonemq.tiering.rows import decode_segment

    conf = opts.consumer_config
    max_bytes = int(conf.get("max.partition.fetch.bytes", RANGE_FETCH_BYTES))
    wait_ms = int(conf.get("fetch.wait.max.ms", FETCH_WAIT_MS))
    timeout_s = opts.timeout_ms / 1000 + wait_ms / 1000
    offset = r.start
    conn: Connection | None = None
    address: tuple[str, int] | None = None
    backoff = RETRY_BACKOFF_S
    deadline = time.monotonic() + opts.poll_timeout_ms / 1000
    last_problem = "nothing fetched yet"
    log_end: int | None = None  # the high watermark last seen, when below the range's end
    try:
        while offset < r.end:
            if time.monotonic() > deadline:
                if log_end is not None:
                    raise DataGone(f"the log now ends at {log_end}, before offset {r.end}")
                raise ReadFailed(
                    f"no records of {r.topic}-{r.partition} from offset {offset} within "
                    f"{opts.poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs): {last_problem}"
                )
            try:
                if conn is None:  # neither waits past the deadline
                    left = min(timeout_s, max(deadline - time.monotonic(), 0.1))
                    address = _leader(opts, r, left)
                    conn = CONNECTIONS.take(address) or Connection(*address, left)
                    conn.sock.settimeout(timeout_s)
                if conn.in_flight is None:
                    _send(conn, r, offset, max_bytes, wait_ms)
                part = conn.receive()
                code = part.error_code
                if code in _RETRIABLE:
                    raise FetchFailed(f"the leader answers {_name(code)}")
                if code == ErrorCode.offset_out_of_range:
                    raise DataGone(
                        f"offset out of range (log start {part.log_start_offset})",
                        part.log_start_offset if part.log_start_offset >= 0 else None,
                    )
                if code in _GONE:
                    raise DataGone(f"the topic partition is gone ({_name(code)})")
                if code != ErrorCode.none:
                    raise ReadFailed(f"reading {r.topic}-{r.partition} at {offset}: {_name(code)}")
                records = part.records
                following = _whole_end(records, offset)
                if following is None:
                    if len(records) >= max_bytes and max_bytes < MAX_FETCH_BYTES:
                        max_bytes *= 2  # a batch larger than asked and cut: ask for it whole
                        continue
                    # a log that ends before the range: truncated (data loss), or a new
                    # leader whose high watermark has not caught up yet; only the poll
                    # timeout tells them apart
                    short = part.high_watermark <= offset and part.high_watermark < r.end
                    log_end = part.high_watermark if short else None
                    last_problem = f"empty at {offset}, high watermark {part.high_watermark}"
                    continue
                if following < r.end:
                    _send(conn, r, following, max_bytes, wait_ms)  # decoded while it comes
                table = decode_segment(
                    records, r.topic, r.partition, offset, r.end - 1, on_refused=_refused(r)
                )
                offset = following
                deadline = time.monotonic() + opts.poll_timeout_ms / 1000
                log_end = None
                backoff = RETRY_BACKOFF_S
                if table.num_rows:
                    yield table
            except (FetchFailed, OSError) as exc:
                last_problem = str(exc)
                if conn is not None:
                    conn.close()
                    conn = None
                _forget_leader(opts, r)
                time.sleep(backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
        if conn is not None and conn.in_flight is None and address is not None:
            CONNECTIONS.give(address, conn)
            conn = None
    finally:
        if conn is not None:
            conn.close()


def _send(conn: Connection, r: OffsetRange, offset: int, max_bytes: int, wait_ms: int) -> None:
    cid = next(conn.ids)
    want = FetchWant(r.topic, r.partition, offset, max_bytes)
    frame = encode_fetch(CONSUMER_REPLICA_ID, -1, [want], max_bytes, cid, CLIENT_ID, wait_ms, 1)
    conn.send(frame, cid)


def _whole_end(records: bytes, offset: int) -> int | None:
    """The offset after the last whole batch of ``records`` (a fetch answer may end in a cut
    one), or None when no whole batch ends past ``offset``."""
    pos, size = 0, len(records)
    following = None
    while size - pos >= HEADER_SIZE:
        try:
            header = parse_header(records, pos)
        except RecordBatchError:
            break  # decode_segment refuses it and says why
        if pos + header.size > size:
            break
        pos += header.size
        following = header.next_offset
    if following is None or following <= offset:
        return None
    return following


def _refused(r: OffsetRange) -> Any:
    def refuse(position: int, exc: RecordBatchError) -> None:
        raise ReadFailed(
            f"{r.topic}-{r.partition}: the fetched batch at byte {position} is refused by the "
            f"record validator: {exc}"
        )

    return refuse


def _leader(opts: SourceOptions, r: OffsetRange, timeout_s: float) -> tuple[str, int]:
    """The (host, port) of the partition's leader, from metadata (kept until a fetch to it
    fails)."""
    key = (opts.bootstrap, r.topic, r.partition)
    with _leaders_lock:
        known = _leaders.get(key)
    if known is not None:
        return known
    with pooled_consumer(opts) as consumer:
        try:
            md = consumer.list_topics(topic=r.topic, timeout=timeout_s)
        except Exception as exc:  # KafkaException: the broker is not reachable
            raise FetchFailed(f"metadata of {r.topic}: {exc}") from exc
    topic = md.topics.get(r.topic)
    if topic is None or topic.error is not None or r.partition not in topic.partitions:
        why = topic.error if topic is not None else "no such topic"
        raise DataGone(f"the topic partition is gone ({why})")
    leader = topic.partitions[r.partition].leader
    broker = md.brokers.get(leader)
    if broker is None:
        raise FetchFailed(f"{r.topic}-{r.partition} has no leader now ({leader})")
    address = (str(broker.host), int(broker.port))
    with _leaders_lock:
        _leaders[key] = address
    return address


def _forget_leader(opts: SourceOptions, r: OffsetRange) -> None:
    with _leaders_lock, contextlib.suppress(KeyError):
        del _leaders[(opts.bootstrap, r.topic, r.partition)]


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"
