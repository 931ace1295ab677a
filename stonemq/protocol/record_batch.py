"""RecordBatch v2 (magic 2): the 61-byte header, its CRC-32C, base-offset and timestamp patches.

The broker treats a batch as opaque bytes on the hot path: it reads this header, checks the
CRC (computed in C by ``crc32c``) and patches the base offset; it never touches the records.
:func:`iter_records` decodes records (decompressing) for the few paths that need them
(ListOffsets by timestamp, tools), never for produce or fetch.

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

import gzip
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam
from crc32c import crc32c

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes not counted by batch_length
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
CRC_START = 21

_HEADER = struct.Struct(">qiibIhiqqqhii")
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


class UnsupportedMagicError(RecordBatchError):
    """Magic 0 or 1 (or unknown): UNSUPPORTED_FOR_MESSAGE_FORMAT."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
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


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header of the batch starting at ``pos``; no CRC check, no bounds beyond it."""
    if len(buf) - pos < 17:
        raise CorruptRecordError(f"batch header truncated: {len(buf) - pos} bytes")
    magic = buf[pos + 16]
    if magic != 2:
        raise UnsupportedMagicError(f"record batch magic {magic} (only magic 2 is accepted)")
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(f"batch header truncated: {len(buf) - pos} bytes")
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(f"batch length {header.batch_length} below the header size")
    return header


def crc_ok(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether the stored CRC-32C matches bytes ``CRC_START..end`` of the batch."""
    end = pos + header.size
    if end > len(buf):
        return False
    return crc32c(memoryview(buf)[pos + CRC_START : end]) == header.crc


def validate_produce_records(buf: bytes | bytearray | memoryview) -> BatchHeader:
    """Check that ``buf`` is exactly one valid v2 batch, as Kafka requires for produce v3+.

    Raises :class:`CorruptRecordError` (lengths, CRC), :class:`UnsupportedMagicError`, or
    :class:`InvalidRecordError`. Returns the parsed header.
    """
    header = parse_header(buf, 0)
    if header.size != len(buf):
        if header.size > len(buf):
            raise CorruptRecordError(
                f"batch length field says {header.size} bytes, only {len(buf)} present"
            )
        raise InvalidRecordError("produce records must hold exactly one record batch")
    if not crc_ok(buf, 0, header):
        raise CorruptRecordError("record batch CRC-32C mismatch")
    if header.record_count <= 0 or header.record_count != header.last_offset_delta + 1:
        raise InvalidRecordError(
            f"record count {header.record_count} does not match last offset delta "
            f"{header.last_offset_delta}"
        )
    if header.compression > COMPRESSION_ZSTD:
        raise InvalidRecordError(f"unknown compression codec {header.compression}")
    if header.is_control:
        raise InvalidRecordError("clients may not produce control batches")
    return header


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


# --- records (not for the hot path) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError("varint runs past the end of the records")
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint too long")
    return (raw >> 1) ^ -(raw & 1), pos


def _read_bytes(buf: memoryview, pos: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > len(buf):
        raise CorruptRecordError("record field runs past the end of the records")
    return bytes(buf[pos : pos + length]), pos + length


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_decompress(data: bytes) -> bytes:
    """Kafka's snappy is the xerial framing (Java clients, librdkafka) or, rarely, raw."""
    if data.startswith(_XERIAL_MAGIC):
        out = bytearray()
        pos = 16  # magic(8) + version(4) + compatible version(4)
        while pos + 4 <= len(data):
            (chunk,) = struct.unpack_from(">i", data, pos)
            pos += 4
            out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + chunk]))
            pos += chunk
        return bytes(out)
    return bytes(cramjam.snappy.decompress_raw(data))


def decompress(codec: int, data: bytes) -> bytes:
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        return gzip.decompress(data)
    if codec == COMPRESSION_SNAPPY:
        return _snappy_decompress(data)
    if codec == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise InvalidRecordError(f"unknown compression codec {codec}")


def iter_records(batch: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Decode every record of one whole batch (decompressing), with absolute offsets."""
    header = parse_header(batch, 0)
    body = bytes(memoryview(batch)[HEADER_SIZE : header.size])
    view = memoryview(decompress(header.compression, body))
    log_append = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    pos = 0
    for _ in range(header.record_count):
        length, pos = _read_varint(view, pos)
        end = pos + length
        pos += 1  # attributes
        ts_delta, pos = _read_varint(view, pos)
        offset_delta, pos = _read_varint(view, pos)
        key, pos = _read_bytes(view, pos)
        value, pos = _read_bytes(view, pos)
        count, pos = _read_varint(view, pos)
        headers = []
        for _ in range(count):
            hkey, pos = _read_bytes(view, pos)
            hval, pos = _read_bytes(view, pos)
            headers.append(((hkey or b"").decode("utf-8", "replace"), hval))
        if pos != end:
            raise CorruptRecordError("record length does not match its fields")
        timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
        yield Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers))
