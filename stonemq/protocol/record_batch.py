"""RecordBatch v2 (magic 2): the one record codec and batch validator every path uses.

The 61-byte header (:data:`BATCH_HEADER`), its CRC-32C, the base-offset and timestamp patches;
Kafka's zigzag varints (:func:`read_varint`, :func:`write_varint`); bounded decompression
(:func:`decompress`: nothing past ``batch.max.uncompressed.bytes`` is ever produced); the
record walk (:func:`scan_records`: the C extension ``_recordscan``, or its Python twin);
the validator, Kafka's LogValidator rules with its error codes: of produced batches
(:func:`check_batch`, cheap, and :func:`check_records`, which walks every record and may
decompress) and of stored batches read back (:func:`read_batch`: the same framing, CRC, count
and record rules, without the produce-only ones); record decoding (:func:`iter_records`,
:func:`iter_record_fields`) for the paths that need records (ListOffsets by timestamp, the
group log, tools, the tiering decoder's record-by-record path; its vectorized path reads the
fields of records :func:`read_batch` validated, at the bounds the walk returns), and the one
batch builder (:func:`encode_batch`, :func:`encode_records`: the group log, cold reads;
:func:`wrap_records` and :func:`batch_parts` around the records
:mod:`stonemq.protocol.arrow_records` wrote).

Every reader refuses a bad batch the same way: :class:`CorruptRecordError` for a batch that
is torn or fails its CRC (or does not decompress), :class:`InvalidRecordError` for one whose
record count or records break the rules, :class:`UnsupportedMagicError` for magic 0 and 1.

On the produce path a batch stays opaque bytes: the validator walks its records in C without
copying them or making an object per record, and the batch is written as received.

Layout (big-endian)::

    0  base_offset i64      8  batch_length i32      12 partition_leader_epoch i32
    16 magic i8             17 crc u32               21 attributes i16
    23 last_offset_delta i32                         27 base_timestamp i64
    35 max_timestamp i64    43 producer_id i64       51 producer_epoch i16
    53 base_sequence i32    57 record_count i32      61 records...

The CRC covers bytes 21..end. Magic sits at byte 16 in every message format, so older formats
(magic 0 and 1) are recognised and refused.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from stonemq.protocol.checksum import crc32c

# The codecs' libraries (cramjam, lz4, zstandard: about 2 MB of a broker's PSS, their shared
# objects mapped by it alone) are imported by the first batch that needs one: a broker whose
# producers do not compress never loads them (tests/integration/test_process_size.py).

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes not counted by batch_length
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
CRC_START = 21

BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
"""The 61-byte RecordBatch v2 header: the one struct every reader and writer uses."""
_HEADER = BATCH_HEADER
NO_TIMESTAMP = -1
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

_ATTR_COMPRESSION = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20


class RecordBatchError(Exception):
    """A batch that cannot be accepted; subclasses name the Kafka error."""


class CorruptRecordError(RecordBatchError):
    """CRC mismatch, or a length that does not fit the bytes: CORRUPT_MESSAGE."""


class InvalidRecordError(RecordBatchError):
    """A well-formed batch that breaks a rule (e.g. count vs. last offset delta): INVALID_RECORD."""


class TransactionalBatchError(RecordBatchError):
    """A transactional batch produced without a transaction (none is offered): Kafka answers
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED to one sent without a transactional id."""


class UnsupportedMagicError(RecordBatchError):
    """Magic 0 or 1 (or unknown): UNSUPPORTED_FOR_MESSAGE_FORMAT."""


class BatchHeader(NamedTuple):
    """The header's fields, in order. A named tuple, not a frozen dataclass: one is made
    per batch on the produce and split paths, and a frozen dataclass sets its 13 fields
    one ``object.__setattr__`` at a time (7% of the broker's samples at 10,000 partitions
    of one-record batches)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & _ATTR_COMPRESSION

    @property
    def timestamp_type(self) -> int:
        return TIMESTAMP_LOG_APPEND_TIME if self.attributes & _ATTR_TIMESTAMP_TYPE else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _ATTR_CONTROL)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


