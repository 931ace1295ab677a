"""What the record codec costs on the paths that read and write records off the produce path.

``python -m bench.codec_cost`` times (CPU time, best of several runs) the tiering decoder
(:func:`stonemq.tiering.rows.decode_segment`: segment bytes to Arrow rows) on 16 MiB segments
of 1 KiB records (uncompressed batches of 200 records as the archive benchmark produces them,
the same with two headers per record, and zstd batches), the cold-read encoder
(:func:`stonemq.tiering.rows.encode_rows`), and the group log (building
``__consumer_offsets`` batches and reading them back with ``iter_records``). Not part of the
benchmark suite's run: a check for the codec's hot paths, run once per tree to compare
(``PYTHONPATH=<tree> python -m bench.codec_cost``).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable

from kafka.record.default_records import DefaultRecordBatchBuilder

from stonemq.coordinator import group_log as glog
from stonemq.protocol.record_batch import iter_batches, iter_records, set_base_offset
from stonemq.tiering.rows import decode_segment, encode_rows

SEGMENT_BYTES = 16 * 1024 * 1024
RECORD_BYTES = 1024
PER_BATCH = 200
RUNS = 7


def _value(i: int, rng: random.Random) -> bytes:
    words = " ".join(
        rng.choice(("good", "fast", "late", "box", "price", "fit")) for _ in range(150)
    )
    raw = json.dumps({"id": i, "user": rng.randrange(10**6), "review": words}).encode()
    return raw[:RECORD_BYTES].ljust(RECORD_BYTES, b" ")


def segment(codec: int, headers: bool) -> bytes:
    """About SEGMENT_BYTES of client batches (kafka-python's builder, as producers build)."""
    rng = random.Random(7)
    out = bytearray()
    offset = 0
    while len(out) < SEGMENT_BYTES:
        builder = DefaultRecordBatchBuilder(2, codec, False, 42, 0, 0, 1 << 30)
        for i in range(PER_BATCH):
            hdrs = [("trace", b"%08d" % (offset + i)), ("source", b"web")] if headers else []
            key = b"user-%d" % rng.randrange(1000)
            builder.append(i, 1_700_000_000_000 + offset + i, key, _value(offset + i, rng), hdrs)
        batch = bytearray(builder.build())
        set_base_offset(batch, 0, offset)
        out += batch
        offset += PER_BATCH
    return bytes(out)


def best(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def main() -> None:
    import stonemq

    print(f"tree: {stonemq.__file__}")
    for name, codec, headers in (
        ("plain", 0, False),
        ("headers", 0, True),
        ("zstd", 4, False),
    ):
        data = segment(codec, headers)
        mb = len(data) / 1e6
        table = decode_segment(data, "t", 0, 0, 10**12)
        rows = table.num_rows
        decode_s = best(lambda data=data: decode_segment(data, "t", 0, 0, 10**12))
        encode_s = best(lambda table=table: sum(len(b) for _, b in encode_rows(table)))
        print(
            f"{name:8s} {rows} rows {mb:.1f} MB: decode_segment {mb / decode_s:7.1f} MB/s "
            f"({decode_s * 1e3:6.1f} ms), encode_rows {encode_s * 1e3:6.1f} ms"
        )

    entries = [
        (glog.OffsetKey(f"group-{i % 50}", "topic", i % 64), glog.CommittedOffset(i, 3, "", 1))
        for i in range(20_000)
    ]
    records = glog.encode_records(entries)

    def build() -> list[bytes]:
        return [bytes(glog.build_batch(records[i : i + 500])) for i in range(0, len(records), 500)]

    batches = build()
    log = b"".join(batches)

    def read() -> int:
        n = 0
        for pos, header in iter_batches(log):
            for rec in iter_records(memoryview(log)[pos : pos + header.size]):
                glog.decode(rec.key, rec.value)
                n += 1
        return n

    assert read() == len(entries)
    print(
        f"group log: build {len(entries)} records {best(build) * 1e3:6.1f} ms, "
        f"read back {best(read) * 1e3:6.1f} ms"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
