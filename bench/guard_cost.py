"""What the request bounds guard (stonemq/protocol/guard.py) costs per request.

``python -m bench.guard_cost`` times, for Produce requests of one partition (and of many), the
guard's pre-pass alone, kio's decode alone and ``decode_request`` (both), best of several runs,
in microseconds per request. Not part of the benchmark suite's run; a check for the hot path.
"""

from __future__ import annotations

import io
import timeit
from typing import Any

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i32Timedelta

from stonemq.protocol import guard
from stonemq.protocol.codec import decode_request, parse_header_prefix

RECORDS = b"\x00" * 1024  # the guard never looks inside the records bytes


def produce_frame(version: int, partitions: int) -> bytes:
    cls = load_request_schema(0, version)
    mod = __import__(cls.__module__, fromlist=["x"])
    topic = mod.TopicProduceData(
        name="bench-topic",
        partition_data=tuple(
            mod.PartitionProduceData(index=i32(p), records=RECORDS) for p in range(partitions)
        ),
    )
    request = cls(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(__import__("datetime").timedelta(seconds=30)),
        topic_data=(topic,),
    )
    out = io.BytesIO()
    header = b"\x00\x00" + version.to_bytes(2, "big") + b"\x00\x00\x00\x01\xff\xff"
    out.write(header + (b"\x00" if cls.__flexible__ else b""))
    entity_writer(cls)(out, request)
    return out.getvalue()


def per_call_us(fn: Any, *args: Any, number: int) -> float:
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=7)) / number * 1e6


def main() -> None:
    for version, partitions in ((9, 1), (7, 1), (11, 1), (9, 100)):
        frame = produce_frame(version, partitions)
        header, pos = parse_header_prefix(frame)
        cls = load_request_schema(0, version)
        walker = guard.compile_walker(cls)
        reader = entity_reader(cls)
        body = pos + (1 if cls.__flexible__ else 0)
        number = 200_000 // partitions
        g = per_call_us(guard.check, walker, frame, body, number=number)
        k = per_call_us(reader, frame, body, number=number)
        d = per_call_us(decode_request, header, frame, pos, number=number)
        print(
            f"Produce v{version}, {partitions} partition(s), {len(frame)} B: guard {g:.2f} us, "
            f"kio decode {k:.2f} us, decode_request {d:.2f} us"
        )


if __name__ == "__main__":
    main()