_make_header = BatchHeader._make


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header of the batch starting at ``pos``; no CRC check, no bounds beyond it."""
    if len(buf) - pos < 17:
        raise CorruptRecordError(f"batch header truncated: {len(buf) - pos} bytes")
    magic = buf[pos + 16]
    if magic != 2:
        raise UnsupportedMagicError(f"record batch magic {magic} (only magic 2 is accepted)")
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(f"batch header truncated: {len(buf) - pos} bytes")
    header = _make_header(_HEADER.unpack_from(buf, pos))
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(f"batch length {header.batch_length} below the header size")
    return header


def crc_ok(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether the stored CRC-32C matches bytes ``CRC_START..end`` of the batch."""
    end = pos + header.size
    if end > len(buf):
        return False
    return crc32c(memoryview(buf)[pos + CRC_START : end]) == header.crc


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Patch the base offset in place (outside the CRC, so the CRC stays valid)."""
    _I64.pack_into(buf, pos, base_offset)


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Mark the batch LogAppendTime with ``timestamp_ms`` as its max timestamp; re-CRC it.

    Kafka's rule for LogAppendTime: the timestamp-type bit is set and max_timestamp holds the
    broker's time; the records keep their deltas, which clients ignore for this type.
    """
    (attributes,) = _I16.unpack_from(buf, pos + 21)
    _I16.pack_into(buf, pos + 21, attributes | _ATTR_TIMESTAMP_TYPE)
    _I64.pack_into(buf, pos + 35, timestamp_ms)
    (length,) = struct.unpack_from(">i", buf, pos + 8)
    end = pos + length + LOG_OVERHEAD
    _U32.pack_into(buf, pos + 17, crc32c(memoryview(buf)[pos + CRC_START : end]))


