"""RecordBatch v2 written by hand, so every field can be wrong on purpose while the CRC still
matches (or not): records, compression (gzip, xerial snappy, lz4 frame, zstd), and batches
that decompress to far more than they weigh.
"""

from __future__ import annotations

import gzip
import random
import struct
import time

import cramjam
from crc32c import crc32c

from .layout import encode_uvarint

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
CODECS = (GZIP, SNAPPY, LZ4, ZSTD)
_HEADER = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2 header, 61 bytes
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def varint(value: int) -> bytes:
    """Zigzag varint, as records use."""
    return encode_uvarint((value << 1) ^ (value >> 63))


def _sized(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def record(
    offset_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[bytes, bytes | None], ...] = (),
    timestamp_delta: int = 0,
) -> bytes:
    body = (
        b"\0"
        + varint(timestamp_delta)
        + varint(offset_delta)
        + _sized(key)
        + _sized(value)
        + varint(len(headers))
        + b"".join(varint(len(k)) + k + _sized(v) for k, v in headers)
    )
    return varint(len(body)) + body


def compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        return gzip.compress(data, compresslevel=6)
    if codec == SNAPPY:
        raw = bytes(cramjam.snappy.compress_raw(data))
        return XERIAL_HEADER + struct.pack(">i", len(raw)) + raw
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    return bytes(cramjam.zstd.compress(data))


def batch(
    records: bytes,
    count: int,
    *,
    codec: int = 0,
    attributes: int = 0,
    last_offset_delta: int | None = None,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    magic: int = 2,
    length_delta: int = 0,
    crc_ok: bool = True,
) -> bytes:
    """A batch around ``records`` (compressed with ``codec`` unless 0), CRC computed over what
    is sent unless ``crc_ok`` is false; every header field may be given a lie."""
    payload = compress(codec, records) if codec else records
    ts = int(time.time() * 1000) if base_timestamp is None else base_timestamp
    header = _HEADER.pack(
        0,
        _HEADER.size - 12 + len(payload) + length_delta,
        -1,
        magic,
        0,
        attributes | codec,
        count - 1 if last_offset_delta is None else last_offset_delta,
        ts,
        ts if max_timestamp is None else max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    )
    out = bytearray(header + payload)
    crc = crc32c(bytes(out[21:]))
    struct.pack_into(">I", out, 17, crc if crc_ok else crc ^ 0x5A5A5A5A)
    return bytes(out)


def simple_batch(rng: random.Random, count: int | None = None, codec: int = 0) -> bytes:
    """A valid batch of a few small records (what hints.records gives the value maker)."""
    n = count if count is not None else rng.randint(1, 4)
    records = b"".join(
        record(i, rng.choice((None, b"k%d" % i)), rng.randbytes(rng.randint(0, 64)))
        for i in range(n)
    )
    return batch(records, n, codec=codec)
