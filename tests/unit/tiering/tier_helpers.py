"""Segment bytes for tiering tests: batches built the way clients build them (kafka-python's
builder, every codec), control batches, and a local queue-log folder to upload from."""

from __future__ import annotations

import struct
from pathlib import Path

from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from stonemq.protocol.record_batch import set_base_offset
from stonemq.tiering.rows import encode_batch

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def client_batch(
    base_offset: int, records: list[tuple[int, bytes | None, bytes | None, list]], codec: str
) -> bytes:
    """A batch as a producer sends it: ``(timestamp_ms, key, value, headers)`` records."""
    builder = DefaultRecordBatchBuilder(2, CODECS[codec], False, 42, 0, 0, 1 << 30)
    for i, (ts, key, value, headers) in enumerate(records):
        builder.append(i, ts, key, value, headers)
    buf = bytearray(builder.build())
    set_base_offset(buf, 0, base_offset)
    return bytes(buf)


def control_batch(offset: int, timestamp_ms: int) -> bytes:
    """A one-record control batch (a transaction marker) at ``offset``."""
    buf = bytearray(encode_batch(offset, [(offset, timestamp_ms, b"\x00\x00\x00\x01", b"", ())]))
    (attributes,) = struct.unpack_from(">h", buf, 21)
    struct.pack_into(">h", buf, 21, attributes | 0x30)  # transactional + control
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def record(i: int) -> tuple[int, bytes | None, bytes | None, list]:
    key = None if i % 5 == 0 else f"key-{i % 7}".encode()
    value = None if i % 11 == 0 else (f"value-{i}-" * (1 + i % 4)).encode()
    headers = [("h", f"{i}".encode()), ("n", None)] if i % 3 == 0 else []
    return 1_700_000_000_000 + i, key, value, headers


def write_segments(queue_dir: Path, topic: str, partition: int, segments: list[list[bytes]]):
    """Write ``segments`` (lists of batch bytes) as Kafka-named .log files; returns paths."""
    directory = queue_dir / f"{topic}-{partition}"
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for batches in segments:
        base = struct.unpack_from(">q", batches[0], 0)[0]
        path = directory / f"{base:020d}.log"
        path.write_bytes(b"".join(batches))
        paths.append(path)
    return paths


def data_segments(n_segments: int, batches_per_segment: int, per_batch: int) -> list[list[bytes]]:
    """Segments of client batches cycling through the codecs, a control batch at each
    segment's end; offsets contiguous from 0."""
    codecs = list(CODECS)
    out = []
    offset = 0
    for s in range(n_segments):
        seg = []
        for b in range(batches_per_segment):
            recs = [record(offset + i) for i in range(per_batch)]
            seg.append(client_batch(offset, recs, codecs[(s + b) % len(codecs)]))
            offset += per_batch
        seg.append(control_batch(offset, 1_700_000_000_000 + offset))
        offset += 1
        out.append(seg)
    return out


def expected_records(segments: list[list[bytes]]) -> dict[int, tuple]:
    """offset -> (timestamp, key, value, headers) of every data record."""
    from stonemq.protocol.record_batch import iter_batches, iter_records

    out = {}
    for seg in segments:
        data = b"".join(seg)
        for pos, header in iter_batches(data):
            if header.is_control:
                continue
            for r in iter_records(data[pos : pos + header.size]):
                out[r.offset] = (r.timestamp, r.key, r.value, r.headers)
    return out


def archive_in_process(store, topic: str, partition: int, queue_dir: Path, *, commit=True):
    """The archive job's staging and commit in this process (no JVM)."""
    from stonemq.tiering.archive_job import archive_in_process as run

    return run(store.spec, str(queue_dir), topic, partition, commit=commit)