def iter_batches(
    buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each whole batch in ``buf[pos:end]``; stops at a partial batch."""
    stop = len(buf) if end is None else end
    while stop - pos >= HEADER_SIZE:
        header = parse_header(buf, pos)
        if pos + header.size > stop:
            return
        yield pos, header
        pos += header.size


# --- varints: the one reader and writer of Kafka's zigzag varints ---------------------------
def read_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, next position); one-byte values take one test.
    Raises CorruptRecordError past the end of ``buf`` or after ten bytes."""
    try:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
        raw = b & 0x7F
        shift = 7
        while True:
            pos += 1
            b = buf[pos]
            raw |= (b & 0x7F) << shift
            if b < 0x80:
                return (raw >> 1) ^ -(raw & 1), pos + 1
            shift += 7
            if shift > 63:
                raise CorruptRecordError("varint too long")
    except IndexError:
        raise CorruptRecordError("varint runs past the end of the records") from None


def write_varint(value: int, out: bytearray) -> None:
    """Append ``value`` as a zigzag varint."""
    raw = (value << 1) ^ (value >> 63)
    while raw & ~0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def read_bytes(buf: bytes | bytearray | memoryview, pos: int) -> tuple[bytes | None, int]:
    """A varint-length field (-1: null) at ``pos``: (bytes or None, next position)."""
    length, pos = read_varint(buf, pos)
    if length < 0:
        if length != -1:
            raise CorruptRecordError(f"field length {length}")
        return None, pos
    end = pos + length
    if end > len(buf):
        raise CorruptRecordError("record field runs past the end of the records")
    return bytes(buf[pos:end]), end


def write_bytes(value: bytes | None, out: bytearray) -> None:
    if value is None:
        write_varint(-1, out)
    else:
        write_varint(len(value), out)
        out += value


# --- decompression, bounded ------------------------------------------------------------------
MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024
"""What a batch may decompress to at most (``batch.max.uncompressed.bytes``): a 33 KB zstd
batch of zeros holds a gigabyte."""

_stored_limit = MAX_UNCOMPRESSED_BYTES


def set_stored_limit(max_uncompressed_bytes: int) -> None:
    """The broker's ``batch.max.uncompressed.bytes`` (at start): a stored batch read back
    (:func:`read_batch`, :func:`iter_records`: ListOffsets by time, the max timestamp, the
    group log, storage checks) may decompress to as much as a produced one was allowed to,
    and never less than the default. With the setting raised, a batch produce accepted made
    every later time lookup of its partition fail (KAFKA_STORAGE_ERROR) at the default."""
    global _stored_limit
    _stored_limit = max(max_uncompressed_bytes, MAX_UNCOMPRESSED_BYTES)


def stored_limit() -> int:
    """What :func:`set_stored_limit` set in this process (a tier job hands it to its
    executors, which are other processes)."""
    return _stored_limit


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


class RecordsTooLargeError(RecordBatchError):
    """A compressed batch whose records exceed what the broker decompresses: the producer's
    batch is too large (MESSAGE_TOO_LARGE; Kafka's Java client then splits it)."""


def _too_large(max_bytes: int) -> RecordsTooLargeError:
    return RecordsTooLargeError(f"records decompress to more than {max_bytes} bytes")


def _snappy_decompress(data: bytes | memoryview, max_bytes: int) -> bytes:
    """Kafka's snappy is the xerial framing (Java clients, librdkafka) or, rarely, raw; each
    raw block states its length up front, checked before it is decompressed."""

    import cramjam

    def block(raw: bytes | memoryview, budget: int) -> bytes:
        if cramjam.snappy.decompress_raw_len(raw) > budget:
            raise _too_large(max_bytes)
        return bytes(cramjam.snappy.decompress_raw(raw))

    if bytes(data[:8]) != _XERIAL_MAGIC:
        return block(data, max_bytes)
    out = bytearray()
    pos = 16  # magic(8) + version(4) + compatible version(4)
    while pos + 4 <= len(data):
        (chunk,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if chunk < 0 or pos + chunk > len(data):
            raise CorruptRecordError("snappy chunk runs past the end of the batch")
        out += block(data[pos : pos + chunk], max_bytes - len(out))
        pos += chunk
    return bytes(out)


def decompress(
    codec: int, data: bytes | memoryview, max_bytes: int = MAX_UNCOMPRESSED_BYTES
) -> bytes:
    """The records of a compressed batch, never more than ``max_bytes`` of them
    (RecordsTooLargeError: nothing beyond the bound is ever produced); CorruptRecordError
    when the bytes are not of the codec. Releases the GIL in the codecs: callers with large
    inputs run it in a thread."""
    try:
        if codec == COMPRESSION_NONE:
            out = bytes(data)
        elif codec == COMPRESSION_GZIP:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = inflater.decompress(data, max_bytes + 1)
            if len(out) <= max_bytes and not inflater.eof:
                raise CorruptRecordError("gzip stream truncated")
        elif codec == COMPRESSION_SNAPPY:
            out = _snappy_decompress(data, max_bytes)
        elif codec == COMPRESSION_LZ4:
            import lz4.frame

            out = lz4.frame.LZ4FrameDecompressor().decompress(bytes(data), max_length=max_bytes + 1)
        elif codec == COMPRESSION_ZSTD:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
                out = reader.read(max_bytes + 1)
        else:
            raise InvalidRecordError(f"unknown compression codec {codec}")
    except (RecordBatchError, ImportError):  # a codec not installed is not a corrupt batch
        raise
    except Exception as exc:  # each codec raises its own types for garbage
        raise CorruptRecordError(f"{COMPRESSION_NAMES.get(codec, codec)}: {exc}") from None
    if len(out) > max_bytes:
        raise _too_large(max_bytes)
    return out


# --- compression (the broker's own, for a topic's compression.type) ---------------------------
DEFAULT_LEVEL = -1
"""The codec's default level: Kafka's defaults, gzip 6 (zlib's), lz4 9, zstd 3."""
_LZ4_DEFAULT_LEVEL = 9
_ZSTD_DEFAULT_LEVEL = 3
_SNAPPY_BLOCK_BYTES = 32 * 1024  # the xerial framing's block (Kafka's Java client's)


def compress(codec: int, data: bytes | memoryview, level: int = DEFAULT_LEVEL) -> bytes:
    """``data`` (a batch's records) compressed as Kafka's clients compress them: gzip
    streams, snappy in the xerial framing, LZ4 frames with independent blocks, zstd frames.
    Releases the GIL in the codecs: callers with large inputs run it in a thread."""
    if codec == COMPRESSION_NONE:
        return bytes(data)
    if codec == COMPRESSION_GZIP:
        deflater = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return deflater.compress(data) + deflater.flush()
    if codec == COMPRESSION_SNAPPY:
        import cramjam

        out = bytearray(_XERIAL_MAGIC + struct.pack(">ii", 1, 1))
        view = memoryview(data)
        for start in range(0, len(view), _SNAPPY_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(view[start : start + _SNAPPY_BLOCK_BYTES]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == COMPRESSION_LZ4:
        import lz4.frame

        return lz4.frame.compress(
            bytes(data),
            compression_level=_LZ4_DEFAULT_LEVEL if level == DEFAULT_LEVEL else level,
            block_linked=False,
            store_size=False,
        )
    if codec == COMPRESSION_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(
            level=_ZSTD_DEFAULT_LEVEL if level == DEFAULT_LEVEL else level
        ).compress(bytes(data))
    raise InvalidRecordError(f"unknown compression codec {codec}")


def recompress(
    batch: bytes | bytearray | memoryview,
    codec: int,
    level: int = DEFAULT_LEVEL,
    max_uncompressed_bytes: int = MAX_UNCOMPRESSED_BYTES,
) -> bytes:
    """The batch with its records in ``codec`` (Kafka's LogValidator recompressing for a
    topic whose compression.type differs from the producer's): every header field kept but
    the codec bits, the length and the CRC; the records' bytes themselves unchanged."""
    header = parse_header(batch)
    body = memoryview(batch)[HEADER_SIZE : header.size]
    records = decompress(header.compression, body, max_uncompressed_bytes)
    packed = compress(codec, records, level)
    out = bytearray(batch[:HEADER_SIZE])
    attributes = (header.attributes & ~_ATTR_COMPRESSION) | codec
    struct.pack_into(">i", out, 8, HEADER_SIZE - LOG_OVERHEAD + len(packed))
    struct.pack_into(">h", out, 21, attributes)
    out += packed
    _U32.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


# --- the record walk ---------------------------------------------------------------------------
SCAN_ERRORS = {
    1: "a length runs past the end of the records",
    2: "a varint is longer than its type allows",
    3: "a record's fields do not add up to its length",
    4: "a negative header count",
    5: "a negative header key length",
    6: "an offset delta that is not the record's index",
    7: "bytes after the last record",
    8: "a negative length",
}
"""The rules the record walk checks, by the status it returns (Kafka's DefaultRecord.readFrom:
each broken rule is an InvalidRecordException, INVALID_RECORD)."""


def scan_records_py(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    count: int,
    bounds: bytearray | memoryview | None = None,
) -> tuple[int, int, int, int]:
    """The pure-Python record walk: ``_recordscan.scan``'s twin, same rules and answers
    (``bounds``: a writable buffer of ``2 * count`` int64 given each record's start and end)."""
    if start < 0 or end > len(buf) or start > end or count < 0:
        raise ValueError("scan: bounds outside the buffer")
    mv = memoryview(buf)
    out = None
    if bounds is not None:
        out = memoryview(bounds).cast("B").cast("q")
        if len(out) < 2 * count:
            raise ValueError("scan: bounds outside the buffer")

    def varint(pos: int, limit: int, max_bytes: int) -> tuple[int, int]:
        raw = shift = 0
        for _ in range(max_bytes):
            if pos >= limit:
                raise _Scan(1)
            b = mv[pos]
            pos += 1
            raw |= (b & 0x7F) << shift
            if not b & 0x80:
                if max_bytes == 5 and raw > 0xFFFFFFFF:
                    raise _Scan(2)
                return (raw >> 1) ^ -(raw & 1), pos
            shift += 7
        raise _Scan(2)

    def skip(pos: int, limit: int, nullable: bool, negative: int) -> int:
        length, pos = varint(pos, limit, 5)
        if length < 0:
            if length == -1 and nullable:
                return pos
            raise _Scan(negative)
        if length > limit - pos:
            raise _Scan(1)
        return pos + length

    pos = start
    low, high = 2**63 - 1, -(2**63)
    index = 0
    try:
        for index in range(count):
            length, pos = varint(pos, end, 5)
            if length < 1:
                raise _Scan(8)
            if length > end - pos:
                raise _Scan(1)
            record_end = pos + length
            if out is not None:
                out[2 * index], out[2 * index + 1] = pos, record_end
            ts_delta, pos = varint(pos + 1, record_end, 10)
            offset_delta, pos = varint(pos, record_end, 5)
            if offset_delta != index:
                raise _Scan(6)
            pos = skip(pos, record_end, True, 8)
            pos = skip(pos, record_end, True, 8)
            headers, pos = varint(pos, record_end, 5)
            if headers < 0:
                raise _Scan(4)
            for _ in range(headers):
                pos = skip(pos, record_end, False, 5)
                pos = skip(pos, record_end, True, 8)
            if pos != record_end:
                raise _Scan(3)
            low, high = min(low, ts_delta), max(high, ts_delta)
        else:
            index = count
        if pos != end:
            raise _Scan(7)
    except _Scan as failed:
        return failed.status, index, 0, 0
    if count == 0:
        return 0, 0, 0, 0
    return 0, count, low, high


class _Scan(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


try:  # the C walk (setup.py builds it); the Python twin when it was not built
    from stonemq.protocol import _recordscan

    if getattr(_recordscan, "VERSION", 1) >= 2:
        scan_records = _recordscan.scan
    else:  # pragma: no cover - a build older than the bounds argument: rebuild it

        def scan_records(
            buf: bytes | bytearray | memoryview,
            start: int,
            end: int,
            count: int,
            bounds: bytearray | memoryview | None = None,
        ) -> tuple[int, int, int, int]:
            if bounds is None:
                return _recordscan.scan(buf, start, end, count)  # type: ignore[no-any-return]
            return scan_records_py(buf, start, end, count, bounds)

except ImportError:  # pragma: no cover - depends on the build
    scan_records = scan_records_py

crc32c_combine: Callable[[int, int, int], int] | None = None
"""``crc32c_combine(crc(A), crc(B), len(B))``: the CRC-32C of ``A || B`` without reading
either (the C walk's module, from version 3); None without it (callers compute the CRC over
the bytes instead)."""
try:
    from stonemq.protocol import _recordscan as _native

    if getattr(_native, "VERSION", 1) >= 3:
        crc32c_combine = _native.crc32c_combine
except ImportError:  # pragma: no cover - depends on the build
    pass


def walk_records(
    body: bytes | bytearray | memoryview,
    start: int,
    end: int,
    count: int,
    bounds: bytearray | memoryview | None = None,
) -> tuple[int, int]:
    """Walk the ``count`` records of ``body[start:end]`` (uncompressed) by Kafka's record
    rules; (smallest, largest) timestamp delta. Raises InvalidRecordError naming the first
    record that breaks a rule. ``bounds``: see :func:`scan_records_py`."""
    if bounds is None:
        status, index, low, high = scan_records(body, start, end, count)
    else:
        status, index, low, high = scan_records(body, start, end, count, bounds)
    if status:
        raise InvalidRecordError(f"record {index}: {SCAN_ERRORS.get(status, status)}")
    return low, high


# --- the batch validator (Kafka's LogValidator rules) -----------------------------------------
@dataclass(frozen=True, slots=True)
class RecordLimits:
    """A topic's rules for the records of a produced batch."""

    max_uncompressed_bytes: int = MAX_UNCOMPRESSED_BYTES
    timestamp_before_max_ms: int = 2**63 - 1  # message.timestamp.before.max.ms
    timestamp_after_max_ms: int = 3_600_000  # message.timestamp.after.max.ms (Kafka 4: 1 h)
    log_append_time: bool = False  # message.timestamp.type=LogAppendTime: no check


class InvalidTimestampError(RecordBatchError):
    """A record timestamp outside the topic's bounds, or a client batch flagged
    LogAppendTime: INVALID_TIMESTAMP. ``record_errors``: (record index, message) of each
    record out of bounds (KIP-467's ``record_errors``)."""

    def __init__(self, message: str, record_errors: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(message)
        self.record_errors = record_errors


def check_framing(
    buf: bytes | bytearray | memoryview, pos: int, end: int, check_crc: bool = True
) -> BatchHeader:
    """The rules every batch passes, produced or read back: magic 2, its length within
    ``buf[pos:end]``, its CRC-32C, a record count matching its last offset delta, a known
    codec. Cheap (the header and a CRC): the checks of :func:`read_batch` short of the record
    walk, for a reader that skips a batch it does not need."""
    return _check_framing(buf, pos, end, parse_header(buf, pos), check_crc)


def _check_framing(
    buf: bytes | bytearray | memoryview, pos: int, end: int, header: BatchHeader, check_crc: bool
) -> BatchHeader:
    if pos + header.size > end:
        raise CorruptRecordError(
            f"batch length field says {header.size} bytes, only {end - pos} present"
        )
    if check_crc and not crc_ok(buf, pos, header):
        raise CorruptRecordError("record batch CRC-32C mismatch")
    if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
        raise InvalidRecordError(
            f"record count {header.record_count} does not match last offset delta "
            f"{header.last_offset_delta}"
        )
    if header.compression > COMPRESSION_ZSTD:
        raise InvalidRecordError(f"unknown compression codec {header.compression}")
    return header


def check_batch(buf: bytes | bytearray | memoryview) -> BatchHeader:
    """The batch-level rules for a produced batch (cheap: header and CRC only); raises the
    RecordBatchError that names the Kafka error. See :func:`validate_produce_records`.

    One pass over the header's fields as locals for a batch that breaks no rule (once per
    produced batch: at 10,000 partitions of one-record batches the helpers and properties of
    :func:`check_batch_reference` were 7% of the broker's samples); anything else is
    answered by :func:`check_batch_reference`, which raises the precise error."""
    n = len(buf)
    if n >= HEADER_SIZE and buf[16] == 2:
        fields = _HEADER.unpack_from(buf, 0)
        (_, length, _, _, crc, attributes, last_delta, _, _, producer_id, _, sequence, count) = (
            fields
        )
        if (
            length + LOG_OVERHEAD == n
            and length >= MIN_BATCH_LENGTH
            and count > 0
            and count == last_delta + 1
            and attributes & _ATTR_COMPRESSION <= COMPRESSION_ZSTD
            and not attributes & (_ATTR_CONTROL | _ATTR_TIMESTAMP_TYPE | _ATTR_TRANSACTIONAL)
            and (producer_id < 0 or sequence >= 0)
            and crc32c(memoryview(buf)[CRC_START:]) == crc
        ):
            return _make_header(fields)
    return check_batch_reference(buf)


def check_batch_reference(buf: bytes | bytearray | memoryview) -> BatchHeader:
    """:func:`check_batch` rule by rule, each with its error (the answer for any batch that
    breaks one; a property test holds the two to the same answers)."""
    header = parse_header(buf, 0)
    if header.size < len(buf):
        raise InvalidRecordError("produce records must hold exactly one record batch")
    _check_framing(buf, 0, len(buf), header, True)  # the header parsed once
    if header.is_control:
        raise InvalidRecordError("clients may not produce control batches")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecordError(
            f"invalid sequence number {header.base_sequence} in a batch with producer id "
            f"{header.producer_id}"
        )
    if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        raise InvalidTimestampError("producers may not set the timestamp type to LogAppendTime")
    if header.is_transactional:
        raise TransactionalBatchError(
            "a transactional batch needs a transactional producer (transactions are not "
            "supported yet)"
        )
    return header


def check_records(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    limits: RecordLimits,
    now_ms: int,
    max_uncompressed_bytes: int | None = None,
) -> int:
    """The record-level rules: every record well formed (decompressing a compressed batch,
    at most ``max_uncompressed_bytes``, default the limits'), and CreateTime timestamps within
    the topic's bounds. Returns the records' largest timestamp (what the batch's max
    timestamp must say). Raises InvalidRecordError, CorruptRecordError,
    RecordsTooLargeError or InvalidTimestampError."""
    if not header.attributes & _ATTR_COMPRESSION:  # walked in place (batch_body, walk_records)
        status, index, low, high = scan_records(
            buf, HEADER_SIZE, header.batch_length + LOG_OVERHEAD, header.record_count
        )
        if status:
            raise InvalidRecordError(f"record {index}: {SCAN_ERRORS.get(status, status)}")
    else:
        bound = (
            limits.max_uncompressed_bytes
            if max_uncompressed_bytes is None
            else max_uncompressed_bytes
        )
        body, start, end = batch_body(buf, 0, header, bound)
        low, high = walk_records(body, start, end, header.record_count)
    first, last = header.base_timestamp + low, header.base_timestamp + high
    if not limits.log_append_time and (
        first == NO_TIMESTAMP  # some record has none: the others are checked one by one
        or now_ms - first > limits.timestamp_before_max_ms
        or last - now_ms > limits.timestamp_after_max_ms
    ):
        if header.attributes & _ATTR_COMPRESSION:
            errors = _timestamp_errors(body, start, end, header, limits, now_ms)
        else:
            errors = _timestamp_errors(
                buf, HEADER_SIZE, header.batch_length + LOG_OVERHEAD, header, limits, now_ms
            )
        if errors:
            raise InvalidTimestampError(
                "One or more records have been rejected due to invalid timestamp", errors
            )
    return last


def _timestamp_errors(
    body: bytes | bytearray | memoryview,
    start: int,
    end: int,
    header: BatchHeader,
    limits: RecordLimits,
    now_ms: int,
) -> tuple[tuple[int, str], ...]:
    """Kafka's LogValidator.validateTimestamp over every record of a walked batch: (index,
    message) of each CreateTime timestamp out of the topic's bounds; a record without a
    timestamp (-1) is not checked."""
    low, high = now_ms - limits.timestamp_before_max_ms, now_ms + limits.timestamp_after_max_ms
    errors = []
    for i, (offset_delta, ts_delta, _, _, _) in enumerate(
        iter_record_fields(body, start, header.record_count, end)
    ):
        timestamp = header.base_timestamp + ts_delta
        if timestamp != NO_TIMESTAMP and not low <= timestamp <= high:
            errors.append(
                (
                    i,
                    f"Timestamp {timestamp} of message with offset "
                    f"{header.base_offset + offset_delta} is out of range. The timestamp "
                    f"should be within [{low}, {high}]",
                )
            )
    return tuple(errors)


def batch_body(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    max_uncompressed_bytes: int = MAX_UNCOMPRESSED_BYTES,
) -> tuple[bytes | bytearray | memoryview, int, int]:
    """(buffer, start, end) of the records of the batch at ``pos``: in place when it is
    uncompressed, else decompressed (at most ``max_uncompressed_bytes``)."""
    if header.compression == COMPRESSION_NONE:
        return buf, pos + HEADER_SIZE, pos + header.size
    body = decompress(
        header.compression,
        memoryview(buf)[pos + HEADER_SIZE : pos + header.size],
        max_uncompressed_bytes,
    )
    return body, 0, len(body)


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A batch read back that passed :func:`read_batch`: its records lie in
    ``body[start:end]`` (the batch's own bytes, or what it decompressed to)."""

    header: BatchHeader
    body: bytes | bytearray | memoryview
    start: int
    end: int
    bounds: bytearray | None  # each record's (start, end) as int64 pairs, when asked for


def read_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    end: int | None = None,
    *,
    max_uncompressed_bytes: int | None = None,
    bounds: bool = False,
    check_crc: bool = True,
    header: BatchHeader | None = None,
) -> StoredBatch:
    """The validator of a batch read back from a log (the group log, the tiering decoder,
    ListOffsets by timestamp, cold reads, tools): the rules :func:`check_batch` and
    :func:`check_records` apply to a produced batch, less the produce-only ones (control
    batches, LogAppendTime, producer sequence, timestamp bounds), with the same errors.
    ``bounds``: also return where each record starts and ends (see :func:`walk_records`);
    ``header``: what :func:`check_framing` returned for this batch (not checked again);
    ``max_uncompressed_bytes``: by default the stored limit (:func:`set_stored_limit`)."""
    if header is None:
        header = check_framing(buf, pos, len(buf) if end is None else end, check_crc)
    if max_uncompressed_bytes is None:
        max_uncompressed_bytes = _stored_limit
    body, start, body_end = batch_body(buf, pos, header, max_uncompressed_bytes)
    out = bytearray(16 * header.record_count) if bounds else None
    walk_records(body, start, body_end, header.record_count, out)
    return StoredBatch(header, body, start, body_end, out)


def validate_produce_records(
    buf: bytes | bytearray | memoryview,
    limits: RecordLimits | None = None,
    now_ms: int | None = None,
) -> BatchHeader:
    """Check that ``buf`` is exactly one valid v2 batch with valid records, as Kafka's
    LogValidator does for a produce (both steps at once; the produce path runs
    :func:`check_records` of a large compressed batch in a thread)."""
    header = check_batch(buf)
    check_records(
        buf, header, limits or RecordLimits(), now_ms if now_ms is not None else _now_ms()
    )
    return header


def _now_ms() -> int:
    return int(time.time() * 1000)


def set_max_timestamp(buf: bytearray, pos: int, timestamp_ms: int) -> None:
    """Set a CreateTime batch's max timestamp (Kafka rewrites a wrong one) and re-CRC it."""
    _I64.pack_into(buf, pos + 35, timestamp_ms)
    (length,) = struct.unpack_from(">i", buf, pos + 8)
    end = pos + length + LOG_OVERHEAD
    _U32.pack_into(buf, pos + 17, crc32c(memoryview(buf)[pos + CRC_START : end]))


# --- records (decoded: never on the produce or fetch path) ------------------------------------
@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def iter_record_fields(
    body: bytes | bytearray | memoryview, start: int, count: int, end: int | None = None
) -> Iterator[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    """``(offset delta, timestamp delta, key, value, headers)`` of the ``count`` records in
    ``body[start:end]``, which :func:`read_batch` (or :func:`check_records`) validated: no
    Record object is made, nothing is checked twice, and varints of one or two bytes (most
    lengths and deltas) are read inline. (A body that is not ``bytes`` is copied once, its
    ``start:end`` only.)"""
    if isinstance(body, bytes):
        data, pos = body, start
    else:
        data, pos = memoryview(body)[start:end].tobytes(), 0
    varint = read_varint
    for _ in range(count):
        while data[pos] >= 0x80:  # the record's length: validated, skipped
            pos += 1
        pos += 2  # its last byte, the attributes
        b = data[pos]
        if b < 0x80:
            ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        else:
            ts_delta, pos = varint(data, pos)
        b = data[pos]
        if b < 0x80:
            offset_delta, pos = b >> 1, pos + 1  # never negative in a validated record
        else:
            offset_delta, pos = varint(data, pos)
        fields: list[bytes | None] = []
        n_fields = 2  # key, value; then a key and a value per header
        while n_fields:
            n_fields -= 1
            b = data[pos]
            if b < 0x80:
                size, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                size, pos = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                size, pos = varint(data, pos)
            if size < 0:
                fields.append(None)
            else:
                fields.append(data[pos : pos + size])
                pos += size
            if len(fields) == 2:
                b = data[pos]
                if b < 0x80:
                    n_headers, pos = b >> 1, pos + 1  # never negative in a validated record
                else:
                    n_headers, pos = varint(data, pos)
                n_fields = 2 * n_headers
        if len(fields) == 2:
            yield offset_delta, ts_delta, fields[0], fields[1], ()
        else:
            headers = tuple(
                ((fields[h] or b"").decode("utf-8", "replace"), fields[h + 1])
                for h in range(2, len(fields), 2)
            )
            yield offset_delta, ts_delta, fields[0], fields[1], headers


def iter_records(
    batch: bytes | bytearray | memoryview,
    max_uncompressed_bytes: int | None = None,
    *,
    check_crc: bool = True,
) -> Iterator[Record]:
    """Decode every record of one whole batch (decompressing, bounded), absolute offsets,
    once the batch passed :func:`read_batch` (``check_crc=False``: a dump tool showing the
    records of a batch whose CRC it reports as wrong)."""
    stored = read_batch(
        batch, 0, max_uncompressed_bytes=max_uncompressed_bytes, check_crc=check_crc
    )
    header = stored.header
    log_append = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    for offset_delta, ts_delta, key, value, headers in iter_record_fields(
        stored.body, stored.start, header.record_count, stored.end
    ):
        timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
        yield Record(header.base_offset + offset_delta, timestamp, key, value, headers)


# --- encoding: the one batch builder (the group log, cold reads, tests) ------------------------
def encode_records(
    records: Iterable[
        tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
    ],
    out: bytearray,
) -> int:
    """Append records ``(offset delta, timestamp delta, key, value, headers)`` to ``out``;
    returns how many. (Lengths and deltas under 64 take one byte, written inline: the cold
    reads re-encode every record they send.)"""
    count = 0
    varint = write_varint
    for offset_delta, ts_delta, key, value, headers in records:
        body = bytearray(b"\0")  # attributes
        if 0 <= ts_delta < 64:
            body.append(ts_delta << 1)
        else:
            varint(ts_delta, body)
        if 0 <= offset_delta < 64:
            body.append(offset_delta << 1)
        else:
            varint(offset_delta, body)
        for field in (key, value):
            if field is None:
                body.append(1)  # -1
            else:
                size = len(field)
                if size < 64:
                    body.append(size << 1)
                else:
                    varint(size, body)
                body += field
        if headers:
            varint(len(headers), body)
            for hkey, hvalue in headers:
                for field in (hkey.encode(), hvalue):
                    if field is None:
                        body.append(1)  # -1
                    else:
                        size = len(field)
                        if size < 64:
                            body.append(size << 1)
                        else:
                            varint(size, body)
                        body += field
        else:
            body.append(0)
        size = len(body)
        if size < 64:
            out.append(size << 1)
        else:
            varint(size, out)
        out += body
        count += 1
    return count


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    *,
    log_append_time: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
) -> bytes:
    """One uncompressed RecordBatch v2 of ``records`` ``(timestamp, key, value, headers)`` at
    consecutive offsets from ``base_offset``; ``log_append_time`` >= 0 marks it LogAppendTime
    with that max timestamp."""
    stamps = [r[0] for r in records]
    base_ts = min(stamps) if stamps else 0
    body = bytearray()
    count = encode_records(
        (
            (i, ts - base_ts, key, value, headers)
            for i, (ts, key, value, headers) in enumerate(records)
        ),
        body,
    )
    max_ts = log_append_time if log_append_time >= 0 else (max(stamps) if stamps else -1)
    return wrap_records(
        body,
        count,
        base_offset=base_offset,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        log_append_time=log_append_time >= 0,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
    )


def wrap_records(
    records: bytes | bytearray | memoryview,
    count: int,
    **fields: int,
) -> bytes:
    """The batch of ``count`` encoded ``records`` (offset deltas 0 .. count - 1) in one
    piece: :func:`batch_parts` joined."""
    head, body = batch_parts(records, count, **fields)
    return head + body


def batch_parts(
    records: bytes | bytearray | memoryview,
    count: int,
    *,
    base_offset: int = 0,
    base_timestamp: int,
    max_timestamp: int,
    log_append_time: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    codec: int = COMPRESSION_NONE,
    level: int = DEFAULT_LEVEL,
) -> tuple[bytes, bytes | bytearray | memoryview]:
    """The batch of ``count`` encoded ``records`` (offset deltas 0 .. count - 1) as its
    61-byte header, CRC included, and its records (compressed with ``codec``; otherwise
    ``records`` itself, not copied): a sender writes the two back to back."""
    if codec != COMPRESSION_NONE:
        records = compress(codec, records, level)
    attributes = (_ATTR_TIMESTAMP_TYPE if log_append_time else 0) | codec
    head = bytearray(
        BATCH_HEADER.pack(
            base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(records),
            partition_leader_epoch,
            2,
            0,
            attributes,
            count - 1,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    )
    crc = crc32c(records, crc32c(memoryview(head)[CRC_START:]))
    _U32.pack_into(head, 17, crc)
    return bytes(head), records
